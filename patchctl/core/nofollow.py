"""Opening files of a tree that another user may write, following nothing that user planted.

`ensure` runs as root on a venv a service user owns. Whatever that user can write (the tree, the
bookkeeping folder `<tree>/.patchctl/`) may hold a symlink, a FIFO or a device where patchctl expects
a file or a folder. Everything here works relative to a directory descriptor: a folder is opened with
O_DIRECTORY | O_NOFOLLOW (a link in its place is refused, not followed), a file is opened with
O_NOFOLLOW | O_NONBLOCK and read only when fstat says it is a regular file (in the bookkeeping also:
one link, a trusted owner, own_file), and no more bytes than a stated limit are read. Removal never
descends through a link. This is what git's safe.directory and systemd-tmpfiles' safe path
resolution do for the same reason (CVE-2022-24765: not trusting what another user controls).

The bookkeeping follows no link at all (open_dir, read_at, ...). The tree's own files may be reached
through links the tree holds (`*_beneath`): those are read with readlinkat and followed only while
they stay inside the tree, every step relative to the folder before it, so nothing the tree's owner
swaps in between a check and a use is followed out of it."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from patchctl.core.errors import Planted

_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
RECORD_LIMIT = 64 << 20  # state.json, journal.json: a few KiB in practice
FILE_LIMIT = 256 << 20  # a backup or a patched file: the largest .py of an engine is under 1 MiB


def open_dir(
    parent_fd: int, name: str, shown: Path | str, *, create: bool = False, owners: frozenset[int] | None = None
) -> int | None:
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
                raise Planted(
                    f"{shown} is not a directory (a symlink or a file): patchctl follows no link in its "
                    f"bookkeeping and writes nothing through it",
                    hint="remove it: patchctl did not make it (someone who can write the tree did)",
                ) from None
            raise
    else:
        raise FileNotFoundError(errno.ENOENT, "removed while being created", str(shown))
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):  # O_DIRECTORY makes this impossible; kept for platforms without it
            raise Planted(f"{shown} is not a directory")
        if owners is not None and st.st_uid not in owners:
            raise Planted(
                f"{shown} belongs to uid {st.st_uid}, neither the tree's owner nor root: patchctl does "
                f"not trust bookkeeping another user made",
                hint="remove it (or chown it to the tree's owner), then run the command again",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at(dir_fd: int, name: str, shown: Path | str, limit: int = FILE_LIMIT, *, owners: frozenset[int]) -> bytes | None:
    """The bytes of the bookkeeping file `name` in `dir_fd`, None when it is missing. A link, a FIFO,
    a device or a folder in its place, a hard link, a file of another user (own_file) or a file over
    `limit` bytes: Planted (no hang, no memory blow-up, nothing of another file read)."""
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Planted(
                f"{shown} is a symlink: patchctl reads its bookkeeping through no link",
                hint="remove it: patchctl did not make it",
            ) from None
        raise
    try:
        own_file(fd, shown, owners)
        return _read_fd(fd, shown, limit)
    finally:
        os.close(fd)


def own_file(fd: int, shown: Path | str, owners: frozenset[int]) -> os.stat_result:
    """fstat of an open bookkeeping file, refused (Planted) unless patchctl could have made it: a
    regular file (a FIFO or a device is never read nor locked), with one link (a hard link planted
    under a bookkeeping name is another file of the system: /etc/..., another user's; O_NOFOLLOW
    does not see it, the link count does) and owned by one of `owners` (the tree's owner, root,
    the user running patchctl). Every bookkeeping file is made by a rename of a new file, so a
    real one always passes."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Planted(
            f"{shown} is not a regular file (a FIFO, a device, a socket or a folder): patchctl reads none",
            hint="remove it: patchctl did not make it",
        )
    if st.st_nlink != 1:
        raise Planted(
            f"{shown} has {st.st_nlink} hard links: patchctl reads and writes no bookkeeping file that is also another file",
            hint="remove it: patchctl did not make it (someone who can write the tree did)",
        )
    if st.st_uid not in owners:
        raise Planted(
            f"{shown} belongs to uid {st.st_uid}, neither the tree's owner nor root: patchctl does not "
            f"trust bookkeeping another user made",
            hint="remove it (or chown it to the tree's owner), then run the command again",
        )
    return st


# --- files of the tree itself: links inside the tree followed, by hand, never out of it -------------
#
# A tree file's path may run through links the tree holds on purpose (a symlinked folder, a module
# that is a link to another one). Resolving it by path and then opening the result leaves a window
# in which its owner can swap a name for a link out of the tree. So each step is made relative to the
# descriptor of the folder before it (openat with O_NOFOLLOW); a link met on the way is read with
# readlinkat and its target walked the same way from the tree's root, refused when it leaves the
# tree (systemd's chase_symlinks, openat2's RESOLVE_BENEATH, done by hand: Python has no openat2).

_MAX_LINKS = 40  # as the kernel's own limit on links in one path


class _Beneath:
    """A walk of paths inside the tree at `root` (named by the user: the root itself is trusted)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.real_root = os.path.realpath(root)
        self.links = 0

    def _root_fd(self) -> int:
        return os.open(self.root, _DIR & ~getattr(os, "O_NOFOLLOW", 0))

    def _followed(self, shown: str, folder: str, target: str) -> list[str]:
        """The path (as parts from the root) a link in `folder` (parts joined by /) pointing at
        `target` names; refused when it leads out of the tree."""
        self.links += 1
        if self.links > _MAX_LINKS:
            raise Planted(f"{self.root / shown}: more than {_MAX_LINKS} symlinks on the way (a loop?)")
        if os.path.isabs(target):
            joined = os.path.normpath(target)
            if joined != self.real_root and not joined.startswith(self.real_root.rstrip("/") + "/"):
                raise self._outside(shown, joined)
            joined = os.path.relpath(joined, self.real_root)
        else:
            joined = os.path.normpath(os.path.join(folder, target)) if folder else os.path.normpath(target)
        if joined == ".." or joined.startswith("../") or os.path.isabs(joined):
            raise self._outside(shown, os.path.normpath(os.path.join(self.real_root, joined)))
        return [p for p in joined.split("/") if p not in ("", ".")]

    def _outside(self, shown: str, where: str) -> Planted:
        return Planted(
            f"{self.root / shown} is a symlink (or lies under one) to {where}, outside the tree: "
            f"patchctl reads and writes nothing through it",
            hint="replace the link by the file it names (or remove it), then run the command again",
        )

    def folder(self, parts: list[str], shown: str, *, create: bool = False) -> tuple[int, list[str]]:
        """The folder `parts` open (links inside the tree followed) and its real parts from the root.
        Missing (and not create): FileNotFoundError; a file on the way: NotADirectoryError."""
        todo = list(parts)
        fd = self._root_fd()
        real: list[str] = []
        try:
            while todo:
                part = todo.pop(0)
                if part in ("", "."):
                    continue
                if part == "..":  # only from a link's target, already normalised: never above the root
                    todo = self._followed(shown, "/".join(real), "/".join([".."] + todo))
                    real = []
                    os.close(fd)
                    fd = self._root_fd()
                    continue
                try:
                    below = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass
                    todo.insert(0, part)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    try:
                        target = os.readlink(part, dir_fd=fd)
                    except OSError as again:
                        if again.errno == errno.EINVAL and exc.errno == errno.ENOTDIR:
                            raise NotADirectoryError(
                                errno.ENOTDIR, "a file, not a folder", str(self.root.joinpath(*real, part))
                            ) from None
                        if again.errno in (errno.EINVAL, errno.ENOENT):  # swapped meanwhile: look again
                            todo.insert(0, part)
                            self.links += 1
                            if self.links > _MAX_LINKS:
                                raise Planted(f"{self.root / shown} keeps changing while patchctl opens it") from None
                            continue
                        raise
                    todo = self._followed(shown, "/".join(real), target) + todo
                    real = []
                    os.close(fd)
                    fd = self._root_fd()
                    continue
                os.close(fd)
                fd = below
                real.append(part)
        except BaseException:
            os.close(fd)
            raise
        return fd, real

    def final(self, rel: str, *, create: bool = False) -> tuple[int, str, list[str]]:
        """(the folder `rel` lies in, open; its last name; that folder's real parts from the root)."""
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if not parts or parts[-1] == "..":
            raise NotADirectoryError(errno.EISDIR, "not a file", str(self.root / rel))
        fd, real = self.folder(parts[:-1], rel, create=create)
        return fd, parts[-1], real

    def open_file(self, rel: str) -> int | None:
        """A descriptor of the file `rel` names, links inside the tree followed (None: missing or a
        folder); opened O_NONBLOCK, so a FIFO there does not hang the open (_read_fd refuses it)."""
        shown = rel
        while True:
            try:
                folder, name, real = self.final(rel)
            except (FileNotFoundError, NotADirectoryError):
                return None
            try:
                fd = os.open(name, _FILE, dir_fd=folder)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                try:
                    target = os.readlink(name, dir_fd=folder)
                except OSError:
                    target = name  # swapped back meanwhile: look again (counted as a link)
                rel = "/".join(self._followed(shown, "/".join(real), target))
                if not rel:
                    return None  # the link names the root: a folder
                continue
            finally:
                os.close(folder)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.close(fd)
                return None
            return fd


def read_beneath(root: Path, rel: str, limit: int = FILE_LIMIT) -> bytes | None:
    """A file of the tree at `root`: None when missing (or a folder, or under a file); a link on the
    way is followed only inside the tree (one that leads out: Planted); a FIFO, a device or a file
    over `limit`: Planted. No step resolves a path by name, so nothing swapped meanwhile is followed."""
    fd = _Beneath(root).open_file(rel)
    if fd is None:
        return None
    try:
        return _read_fd(fd, root / rel, limit)
    finally:
        os.close(fd)


def stat_beneath(root: Path, rel: str) -> os.stat_result | None:
    """What the file `rel` names (links inside the tree followed, as read_beneath follows them), not
    read: None when missing or a folder."""
    fd = _Beneath(root).open_file(rel)
    if fd is None:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def lstat_beneath(root: Path, rel: str) -> os.stat_result | None:
    """The entry `rel` itself (a link as a link), its folders reached as read_beneath reaches them."""
    try:
        with parent_beneath(root, rel) as (folder, name):
            return os.stat(name, dir_fd=folder, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


@contextmanager
def parent_beneath(root: Path, rel: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """(the folder `rel` goes into, open; its last name), for writing, renaming or removing that name
    relative to the folder (write_atomic_at, unlink_at): the folders on the way reached as
    read_beneath reaches them (create: made when missing), the last name itself never followed (a
    rename over a link replaces the link). Missing folder: FileNotFoundError."""
    folder, name, _ = _Beneath(root).final(rel, create=create)
    try:
        yield folder, name
    finally:
        os.close(folder)


@contextmanager
def folder_beneath(root: Path, rel: str) -> Iterator[int | None]:
    """The folder `rel` of the tree open (links inside the tree followed), None when missing."""
    try:
        fd, _ = _Beneath(root).folder([p for p in rel.split("/") if p not in ("", ".")], rel)
    except (FileNotFoundError, NotADirectoryError):
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _read_fd(fd: int, shown: Path | str, limit: int) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Planted(
            f"{shown} is not a regular file (a FIFO, a device, a socket or a folder): patchctl reads none",
            hint="remove it: patchctl did not make it",
        )
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


__all__ = [
    "FILE_LIMIT",
    "RECORD_LIMIT",
    "Planted",
    "exists_at",
    "folder_beneath",
    "lstat_beneath",
    "open_dir",
    "own_file",
    "open_regular",
    "parent_beneath",
    "read_at",
    "read_beneath",
    "rmtree_at",
    "stat_beneath",
    "unlink_at",
]


# --- a folder that may hold no link at all (an OCI layout directory) ------------------------------


def open_regular(root: Path, rel: str) -> int | None:
    """A descriptor of the regular file root/rel, opened following no link: neither a folder on the
    way nor the file itself (root is the caller's, named by the user). None when missing. A link, a
    FIFO, a device or a folder there: Planted naming it (opened O_NONBLOCK, so a FIFO does not hang
    the open; the descriptor is made blocking again for reading)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    try:
        fd = os.open(root, _DIR & ~getattr(os, "O_NOFOLLOW", 0))
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        for i, part in enumerate(parts):
            shown = root.joinpath(*parts[: i + 1])
            last = i == len(parts) - 1
            try:
                below = os.open(part, _FILE if last else _DIR, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                # A link where a folder belongs fails O_DIRECTORY | O_NOFOLLOW with ENOTDIR, not ELOOP.
                linked = exc.errno == errno.ELOOP or (
                    exc.errno == errno.ENOTDIR and stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                )
                if linked:
                    raise Planted(f"{shown} is a symlink: patchctl follows no link there") from None
                if exc.errno == errno.ENOTDIR:
                    return None  # a file where a folder belongs: nothing under it
                raise
            os.close(fd)
            fd = below
            if last:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise Planted(f"{shown} is not a regular file (a FIFO, a device, a socket or a folder): patchctl reads none")
                os.set_blocking(fd, True)
                result, fd = fd, -1
                return result
        return None  # rel named root itself: a folder
    finally:
        if fd >= 0:
            os.close(fd)
