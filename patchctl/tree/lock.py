"""The target's lock, never written into, and the removal of the bookkeeping its holder leaves.

`<tree>/.patchctl/<engine>/lock` is flock'ed by the one patchctl working on a tree.

The tree (and so this folder) may belong to another user than the one running patchctl: root's
`ensure` on a service user's venv. Three rules keep that user from turning the lock against root:

- Nothing is written into the lock file, ever. It is opened without O_TRUNC and without following a
  link, and checked before it is locked (nofollow.own_file: a regular file, one link, owned by the
  tree's owner, root or the running user): a hard link planted under its name (`ln /etc/x lock`) is
  refused (exit 3) and left as it was. Which process holds it is read from /proc/locks. So `ensure`
  and `status` on an intact tree change no byte and no mtime anywhere in it.
- A lock counts only while its file is the one linked at the path: whoever gets the flock checks
  that its descriptor's inode is still the one named `lock` (the holder before it may have removed
  it), and opens the path again otherwise.
- A holder that leaves nothing applied removes the bookkeeping (revert leaves the tree as it was),
  and never what the next holder made: first everything but the lock (nobody else can be in the
  folder while the lock is linked), then the lock, checked to be the very file it holds, then each
  folder with rmdir, which fails once the next patchctl has made its lock (or another engine its
  folder) there. rmtree is never used past the point where someone else may have come in.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from patchctl.core.atomic import TEMP_NAME
from patchctl.core.errors import EnvironmentProblem, Planted
from patchctl.core.nofollow import exists_at, own_file, rmtree_at, unlink_at
from patchctl.tree import folders

if TYPE_CHECKING:
    from patchctl.tree.journal import TargetState

_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no O_TRUNC: nothing written
# Opens of a lock that vanished or changed under us, beyond --wait: each needs another patchctl that
# removed its folder just then, or a user swapping the file on purpose (then exit 3, not a loop).
_RETRIES = 50
_PROC_LOCKS = "/proc/locks"
_PROC_LOCKS_LIMIT = 4 << 20  # one line per lock held on the machine, ~60 bytes each


@contextmanager
def hold(st: TargetState, wait_seconds: float = 0.0, *, read_only_ok: bool = False) -> Iterator[str | None]:
    """TargetState.locked (its docstring says what it promises)."""
    deadline = time.monotonic() + wait_seconds
    retries = 0

    def again() -> bool:
        nonlocal retries
        retries += 1
        return retries <= _RETRIES or time.monotonic() < deadline

    while True:
        try:
            fd = _open(st)
        except Planted:
            raise
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                # Removed by the holder between our mkdir and our open (or while the .gitignore was
                # written into it: the atomic writer's WriteError): take the lock on the new one.
                if again():
                    time.sleep(0.01)
                    continue
                raise EnvironmentProblem(f"cannot lock {st.dir}: it was removed as patchctl made it, "
                                         f"{_RETRIES} times", hint="pass --wait SECONDS") from None
            unwritable = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)
            journal = unwritable and st._exists_quietly("journal.json")
            if read_only_ok and unwritable and not journal:
                yield exc.strerror or str(exc)
                return
            if journal:
                raise EnvironmentProblem(
                    f"cannot lock {st.dir}: {exc.strerror}; an interrupted write ({st.journal_file}) "
                    f"waits to be undone, and undoing it needs to write the tree",
                    hint=f"run `patchctl status {st.engine}` once as the tree's owner on a writable mount: it "
                         f"rolls the interrupted write back") from None
            raise EnvironmentProblem(f"cannot lock {st.dir}: {exc.strerror}",
                                     hint="run as the owner of the environment, on a writable mount") from None
        try:
            _flock(fd, deadline)
            # The holder before us may have removed the lock (nothing applied): a lock on a file no
            # longer linked locks nothing, so take the lock again on the file that is there now.
            if not _is_current(st, fd):
                if again():
                    time.sleep(0.01)
                    continue
                raise EnvironmentProblem(f"cannot lock {st.dir / 'lock'}: it was replaced {_RETRIES} times while "
                                         f"patchctl took it", hint="find who replaces it: patchctl does not")
            try:
                yield None
            finally:
                _forget_if_unused(st, fd)
            return
        finally:
            try:
                os.close(fd)  # closing releases the flock
            except OSError:
                pass


def _open(st: TargetState) -> int:
    """The lock file open (made when missing, empty), checked before anyone locks it. A link, a
    FIFO, a device, a hard link or another user's file: Planted, and nothing written to it."""
    shown = st.dir / "lock"
    with folders.opened(st.root, st.engine, create=True) as f:
        assert f is not None  # created
        try:
            before = os.stat("lock", dir_fd=f.dir, follow_symlinks=False)
        except FileNotFoundError:
            before = None
        if before is not None and stat.S_ISLNK(before.st_mode):
            raise Planted(f"{shown} is a symlink: patchctl locks (and reads and writes) nothing through a link",
                          hint="remove it: patchctl did not make it")
        if before is not None and not stat.S_ISREG(before.st_mode):
            # Not even opened: opening a device can act on it.
            raise Planted(f"{shown} is not a regular file (a FIFO, a device, a socket or a folder): patchctl locks "
                          f"nothing else", hint="remove it: patchctl did not make it")
        try:
            fd = os.open("lock", _OPEN, 0o644, dir_fd=f.dir)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # swapped for a link since the stat above
                raise Planted(f"{shown} is a symlink: patchctl locks nothing through a link",
                              hint="remove it: patchctl did not make it") from None
            raise
        try:
            if os.fstat(fd).st_nlink == 0:
                # Unlinked between our open and now: its holder removed the folder (nothing applied).
                # A planted link has two links or more; this is the cleanup race, so open the new one.
                raise FileNotFoundError(errno.ENOENT, "removed as it was opened", str(shown))
            own_file(fd, shown, f.owners)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _is_current(st: TargetState, fd: int) -> bool:
    """Whether the file open as `fd` is still the one named `lock` in the engine's folder."""
    try:
        with folders.opened(st.root, st.engine) as f:
            return f is not None and _linked(f.dir, fd)
    except FileNotFoundError:
        return False


def _linked(dir_fd: int, fd: int) -> bool:
    try:
        now = os.stat("lock", dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _flock(fd: int, deadline: float) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() >= deadline:
                raise EnvironmentProblem(f"another patchctl{_holder(fd)} is working on this target",
                                         hint="wait for it, or pass --wait SECONDS") from None
            time.sleep(0.2)


def _holder(fd: int) -> str:
    """' (pid N)': the process holding the flock on `fd`'s file, from /proc/locks (Linux); '' where it
    cannot be told. The lock file holds no pid: it is never written."""
    try:
        held = os.fstat(fd)
        with open(_PROC_LOCKS, "rb") as f:
            text = f.read(_PROC_LOCKS_LIMIT).decode("ascii", errors="replace")
    except OSError:
        return ""
    # "12: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF"; a process waiting for it: "12: -> FLOCK ..."
    where = f"{os.major(held.st_dev):02x}:{os.minor(held.st_dev):02x}:{held.st_ino}"
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == where and fields[4].isdigit():
            return f" (pid {fields[4]})"
    return ""


def _forget_if_unused(st: TargetState, fd: int) -> None:
    """No record and no journal: remove the bookkeeping while holding its lock (`fd`), and
    `.patchctl/` when no other engine's is in it; nothing the next holder made (module docstring).
    Nothing is removed through a link: a link planted in the folder is unlinked, not followed."""
    with folders.opened(st.root, st.engine) as f:
        if f is None or exists_at(f.dir, "state.json") or exists_at(f.dir, "journal.json"):
            return
        if not _linked(f.dir, fd):
            return  # not the lock we hold (replaced under us): whoever made it owns the folder now
        rmtree_at(f.dir, "blobs")
        names = os.listdir(f.dir)
        if any(name != "lock" and not TEMP_NAME.match(name) for name in names):
            return  # something else (a damaged record set aside): leave it for a person
        for name in names:
            if TEMP_NAME.match(name):
                unlink_at(f.dir, name)  # a dead holder's (only a holder writes here)
        if not _linked(f.dir, fd):
            return
        unlink_at(f.dir, "lock")
        # From here on the next patchctl may make its lock in the folder: rmdir only, never rmtree.
        try:
            os.rmdir(st.engine, dir_fd=f.top)
        except OSError:
            return  # the next holder's lock is in it already
        _remove_top(st, f)


def _remove_top(st: TargetState, f: folders.Folders) -> None:
    """Remove `.patchctl/` when it holds no engine's folder. Two leaving holders can cross here: one
    puts the .gitignore back (it saw the other's folder) while the other, which saw an empty
    `.patchctl/`, tries its rmdir. So a .gitignore being written (its temporary file) is waited for,
    and whoever fails looks again, rather than leave the .gitignore alone in the tree (seen 3 times
    in 60 runs of five `status --wait` at once before). Each holder puts the .gitignore back at most
    once, so this settles; a temporary file a killed writer left is given up on after 0.5 s."""
    for _ in range(50):
        try:
            names = sorted(os.listdir(f.top))
        except OSError:
            return  # removed already (by the other holder)
        if any(TEMP_NAME.match(name) for name in names):
            time.sleep(0.01)  # a .gitignore being written: by a holder on its way out, or by the next one
            continue
        if names not in ([], [".gitignore"]):
            folders.restore_gitignore(f.top, st.top)  # another engine's, or the next holder's folder
            return
        unlink_at(f.top, ".gitignore")
        try:
            os.rmdir(".patchctl", dir_fd=f.root)
            return
        except FileNotFoundError:
            return
        except OSError:
            continue  # something came in between: look again
    folders.restore_gitignore(f.top, st.top)
