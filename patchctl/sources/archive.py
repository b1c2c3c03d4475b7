"""The one extractor of archives (wheels and other zips, sdists and `git archive` tars): regular
members only, each written below the destination through `resolve_inside` (no `..`, no absolute
name, no symlinked folder that leads out: zip-slip and symlink safe), streamed in 1 MB pieces with its
permission bits kept (vLLM ships some sources executable; git diffs record modes)."""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, NamedTuple

from patchctl.core.errors import NetworkError
from patchctl.sources import zipread
from patchctl.sources.files import resolve_inside

# What a damaged or hostile archive raises while it is read.
ARCHIVE_ERRORS = (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, NotImplementedError, zipread.ZipFormatError)


class Member(NamedTuple):
    name: str  # as the archive names it
    mode: int  # permission bits (0: none recorded)
    open: Callable[[], IO[bytes]]
    size: int  # as the archive states it (zipfile and tarfile stop reading there)
    compressed: int | None = None  # a zip member's deflated size; None for a tar member


def is_zip(f: BinaryIO) -> bool:
    f.seek(0)
    magic = f.read(2)
    f.seek(0)
    return magic == b"PK"


def members(f: BinaryIO) -> Iterator[Member]:
    """The regular-file members of a zip or a tar (gzipped or not) read from `f`."""
    if is_zip(f):
        with zipfile.ZipFile(f) as zf:
            for info in zf.infolist():
                mode = info.external_attr >> 16
                if info.is_dir() or stat.S_ISLNK(mode):
                    continue
                yield Member(info.filename, mode & 0o777, functools.partial(zf.open, info), info.file_size, info.compress_size)
        return
    with tarfile.open(fileobj=f) as tf:
        for member in tf:
            if member.isfile():
                yield Member(member.name, member.mode & 0o777, functools.partial(_tar_member, tf, member), member.size)


def _tar_member(tf: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    src = tf.extractfile(member)
    assert src is not None  # a regular file
    return src


def read(f: BinaryIO, path_of: Callable[[str], str | None], wanted: set[str]) -> dict[str, bytes]:
    """The bytes of the members whose path (path_of their name) is in `wanted` (the first of each)."""
    found: dict[str, bytes] = {}
    for member in members(f):
        path = path_of(member.name)
        if path in wanted and path not in found:
            # Read into memory: held to zipread's member limits (size, inflate ratio) before a byte is
            # read, and to the stated size while reading, as a range-read member is.
            zipread.check_member_size(member.name, member.size if member.compressed is None else member.compressed, member.size)
            try:
                with member.open() as src:
                    found[path] = src.read(member.size + 1)
            except zipfile.BadZipFile as exc:  # zipfile stops at the stated size and checks the CRC there
                raise zipread.ZipFormatError(f"{member.name} is not the member its central directory states: {exc}") from None
            if len(found[path]) > member.size:
                raise zipread.ZipFormatError(f"{member.name} holds more than the {member.size} bytes it states")
    return found


def extract(f: BinaryIO, dest: Path, path_of: Callable[[str], str | None]) -> list[tuple[str, str, str]]:
    """Stream every member that path_of maps to a path (relative to dest) into dest. Returns
    (path, member name, sha256) for each file written."""
    written = []
    for member in members(f):
        rel = path_of(member.name)
        if not rel:
            continue
        if member.compressed is not None:  # a zip bomb is refused before it fills the disk (size: any)
            zipread.check_ratio(member.name, member.compressed, member.size)
        with member.open() as src:
            digest = _stream_to(src, resolve_inside(dest, rel), member.mode)
        written.append((rel, member.name, digest))
    return written


@contextmanager
def errors_named(filename: str) -> Iterator[None]:
    """A malformed archive is the artifact's fault (truncated, tampered): said with its name."""
    try:
        yield
    except ARCHIVE_ERRORS as exc:
        raise NetworkError(f"{filename}: {exc}") from None


def _stream_to(src: IO[bytes], path: Path, mode: int) -> str:
    """Copy a member to path in 1 MB pieces, returning its sha256; the mode's permission bits kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    # O_NOFOLLOW: a symlink another member left at this very name is not written through.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            out.write(chunk)
            digest.update(chunk)
        if mode:
            os.fchmod(out.fileno(), mode)
    return digest.hexdigest()
