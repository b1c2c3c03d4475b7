"""Where images are read from and pushed to, behind one interface (`Repository`): a registry speaking
the OCI distribution API (distribution.py, on patchctl's one HTTP client), or an OCI layout
directory (layout.py).

Blobs are streamed, never held whole: a pulled blob goes to the download cache by its digest
(checked while it streams), and is pushed from there. Every failure of the registry is a
RegistryError (exit 3) carrying what the registry answered."""

from __future__ import annotations

import errno
import hashlib
import os
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple, Protocol, TypeVar

from patchctl.core import config
from patchctl.core.errors import EnvironmentProblem, ImageContentError, RegistryError
from patchctl.core.yamlio import load_json
from patchctl.image.reference import ImageRef, is_loopback

if TYPE_CHECKING:
    from patchctl.sources.deadline import Deadline
    from patchctl.sources.files import ProgressSink

T = TypeVar("T")
CHUNK = 1 << 20
# A manifest, an index or a config is JSON of a few KB; the distribution spec lets registries refuse
# manifests past 4 MB.
MAX_MANIFEST = 4 << 20
MAX_CONFIG = 16 << 20
# The largest blob patchctl pulls (a vLLM image's engine layer is several GB).
MAX_BLOB = 64 << 30


class Manifest(NamedTuple):
    data: bytes  # exactly as served: its sha256 is its digest
    media_type: str
    digest: str


class Repository(Protocol):
    """One image repository: a registry's REGISTRY/REPO, or an OCI layout directory."""

    @property
    def name(self) -> str: ...

    def manifest(self, reference: str) -> Manifest:
        """The manifest or index a tag or digest names; RegistryError when there is none."""

    def blob(self, digest: str, size: int | None) -> Path:
        """The blob as a local file (the cache's, or the layout's own), for pushing it."""

    def open_blob(self, digest: str, size: int | None) -> AbstractContextManager[IO[bytes]]:
        """The blob's bytes to stream (the cache's copy, or the layout's own), opened following no
        link and only when a regular file; the reader hashes them against the digest (stream.py)."""

    def forget(self, digest: str) -> bool:
        """Drop a copy found damaged so that the next open fetches it again; False when there is no
        other copy (a layout's own blob)."""

    def small_blob(self, digest: str, limit: int = MAX_CONFIG) -> bytes:
        """A config or another small blob, read into memory (bounded)."""

    def has_blob(self, digest: str) -> bool: ...

    def put_blob(self, path: Path, digest: str, size: int, source: Repository | None = None) -> None:
        """Store the blob (mounted from `source` when both are the same registry)."""

    def put_bytes(self, data: bytes, digest: str) -> None:
        """Store a small blob (a config) held in memory."""

    def put_manifest(self, tag: str, manifest: Manifest) -> None:
        """Store the manifest under the tag (or under its digest: a platform's manifest in an index)."""


def check_digest(digest: str) -> str:
    """The hex of a sha256 digest; anything else is the registry's mistake (exit 3)."""
    algorithm, _, hexpart = digest.partition(":")
    if algorithm != "sha256" or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise RegistryError(f"the image names a blob {digest[:80]!r}: patchctl reads sha256 digests only")
    return hexpart


def cached_blob(digest: str) -> Path:
    """Where the download cache keeps a blob by its digest (checked before it is put there)."""
    from patchctl.sources.cache import ArtifactCache

    cache = ArtifactCache(config.cache_dir())
    folder = cache.verified(check_digest(digest))
    cache.make_dirs(folder)
    return folder / "blob"


@contextmanager
def streamed_into(final: Path, digest: str, size: int | None) -> Iterator[Callable[[bytes], None]]:
    """A writer into a temporary file beside `final` that becomes `final` only when what was written
    has the digest (and the size) the manifest names; otherwise it is removed and RegistryError raised."""
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    hasher = hashlib.sha256()
    written = 0
    try:
        try:
            raw = open(tmp, "wb", buffering=0)  # unbuffered: a failed write fails here, not again at close
        except OSError as exc:
            raise _cannot_write(tmp, exc) from None
        with raw:

            def write(chunk: bytes) -> None:
                nonlocal written
                written += len(chunk)
                if (size is not None and written > size) or written > MAX_BLOB:
                    raise RegistryError(f"blob {digest[:19]}… is longer than the {size or MAX_BLOB} bytes the manifest says")
                hasher.update(chunk)
                view = memoryview(chunk)
                while view:
                    try:
                        done = raw.write(view)
                        if not done:
                            raise OSError(errno.EIO, "the file system took no bytes")
                    except OSError as exc:
                        raise _cannot_write(tmp, exc) from None
                    view = view[done:]

            yield write
        got = "sha256:" + hasher.hexdigest()
        if got != digest or (size is not None and written != size):
            raise RegistryError(
                f"blob {digest[:19]}… arrived as {got[:19]}… ({written} bytes, the manifest says {size}): refusing it"
            )
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _cannot_write(path: Path, exc: OSError) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"cannot write {path}: {exc.strerror or exc}", hint="free space there, or write the image somewhere with room"
    )


class RegistryRepository:
    """A repository on a registry, through the OCI distribution API (distribution.py)."""

    def __init__(self, ref: ImageRef, *, insecure: bool, progress: ProgressSink | None):
        from patchctl.image.auth import auth_files, credentials_for, helper_for
        from patchctl.image.distribution import Registry

        self.ref = ref
        self.host = ref.api_host
        plain = is_loopback(self.host) or insecure
        self.plain = plain
        self._progress = progress
        creds = credentials_for(ref.registry or self.host)
        helper = helper_for(ref.registry or self.host)
        if creds is not None:
            why = f"refused the login of {creds.username} from {creds.source}"
        else:
            why = "asks for a login, and no credentials for it are stored"
        hint = (
            (f"credential helpers are not run by patchctl: {helper}; " if helper else "")
            + f"log in with `docker login {ref.registry}` (or set REGISTRY_AUTH_FILE); read from: "
            + ", ".join(str(f) for f in auth_files())
        )
        self._api = Registry(self.host, ref.repository, self.name, plain=plain, creds=creds, unauthorized=(why, hint))

    @property
    def name(self) -> str:
        return f"{self.ref.registry}/{self.ref.repository}"

    def _call(self, what: str, fn: Callable[[Deadline], T], size: int | None = None) -> T:
        """fn's requests, under one deadline: --timeout, plus size bytes at http.MIN_RATE."""
        from patchctl.sources import http
        from patchctl.sources.deadline import Deadline

        seconds = config_timeout() + (size or 0) / http.MIN_RATE
        deadline = Deadline(f"{self.name}: {what}", what, seconds)
        try:
            return fn(deadline)
        except RegistryError:
            if deadline.expired or deadline.remaining() <= 0:
                raise RegistryError(
                    f"{self.name}: {what}: no complete answer within {seconds:.0f} s (the deadline of a request: "
                    f"--timeout, plus the size at {http.MIN_RATE >> 10} KiB/s)",
                    hint="a slow or stalled registry; pass a larger --timeout SECONDS on a slow link",
                ) from None
            raise

    def manifest(self, reference: str) -> Manifest:
        from patchctl.image.distribution import MANIFEST_TYPES

        what = f"manifest {reference}"

        def get(deadline: Deadline) -> tuple[bytes, str]:
            answer = self._api.request(what, "GET", f"manifests/{reference}", deadline, headers={"Accept": MANIFEST_TYPES})
            return self._api.read(what, answer, MAX_MANIFEST), answer.headers.get("Content-Type") or ""

        data, content_type = self._call(what, get)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if reference.startswith("sha256:") and reference != digest:
            raise RegistryError(f"{self.name}: manifest {reference[:19]}… arrived with digest {digest[:19]}…")
        return Manifest(data, content_type.split(";")[0].strip(), digest)

    def _pull(self, digest: str, limit: int, take: Callable[[bytes], None]) -> Callable[[Deadline], None]:
        """The request that streams the blob into take(), at most `limit` bytes."""
        what = f"blob {digest[:19]}…"

        def pull(deadline: Deadline) -> None:
            answer = self._api.request(what, "GET", f"blobs/{digest}", deadline)
            try:
                for chunk in self._api.chunks(what, answer, limit, CHUNK):
                    take(chunk)
            finally:
                answer.close()

        return pull

    def blob(self, digest: str, size: int | None) -> Path:
        from patchctl.core.errors import CacheFileDamaged
        from patchctl.sources.cache import ArtifactCache

        final = cached_blob(digest)
        cache = ArtifactCache(config.cache_dir())
        try:
            present = cache.exists(final) and (size is None or os.stat(final, follow_symlinks=False).st_size == size)
        except CacheFileDamaged:
            cache.remove(final)  # a link or a FIFO planted there: removed, fetched again
            present = False
        if present:
            return final

        def pull(deadline: Deadline) -> None:
            if self._progress is not None:
                self._progress.start(f"blob {digest[7:19]}", size)
            try:
                with streamed_into(final, digest, size) as write:

                    def take(chunk: bytes) -> None:
                        write(chunk)
                        if self._progress is not None:
                            self._progress.advance(len(chunk))

                    self._pull(digest, size if size is not None else MAX_BLOB, take)(deadline)
            finally:
                if self._progress is not None:
                    self._progress.finish()

        self._call(f"blob {digest[:19]}…", pull, size)
        return final

    @contextmanager
    def open_blob(self, digest: str, size: int | None) -> Iterator[IO[bytes]]:
        from patchctl.core.errors import CacheFileDamaged
        from patchctl.sources.cache import ArtifactCache

        final = self.blob(digest, size)
        try:
            with ArtifactCache(config.cache_dir()).open_file(final, MAX_BLOB) as f:
                if f is None:
                    raise RegistryError(f"{self.name}: blob {digest} left the download cache ({final}) while being read")
                yield f
        except CacheFileDamaged as exc:  # a link or a FIFO swapped in since blob() looked
            raise RegistryError(f"{self.name}: blob {digest}: {exc}") from None

    def forget(self, digest: str) -> bool:
        from patchctl.sources.cache import ArtifactCache

        ArtifactCache(config.cache_dir()).remove(cached_blob(digest))
        return True

    def small_blob(self, digest: str, limit: int = MAX_CONFIG) -> bytes:
        data = bytearray()

        def take(chunk: bytes) -> None:
            data.extend(chunk)
            if len(data) > limit:
                raise RegistryError(f"{self.name}: blob {digest[:19]}… is over {limit} bytes")

        self._call(f"blob {digest[:19]}…", self._pull(digest, limit + 1, take), limit)
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise RegistryError(f"{self.name}: blob {digest[:19]}… does not have that digest")
        return bytes(data)

    def has_blob(self, digest: str) -> bool:
        what = f"blob {digest[:19]}…"

        def head(deadline: Deadline) -> bool:
            answer = self._api.request(what, "HEAD", f"blobs/{digest}", deadline, ok=(200, 404))
            answer.content  # noqa: B018  (none: the connection goes back to the pool)
            return answer.status_code == 200

        return self._call(what, head)

    def put_blob(self, path: Path, digest: str, size: int, source: Repository | None = None) -> None:
        if self.has_blob(digest):
            return
        if isinstance(source, RegistryRepository) and source.host == self.host:
            query = urllib.parse.urlencode({"mount": digest, "from": source.ref.repository})
            try:
                self._call(
                    "mount", lambda d: self._api.request("mount", "POST", f"blobs/uploads/?{query}", d, ok=(201, 202)).close()
                )
                if self.has_blob(digest):
                    return
            except RegistryError:
                pass  # a registry without cross-repository mounts: uploaded below
        with open(path, "rb") as f:
            self._upload(f, digest, size)

    def put_bytes(self, data: bytes, digest: str) -> None:
        if self.has_blob(digest):
            return
        self._upload(data, digest, len(data))

    def _upload(self, body: bytes | IO[bytes], digest: str, size: int) -> None:
        """A monolithic upload: POST opens it, one PUT carries the bytes and closes it with the digest."""
        what = f"push {digest[:19]}…"

        def push(deadline: Deadline) -> None:
            opened = self._api.request(what, "POST", "blobs/uploads/", deadline, ok=(202,))
            location = opened.headers.get("Location") or ""
            opened.close()
            if not location:
                raise RegistryError(f"{self.name}: {what}: the registry opened an upload with no Location")
            url = urllib.parse.urljoin(self._api.base, location)
            url += ("&" if urllib.parse.urlsplit(url).query else "?") + urllib.parse.urlencode({"digest": digest})
            done = self._api.request(
                what,
                "PUT",
                url,
                deadline,
                body=body,
                ok=(201, 204),
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            )
            stored = done.headers.get("Docker-Content-Digest")
            done.close()
            if stored and stored != digest:
                raise ImageContentError(f"{self.name}: the registry stored {digest} as {stored}")

        self._call(what, push, size)

    def put_manifest(self, tag: str, manifest: Manifest) -> None:
        # Byte for byte, under the type it was served with (an OCI manifest may omit its mediaType).
        media_type = manifest.media_type or str(load_json(manifest.data).get("mediaType") or "")
        what = f"push manifest {tag}"
        self._call(
            what,
            lambda d: self._api.request(
                what, "PUT", f"manifests/{tag}", d, body=manifest.data, headers={"Content-Type": media_type}, ok=(201, 202, 204)
            ).close(),
        )


def config_timeout() -> float:
    """--timeout, as the rest of patchctl's network reads take it."""
    from patchctl.sources import http

    return http.TIMEOUT
