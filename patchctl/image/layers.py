"""Reading an image's layers: each layer (a tar, gzip-compressed or not) is streamed once, bottom to
top, as a container runtime stacks them (a later file replaces an earlier one, `.wh.NAME` deletes
NAME, `.wh..wh..opq` empties a folder of what lower layers put there), and only the files the
command needs are written out, into a staging folder that mirrors the image's paths: the engine's
dist-info METADATA, the `.patchctl/` record beside the engine's packages, and the files a filter
asks for. Nothing holds a layer in memory; the engine's import root is where its package and its
dist-info lie side by side."""
from __future__ import annotations

import email
import hashlib
import io
import os
import re
import shutil
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, NamedTuple

from packaging.version import InvalidVersion, Version

from patchctl.errors import ImageContentError, RegistryError
from patchctl.image.manifest import Layer
from patchctl.image.registry import Repository

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    from patchctl.engines import Engine
    from patchctl.sources.files import ProgressSink

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_DIST_INFO = re.compile(r"(?P<root>(?:.*/)?)(?P<name>[^/]+)-(?P<version>[^/-]+)\.dist-info/METADATA")
# A file patchctl reads out of a layer is source or its own record: past this it is not one.
MAX_FILE = 64 << 20


class Meta(NamedTuple):
    """What a tar entry said about a file or folder (kept so the new layer writes it back alike)."""

    mode: int
    uid: int
    gid: int
    uname: str
    gname: str
    mtime: float


class Staged(NamedTuple):
    """The image's files that were read, as the top of the stack shows them."""

    folder: Path  # the staging folder: <folder>/<image path>
    files: dict[str, Meta]  # image path → its entry's metadata (the files written under folder)
    dirs: dict[str, Meta]  # every folder entry seen, for the new layer's parent folders
    layers_read: int


class Found(NamedTuple):
    """The engine's tree in an image."""

    root: str  # its import root inside the image: usr/lib/python3.11/site-packages/
    local: Path  # the same folder under the staging folder
    version: Version


def clean_name(name: str) -> str | None:
    """A tar member's path as an image path without a leading ./ or /; None when it leaves the
    root (`..`): such entries are never written out."""
    path = name.lstrip("/")
    while path.startswith("./"):
        path = path[2:]
    path = path.rstrip("/")
    parts = PurePosixPath(path).parts if path else ()
    if ".." in parts or "\0" in path:
        return None
    return "/".join(parts)


class _Counting(io.RawIOBase):
    """A read-only file that reports how much of it was read (the progress of one layer)."""

    def __init__(self, raw: IO[bytes], progress: ProgressSink | None):
        self._raw = raw
        self._progress = progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view))
        view[:len(data)] = data
        if self._progress is not None and data:
            self._progress.advance(len(data))
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def open_layer(path: Path, layer: Layer, progress: ProgressSink | None) -> tarfile.TarFile:
    """The layer's tar, streamed (mode r|: forward only, nothing buffered whole)."""
    raw = open(path, "rb")
    magic = raw.read(4)
    raw.seek(0)
    if magic == b"\x28\xb5\x2f\xfd":
        raw.close()
        raise RegistryError(f"layer {layer.digest[:19]}… is zstd-compressed ({layer.media_type}): patchctl reads "
                            f"tar and tar+gzip layers only")
    stream = io.BufferedReader(_Counting(raw, progress), 1 << 20)
    try:
        if magic[:2] == b"\x1f\x8b":
            return tarfile.open(fileobj=stream, mode="r|gz")
        return tarfile.open(fileobj=stream, mode="r|")
    except tarfile.TarError as exc:
        raw.close()
        raise RegistryError(f"layer {layer.digest[:19]}… is not a tar: {exc}") from None


Wanted = Callable[[str], bool]


def read_layers(repo: Repository, layers: Iterable[Layer], wanted: Wanted, folder: Path,
                progress: ProgressSink | None = None) -> Staged:
    """Stream every layer, in order, and write the files `wanted(image_path)` accepts under folder."""
    files: dict[str, Meta] = {}
    dirs: dict[str, Meta] = {}
    count = 0
    layers = list(layers)
    for number, layer in enumerate(layers, 1):
        path = repo.blob(layer.digest, layer.size)
        if progress is not None:
            progress.start(f"layer {number}/{len(layers)}", layer.size)
        try:
            _read_one(path, layer, wanted, folder, files, dirs, progress)
        finally:
            if progress is not None:
                progress.finish()
        count += 1
    return Staged(folder, files, dirs, count)


def _remove(folder: Path, files: dict[str, Meta], target: str, keep: set[str]) -> None:
    """A whiteout: the file or the folder's whole subtree, as lower layers left it, is gone."""
    prefix = target + "/"
    for name in [n for n in files if (n == target or n.startswith(prefix) or not target) and n not in keep]:
        del files[name]
        (folder / name).unlink(missing_ok=True)


def _read_one(path: Path, layer: Layer, wanted: Wanted, folder: Path, files: dict[str, Meta],
              dirs: dict[str, Meta], progress: ProgressSink | None) -> None:
    this_layer: set[str] = set()
    tar = open_layer(path, layer, progress)
    try:
        for member in tar:
            name = clean_name(member.name)
            if name is None:
                continue
            parent, _, base = name.rpartition("/")
            if base == OPAQUE:
                _remove(folder, files, parent, this_layer)
                continue
            if base.startswith(WHITEOUT):
                _remove(folder, files, f"{parent}/{base[len(WHITEOUT):]}" if parent else base[len(WHITEOUT):],
                        this_layer)
                continue
            meta = Meta(member.mode, member.uid, member.gid, member.uname, member.gname, member.mtime)
            if member.isdir():
                dirs[name] = meta
                continue
            if not wanted(name):
                # A file here replaces what a lower layer had at this path, even one not read out.
                if name in files:
                    _remove(folder, files, name, this_layer)
                continue
            _remove(folder, files, name, this_layer)
            if member.issym() or member.islnk() and member.linkname.lstrip("/") not in files:
                raise ImageContentError(f"{name} is a link in layer {layer.digest[:19]}… (to {member.linkname}): "
                                        f"patchctl patches regular files only")
            if member.islnk():
                source = clean_name(member.linkname)
                assert source is not None and source in files  # checked just above
                _place(folder, name, open(folder / source, "rb"))
            elif member.isfile():
                if member.size > MAX_FILE:
                    raise ImageContentError(f"{name} is {member.size} bytes in the image: more than patchctl reads "
                                            f"of one file ({MAX_FILE})")
                stream = tar.extractfile(member)
                assert stream is not None  # a regular file always has a stream
                _place(folder, name, stream)
            else:
                continue  # a device or a FIFO in the image is never read
            files[name] = meta
            this_layer.add(name)
    except tarfile.TarError as exc:
        raise RegistryError(f"layer {layer.digest[:19]}… is damaged: {exc}") from None
    finally:
        tar.close()


def _place(folder: Path, name: str, stream: IO[bytes]) -> None:
    dest = folder / name
    # An image path's folders become real folders here; a file in the way (a file an upper layer
    # turned into a folder) is replaced.
    here = folder
    for part in PurePosixPath(name).parts[:-1]:
        here = here / part
        if here.is_symlink() or (here.exists() and not here.is_dir()):
            here.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with stream, open(dest, "wb") as out:
        shutil.copyfileobj(stream, out, 1 << 20)


# --- what to read, for an engine --------------------------------------------------------------

def engine_filter(engine: Engine, relative: Callable[[str], bool]) -> Wanted:
    """The image paths under any folder holding the engine's packages whose path relative to that
    folder `relative` accepts, the engine's dist-info METADATA and the `.patchctl/` record."""
    packages = tuple(engine.packages)
    patterns = tuple(f"/{p}/" for p in packages)

    def wanted(name: str) -> bool:
        if name.endswith(".dist-info/METADATA"):
            match = _DIST_INFO.fullmatch(name)
            return match is not None and _normal(match["name"]) == engine.dist
        if "/.patchctl/" in f"/{name}":
            return True
        padded = f"/{name}"
        for pattern in patterns:
            at = padded.find(pattern)
            while at >= 0:
                if relative(padded[at + 1:]):
                    return True
                at = padded.find(pattern, at + 1)
        return False

    return wanted


def with_bytecode(paths: Iterable[str]) -> Callable[[str], bool]:
    """The paths, and the __pycache__ files of each (apply replaces or removes them with the source)."""
    exact = set(paths)
    caches: dict[str, set[str]] = {}
    for p in exact:
        folder, _, base = p.rpartition("/")
        cache = f"{folder}/__pycache__/" if folder else "__pycache__/"
        caches.setdefault(cache, set()).add(base.rsplit(".", 1)[0] + ".")

    def relative(rel: str) -> bool:
        if rel in exact:
            return True
        folder, _, base = rel.rpartition("/")
        stems = caches.get(folder + "/")
        return stems is not None and any(base.startswith(s) for s in stems)

    return relative


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_engine(staged: Staged, engine: Engine) -> Found:
    """The one import root holding the engine's dist-info; ImageContentError when none or several."""
    roots: dict[str, Version] = {}
    for name in staged.files:
        match = _DIST_INFO.fullmatch(name)
        if match is None or _normal(match["name"]) != engine.dist:
            continue
        text = (staged.folder / name).read_text(errors="replace")
        raw = email.message_from_string(text).get("Version") or match["version"]
        try:
            roots[match["root"]] = Version(raw)
        except InvalidVersion:
            raise ImageContentError(f"{name} says version {raw[:40]!r}, not a PEP 440 version") from None
    if not roots:
        raise ImageContentError(f"no {engine.dist} is installed in the image (no {engine.dist} dist-info in any layer)")
    if len(roots) > 1:
        where = ", ".join(f"/{r} ({v})" for r, v in sorted(roots.items()))
        raise ImageContentError(f"the image holds {engine.dist} in {len(roots)} places: {where}",
                                hint="patchctl patches one tree per image; remove the stale one in the image")
    root, version = next(iter(roots.items()))
    local = staged.folder / root
    for package in engine.packages:
        (local / package).mkdir(parents=True, exist_ok=True)
    return Found(root, local, version)


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder (the few read out of the image), by path relative to it:
    what apply changed is what differs afterwards."""
    out = {}
    for dirpath, _, names in os.walk(folder):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                out[p.relative_to(folder).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
