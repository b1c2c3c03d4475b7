"""An OCI image layout directory (`oci:DIR[:TAG]`, what `skopeo copy … oci:DIR:TAG`, umoci and
buildah write): `oci-layout`, `index.json` (tags are the `org.opencontainers.image.ref.name`
annotation of its entries) and `blobs/sha256/<hex>`. The same interface as a registry's repository."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from patchctl.core.atomic import write_atomic
from patchctl.core.errors import RegistryError
from patchctl.core.nofollow import open_regular
from patchctl.core.yamlio import load_json
from patchctl.image.registry import MAX_CONFIG, MAX_MANIFEST, Manifest, Repository, check_digest, streamed_into

REF_NAME = "org.opencontainers.image.ref.name"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


class LayoutRepository:
    def __init__(self, root: Path, *, create: bool = False):
        self.root = Path(root)
        if not (self.root / "oci-layout").is_file():
            if not create:
                raise RegistryError(
                    f"{self.root} is not an OCI image layout (no oci-layout file)",
                    hint="skopeo copy docker://IMAGE oci:DIR:TAG writes one",
                )
            (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
            write_atomic(self.root / "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
            write_atomic(
                self.root / "index.json", json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": []}).encode()
            )

    @property
    def name(self) -> str:
        return f"oci:{self.root}"

    def _path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / check_digest(digest)

    def _rel(self, digest: str) -> str:
        return f"blobs/sha256/{check_digest(digest)}"

    @contextmanager
    def _open(self, rel: str) -> Iterator[IO[bytes]]:
        """A file of the layout, reached following no link (the layout may come from anyone: a link in
        it could name any file, a FIFO would hang the read); missing: RegistryError naming it."""
        fd = open_regular(self.root, rel)
        if fd is None:
            raise RegistryError(f"{self.root / rel} is missing from the layout")
        with os.fdopen(fd, "rb") as f:
            yield f

    def _index(self) -> dict:
        raw = self._read("index.json", MAX_MANIFEST)
        try:
            doc = load_json(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RegistryError(f"{self.root}/index.json is not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            raise RegistryError(f"{self.root}/index.json has no manifests list")
        return doc

    def _read(self, rel: str, limit: int) -> bytes:
        with self._open(rel) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise RegistryError(f"{self.root / rel} is larger than {limit} bytes, the most patchctl reads of it")
        return data

    def manifest(self, reference: str) -> Manifest:
        if reference.startswith("sha256:"):
            descriptor: dict | None = {"digest": reference}
        else:
            entries = [
                m
                for m in self._index()["manifests"]
                if isinstance(m, dict) and (m.get("annotations") or {}).get(REF_NAME) == reference
            ]
            if not entries and reference == "latest":
                entries = [m for m in self._index()["manifests"] if isinstance(m, dict)][:1]
            descriptor = entries[-1] if entries else None
        if descriptor is None:
            raise RegistryError(f"{self.name}: no image tagged {reference!r}")
        digest = str(descriptor.get("digest"))
        data = self._checked(digest, MAX_MANIFEST)
        media_type = str(descriptor.get("mediaType") or "")
        if not media_type:
            try:
                media_type = str(load_json(data).get("mediaType") or "")
            except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
                media_type = ""
        return Manifest(data, media_type, digest)

    def _checked(self, digest: str, limit: int) -> bytes:
        """A manifest or config: read within its limit, its sha256 checked against its digest."""
        data = self._read(self._rel(digest), limit)
        got = "sha256:" + hashlib.sha256(data).hexdigest()
        if got != digest:
            raise RegistryError(
                f"{self.name}: blob {digest} ({self._path(digest)}) does not have its digest: its "
                f"{len(data)} bytes hash to {got}: refusing it",
                hint="the copy is damaged or was changed after its digest was taken",
            )
        return data

    def blob(self, digest: str, size: int | None) -> Path:
        """The blob's path, for a registry to push it from (the registry checks its digest); readers
        stream it through open_blob, which follows no link, and hash what they read."""
        path = self._path(digest)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise RegistryError(f"{self.name}: blob {digest} is missing ({path})") from None
        if not stat.S_ISREG(st.st_mode):
            raise RegistryError(
                f"{self.name}: blob {digest} ({path}) is not a regular file: patchctl follows no "
                f"link in a layout and reads no FIFO or device"
            )
        if size is not None and st.st_size != size:
            raise RegistryError(f"{self.name}: blob {digest} ({path}) is {st.st_size} bytes, the manifest says {size}")
        return path

    @contextmanager
    def open_blob(self, digest: str, size: int | None) -> Iterator[IO[bytes]]:
        with self._open(self._rel(digest)) as f:
            yield f

    def forget(self, digest: str) -> bool:
        return False  # the layout's own blob: there is no other copy to fetch

    def small_blob(self, digest: str, limit: int = MAX_CONFIG) -> bytes:
        return self._checked(digest, limit)

    def has_blob(self, digest: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self._path(digest)).st_mode)
        except FileNotFoundError:
            return False

    def put_blob(self, path: Path, digest: str, size: int, source: Repository | None = None) -> None:
        if self.has_blob(digest):
            return
        final = self._path(digest)
        # From the source repository's own copy when there is one (read following no link); the
        # digest is checked as it is written either way.
        with (
            source.open_blob(digest, size) if source is not None else open(path, "rb") as f,
            streamed_into(final, digest, size) as write,
        ):
            for chunk in iter(lambda: f.read(1 << 20), b""):
                write(chunk)

    def put_bytes(self, data: bytes, digest: str) -> None:
        if not self.has_blob(digest):
            write_atomic(self._path(digest), data)

    def put_manifest(self, tag: str, manifest: Manifest) -> None:
        self.put_bytes(manifest.data, manifest.digest)
        index = self._index()
        kept = [m for m in index["manifests"] if not (isinstance(m, dict) and (m.get("annotations") or {}).get(REF_NAME) == tag)]
        kept.append(
            {
                "mediaType": manifest.media_type,
                "digest": manifest.digest,
                "size": len(manifest.data),
                "annotations": {REF_NAME: tag},
            }
        )
        index["manifests"] = kept
        write_atomic(self.root / "index.json", json.dumps(index, indent=1).encode())
