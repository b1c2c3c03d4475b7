"""The one layer patchctl adds to an image: a gzip-compressed tar of the files apply wrote (patched
and created files, the `.patchctl/` record), a `.wh.NAME` whiteout for each file it removed, and
the folders above them with the metadata the image gave them. Written to a file while both digests
are computed (the blob's digest, and the uncompressed tar's diff_id for the config)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, NamedTuple

from patchctl.image.layers import WHITEOUT, Meta

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

_ROOT_DIR = Meta(0o755, 0, 0, "root", "root", 0.0)
_NEW_FILE = Meta(0o644, 0, 0, "root", "root", 0.0)


class Entry(NamedTuple):
    path: str  # image path
    source: Path | None  # the file's new content; None: a whiteout (the file is removed)
    meta: Meta


class WrittenLayer(NamedTuple):
    path: Path
    digest: str  # sha256 of the compressed blob
    diff_id: str  # sha256 of the tar
    size: int


class _Hashing(io.RawIOBase):
    """Passes writes through to `out` and hashes them."""

    def __init__(self, out: IO[bytes] | gzip.GzipFile | _Hashing):
        self._out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.size += len(view)
        self._out.write(view)
        return len(view)


def write_layer(entries: list[Entry], dirs: dict[str, Meta], dest: Path) -> WrittenLayer:
    """entries in any order; folders above each (from `dirs`, the image's own, else 0755 root)
    come first, entries sorted, gzip without a timestamp."""
    folders: set[str] = set()
    for e in entries:
        for folder_path in PurePosixPath(e.path).parents:
            if str(folder_path) != ".":
                folders.add(str(folder_path))
    now = float(int(time.time()))
    with open(dest, "wb") as raw:
        blob = _Hashing(raw)
        with gzip.GzipFile(fileobj=blob, mode="wb", mtime=0, compresslevel=6) as gz:
            tar_stream = _Hashing(gz)
            with tarfile.open(fileobj=tar_stream, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for folder in sorted(folders):
                    info = tarfile.TarInfo(folder)
                    info.type = tarfile.DIRTYPE
                    _set(info, dirs.get(folder, _ROOT_DIR._replace(mtime=now)))
                    tar.addfile(info)
                for e in sorted(entries, key=lambda e: e.path):
                    parent, _, base = e.path.rpartition("/")
                    if e.source is None:
                        info = tarfile.TarInfo(f"{parent}/{WHITEOUT}{base}" if parent else f"{WHITEOUT}{base}")
                        _set(info, _NEW_FILE)
                        tar.addfile(info, io.BytesIO(b""))
                        continue
                    info = tarfile.TarInfo(e.path)
                    _set(info, e.meta)
                    info.size = e.source.stat().st_size
                    info.mtime = int(e.source.stat().st_mtime)
                    with open(e.source, "rb") as f:
                        tar.addfile(info, f)
    return WrittenLayer(dest, "sha256:" + blob.hash.hexdigest(), "sha256:" + tar_stream.hash.hexdigest(), blob.size)


def _set(info: tarfile.TarInfo, meta: Meta) -> None:
    info.mode = meta.mode & 0o7777
    info.uid, info.gid, info.uname, info.gname = meta.uid, meta.gid, meta.uname, meta.gname
    info.mtime = int(meta.mtime)


def new_file_meta() -> Meta:
    return _NEW_FILE
