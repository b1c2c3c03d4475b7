"""The one way patchctl writes a file that must be whole: a temp file beside it, every byte written
and fsynced, renamed over the old one, the directory fsynced. A reader (or a crash) sees the old
file or the new one, never a part of either.

The rename gives the path a new inode, so a hardlinked install (uv's cache) is never written
through. `_os_write` is the seam tests monkeypatch to simulate short writes and a full disk.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from pathlib import Path

from patchctl.core.errors import WriteError

_os_write = os.write  # tests replace this to simulate short writes, ENOSPC, ...
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


# The names temp_path gives: the pid that wrote it, so a sweep removes only a dead process's.
TEMP_NAME = re.compile(r"^\..+\.patchctl-(\d+)(?:-\d+)?\.tmp$")


def temp_path(path: Path) -> Path:
    """Where write_atomic stages `path`: beside it (same filesystem), named after it and this process
    (and the thread, outside the main one: the matrix's workers may fill the same cache file at once)."""
    thread = "" if threading.current_thread() is threading.main_thread() else f"-{threading.get_ident()}"
    return path.with_name(f".{path.name}.patchctl-{os.getpid()}{thread}.tmp")


def write_atomic(
    path: str | os.PathLike, data: bytes, *, mode: int | None = None, owner: tuple[int, int] | None = None, durable: bool = True
) -> None:
    """Replace `path` with `data` all-or-nothing; the parent directory is created if missing.

    mode: the new file's permission bits, exactly (no umask). By default the old file's, as an
    in-place write would keep them; for a new file 0o644 less the umask.
    owner: (uid, gid) the new file gets, as the file it replaces had (root patching a tree a service
    user owns must leave it owned by that user); only where this process may give files away.
    durable: False skips the two fsyncs (~8 ms each on CI's disks): the rename is still atomic, but a
    power loss may lose the file or leave it empty. Only for the download cache, whose every read
    verifies what it reads (a sha256, a schema): a lost write is a cache miss, never a wrong byte.
    On any failure the temp file is removed, the old file is untouched, and an OSError naming the
    path is raised (its errno and filename kept, so callers can still tell ENOSPC from EACCES).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(path.parent, os.O_RDONLY | _O_DIRECTORY)
    except OSError as exc:
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    try:
        _write_in(dir_fd, path.name, data, mode=mode, owner=owner, durable=durable, shown=str(path), follow=True)
    finally:
        os.close(dir_fd)


def write_atomic_at(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int | None = None,
    owner: tuple[int, int] | None = None,
    shown: str | None = None,
) -> None:
    """write_atomic for a file `name` in the directory open as `dir_fd`, following no symlink: the
    temp file is created new (O_EXCL | O_NOFOLLOW), the old file's mode is read without following a
    link, and the rename happens inside that very directory, whatever its path now leads to. For
    bookkeeping in a tree another user may write (a link planted there redirects nothing).
    shown: the path errors name (default: the name)."""
    _write_in(dir_fd, name, data, mode=mode, owner=owner, durable=True, shown=shown or name, follow=False)


def _write_in(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    mode: int | None,
    owner: tuple[int, int] | None,
    durable: bool,
    shown: str,
    follow: bool,
) -> None:
    tmp = temp_path(Path(name)).name
    created = False
    try:
        if mode is None:
            try:
                old = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow)
                if stat.S_ISREG(old.st_mode):  # not a link's 0777, nor a FIFO's
                    mode = old.st_mode & 0o7777
            except FileNotFoundError:
                pass
        try:
            os.unlink(tmp, dir_fd=dir_fd)  # a leftover of a dead process of the same pid (or a planted link)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW, 0o644 if mode is None else mode, dir_fd=dir_fd)
        created = True
        try:
            _write_all(fd, data)
            if owner is not None and owner != (os.geteuid(), os.getegid()) and os.geteuid() == 0:
                os.fchown(fd, *owner)
            if mode is not None:
                os.fchmod(fd, mode)  # os.open's mode was filtered by the umask (and chown clears setuid)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        created = False
        if durable:
            _fsync_fd(dir_fd)
    except BaseException as exc:
        if created:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not a write error
            raise
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise WriteError(getattr(exc, "errno", None), reason, shown) from exc


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = _os_write(fd, view)
        if not written:  # 0: the disk takes no more, and looping would never end
            raise OSError(errno.ENOSPC, "os.write wrote 0 bytes (disk full?)")
        view = view[written:]


def _fsync_fd(dir_fd: int) -> None:
    """Make the rename itself durable: without this a crash can bring back the old directory entry."""
    try:
        os.fsync(dir_fd)
    except OSError:
        pass  # EINVAL on filesystems that cannot sync a directory
