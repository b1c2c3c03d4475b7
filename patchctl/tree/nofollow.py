"""Opening files of a tree that another user may write, following nothing that user planted.

`ensure` runs as root on a venv a service user owns. Whatever that user can write (the tree, the
bookkeeping folder `<tree>/.patchctl/`) may hold a symlink, a FIFO or a device where patchctl expects
a file or a folder. Everything here works relative to a directory descriptor: a folder is opened with
O_DIRECTORY | O_NOFOLLOW (a link in its place is refused, not followed), a file is opened with
O_NOFOLLOW | O_NONBLOCK and read only when fstat says it is a regular file, and no more bytes than a
stated limit are read. Removal never descends through a link. This is what git's safe.directory and
systemd-tmpfiles' safe path resolution do for the same reason (CVE-2022-24765: not trusting what
another user controls)."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from patchctl.errors import Planted

_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
RECORD_LIMIT = 64 << 20  # state.json, journal.json: a few KiB in practice
FILE_LIMIT = 256 << 20  # a backup or a patched file: the largest .py of an engine is under 1 MiB


def open_dir(parent_fd: int, name: str, shown: Path | str, *, create: bool = False,
             owners: frozenset[int] | None = None) -> int | None:
    """The folder `name` in `parent_fd` as a descriptor; None when it is missing (create: made, 0o755).
    owners: the uids it may belong to. A link, a file or another user's folder in its place: Planted."""
    for _ in range(3):
        try:
            fd = os.open(name, _DIR, dir_fd=parent_fd)
            break
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(name, 0o755, dir_fd=parent_fd)
            except FileExistsError:
                pass
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Planted(f"{shown} is not a directory (a symlink or a file): patchctl follows no link in its "
                              f"bookkeeping and writes nothing through it",
                              hint="remove it: patchctl did not make it (someone who can write the tree did)") from None
            raise
    else:
        raise FileNotFoundError(errno.ENOENT, "removed while being created", str(shown))
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):  # O_DIRECTORY makes this impossible; kept for platforms without it
            raise Planted(f"{shown} is not a directory")
        if owners is not None and st.st_uid not in owners:
            raise Planted(f"{shown} belongs to uid {st.st_uid}, neither the tree's owner nor root: patchctl does "
                          f"not trust bookkeeping another user made",
                          hint="remove it (or chown it to the tree's owner), then run the command again")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at(dir_fd: int, name: str, shown: Path | str, limit: int = FILE_LIMIT) -> bytes | None:
    """The bytes of the regular file `name` in `dir_fd`, None when it is missing. A link, a FIFO, a
    device or a folder in its place, or a file over `limit` bytes: Planted (no hang, no memory blow-up)."""
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Planted(f"{shown} is a symlink: patchctl reads its bookkeeping through no link",
                          hint="remove it: patchctl did not make it") from None
        raise
    try:
        return _read_fd(fd, shown, limit)
    finally:
        os.close(fd)


def read_path(path: Path, limit: int = FILE_LIMIT) -> bytes | None:
    """A file of the tree (its path already checked to stay inside it; links inside the tree are
    followed): None when missing or not a file; a FIFO, a device or a file over `limit`: Planted."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            return None
        return _read_fd(fd, path, limit)
    finally:
        os.close(fd)


def _read_fd(fd: int, shown: Path | str, limit: int) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Planted(f"{shown} is not a regular file (a FIFO, a device, a socket or a folder): patchctl reads none",
                      hint="remove it: patchctl did not make it")
    if st.st_size > limit:
        raise Planted(f"{shown} is {st.st_size} bytes, more than patchctl reads there ({limit})")
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:  # it grew while being read
            raise Planted(f"{shown} grew past {limit} bytes while being read")


def exists_at(dir_fd: int, name: str) -> bool:
    """Anything (a link included, not followed) named `name` in `dir_fd`."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def unlink_at(dir_fd: int, name: str) -> None:
    """Remove `name` (a link is removed, never what it points to); a folder in its place is left."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def rmtree_at(dir_fd: int, name: str) -> None:
    """Remove the folder `name` in `dir_fd` and everything in it, descending through no link (a link
    is unlinked, the folder it points to is left alone). Errors are ignored: what is left stays."""
    try:
        fd = os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            unlink_at(dir_fd, name)
        return
    try:
        for entry in os.listdir(fd):
            try:
                is_dir = stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode)
                if is_dir:
                    rmtree_at(fd, entry)
                else:
                    os.unlink(entry, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass


__all__ = ["FILE_LIMIT", "RECORD_LIMIT", "Planted", "exists_at", "open_dir", "read_at", "read_path", "rmtree_at",
           "unlink_at"]
