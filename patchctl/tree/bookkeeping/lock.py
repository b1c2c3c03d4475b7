"""The bookkeeping folders of one engine in one tree, opened following no link; the target's lock,
never written into; and the removal of the bookkeeping its holder leaves.

`<tree>/.patchctl/<engine>/` is opened as descriptors (nofollow.open_dir), each folder checked to
belong to the tree's owner, root or the user running patchctl. The lock's holder keeps them open for
the whole session (hold() yields them): every read and write of the bookkeeping under the lock goes
through those descriptors, and none is reopened by its name.

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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.core.atomic import TEMP_NAME, write_atomic_at
from patchctl.core.errors import EnvironmentProblem, Planted
from patchctl.core.nofollow import exists_at, open_dir, own_file, rmtree_at, unlink_at
from patchctl.tree.bookkeeping import steps

GITIGNORE = b"# patchctl's record of what it changed in this tree\n*\n"


class Folders(NamedTuple):
    """The bookkeeping folders, open: the tree, <tree>/.patchctl and <tree>/.patchctl/<engine>."""

    root: int
    top: int
    dir: int

    @property
    def owners(self) -> frozenset[int]:
        """Who may own a folder or a file of the bookkeeping: the tree's owner, root, the user running
        patchctl (root's `ensure` on a service user's venv finds the user's files and its own)."""
        return frozenset({os.fstat(self.root).st_uid, 0, os.geteuid()})


@contextmanager
def opened(root: Path, engine: str, create: bool = False) -> Iterator[Folders | None]:
    """The folders open (None: missing and not created). create: made when missing, with the
    .gitignore that keeps them out of a checkout's status; a full disk leaves no empty folder."""
    top_shown, dir_shown = root / ".patchctl", root / ".patchctl" / engine
    opened_fds: list[int] = []
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # named by the user
        opened_fds.append(root_fd)
        owners = frozenset({os.fstat(root_fd).st_uid, 0, os.geteuid()})
        top = open_dir(root_fd, ".patchctl", top_shown, owners=owners)
        made_top = top is None
        if top is None and create:
            top = open_dir(root_fd, ".patchctl", top_shown, create=True, owners=owners)
        if top is None:
            yield None
            return
        opened_fds.append(top)
        folder = open_dir(top, engine, dir_shown, owners=owners)
        made_dir = folder is None
        if folder is None and create:
            folder = open_dir(top, engine, dir_shown, create=True, owners=owners)
        if folder is None:
            yield None
            return
        opened_fds.append(folder)
        if made_dir and not exists_at(top, ".gitignore"):  # a folder made now (a tree as pip left it)
            try:
                write_atomic_at(top, ".gitignore", GITIGNORE, shown=str(top_shown / ".gitignore"))
                steps.reached("gitignore")
            except OSError:
                # A full disk: leave no empty folder behind in the tree.
                _quietly(os.rmdir, engine, dir_fd=top)
                if made_top:
                    _quietly(os.rmdir, ".patchctl", dir_fd=root_fd)
                raise
        yield Folders(root_fd, top, folder)
    finally:
        for fd in reversed(opened_fds):
            os.close(fd)


def restore_gitignore(top: int, shown: Path) -> None:
    """Put the .gitignore back into `.patchctl/` (best effort: it only keeps a checkout's status
    quiet), for a folder that was to be removed and was not: another patchctl made its own in it."""
    if not exists_at(top, ".gitignore"):
        _quietly(write_atomic_at, top, ".gitignore", GITIGNORE, shown=str(shown / ".gitignore"))


def _quietly(func: Any, *args: Any, **kwargs: Any) -> None:
    try:
        func(*args, **kwargs)
    except OSError:
        pass


# the lock --------------------------------------------------------------------------------------

_OPEN = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # no O_TRUNC: nothing written
# Opens of a lock that vanished or changed under us, beyond --wait: each needs another patchctl that
# removed its folder just then, or a user swapping the file on purpose (then exit 3, not a loop).
_RETRIES = 50
_PROC_LOCKS = "/proc/locks"
_PROC_LOCKS_LIMIT = 4 << 20  # one line per lock held on the machine, ~60 bytes each


@contextmanager
def hold(root: Path, engine: str, wait_seconds: float = 0.0, *, read_only_ok: bool = False) -> Iterator[Folders | str]:
    """The lock of `engine`'s bookkeeping in the tree at `root`, held: yields the folders, open, for
    the holder to read and write through until it lets go (TargetState.locked says what it
    promises); or, read_only_ok and the tree cannot be written, why the lock could not be taken."""
    shown = root / ".patchctl" / engine
    deadline = time.monotonic() + wait_seconds
    retries = 0

    def again() -> bool:
        nonlocal retries
        retries += 1
        return retries <= _RETRIES or time.monotonic() < deadline

    while True:
        try:
            fd = _open(root, engine)
        except Planted:
            raise
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                # Removed by the holder between our mkdir and our open (or while the .gitignore was
                # written into it: the atomic writer's WriteError): take the lock on the new one.
                if again():
                    time.sleep(0.01)
                    continue
                raise EnvironmentProblem(
                    f"cannot lock {shown}: it was removed as patchctl made it, {_RETRIES} times", hint="pass --wait SECONDS"
                ) from None
            unwritable = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)
            journal = unwritable and _journal_waits(root, engine)
            if read_only_ok and unwritable and not journal:
                yield exc.strerror or str(exc)
                return
            if journal:
                raise EnvironmentProblem(
                    f"cannot lock {shown}: {exc.strerror}; an interrupted write ({shown / 'journal.json'}) "
                    f"waits to be undone, and undoing it needs to write the tree",
                    hint=f"run `patchctl status {engine}` once as the tree's owner on a writable mount: it "
                    f"rolls the interrupted write back",
                ) from None
            raise EnvironmentProblem(
                f"cannot lock {shown}: {exc.strerror}", hint="run as the owner of the environment, on a writable mount"
            ) from None
        try:
            _flock(fd, deadline)
            with ExitStack() as session:
                # The holder before us may have removed the lock (nothing applied): a lock on a file no
                # longer linked locks nothing, so take the lock again on the file that is there now.
                # The folders opened for this check are the session's: they hold the lock file.
                f = _current(root, engine, fd, session)
                if f is None:
                    if again():
                        time.sleep(0.01)
                        continue
                    raise EnvironmentProblem(
                        f"cannot lock {shown / 'lock'}: it was replaced {_RETRIES} times while patchctl took it",
                        hint="find who replaces it: patchctl does not",
                    )
                try:
                    yield f
                finally:
                    _forget_if_unused(root, engine, f, fd)
            return
        finally:
            try:
                os.close(fd)  # closing releases the flock
            except OSError:
                pass


def _journal_waits(root: Path, engine: str) -> bool:
    """Whether an interrupted write's journal is there (False where the folder cannot be read)."""
    try:
        with opened(root, engine) as f:
            return f is not None and exists_at(f.dir, "journal.json")
    except OSError:
        return False


def _open(root: Path, engine: str) -> int:
    """The lock file open (made when missing, empty), checked before anyone locks it. A link, a
    FIFO, a device, a hard link or another user's file: Planted, and nothing written to it."""
    shown = root / ".patchctl" / engine / "lock"
    with opened(root, engine, create=True) as f:
        assert f is not None  # created
        try:
            before = os.stat("lock", dir_fd=f.dir, follow_symlinks=False)
        except FileNotFoundError:
            before = None
        if before is not None and stat.S_ISLNK(before.st_mode):
            raise Planted(
                f"{shown} is a symlink: patchctl locks (and reads and writes) nothing through a link",
                hint="remove it: patchctl did not make it",
            )
        if before is not None and not stat.S_ISREG(before.st_mode):
            # Not even opened: opening a device can act on it.
            raise Planted(
                f"{shown} is not a regular file (a FIFO, a device, a socket or a folder): patchctl locks nothing else",
                hint="remove it: patchctl did not make it",
            )
        try:
            fd = os.open("lock", _OPEN, 0o644, dir_fd=f.dir)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # swapped for a link since the stat above
                raise Planted(
                    f"{shown} is a symlink: patchctl locks nothing through a link", hint="remove it: patchctl did not make it"
                ) from None
            raise
        try:
            try:
                own_file(fd, shown, f.owners)
            except Planted:
                if os.fstat(fd).st_nlink != 0:
                    raise
                # Unlinked between our open and our check (its holder removed the folder: nothing
                # applied), checked after own_file refused it, since the unlink can come between any
                # two looks at it. A planted link has two links or more; this is the cleanup race,
                # so open the new one.
                raise FileNotFoundError(errno.ENOENT, "removed as it was opened", str(shown)) from None
        except BaseException:
            os.close(fd)
            raise
    return fd


def _current(root: Path, engine: str, fd: int, session: ExitStack) -> Folders | None:
    """The folders, opened by their names and left open in `session`, when the file open as `fd` is
    still the one named `lock` in them; None (nothing left open) when it is not."""
    try:
        f = session.enter_context(opened(root, engine))
    except FileNotFoundError:
        return None
    return f if f is not None and _linked(f.dir, fd) else None


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
                raise EnvironmentProblem(
                    f"another patchctl{_holder(fd)} is working on this target", hint="wait for it, or pass --wait SECONDS"
                ) from None
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


def _forget_if_unused(root: Path, engine: str, f: Folders, fd: int) -> None:
    """No record and no journal: remove the bookkeeping while holding its lock (`fd`), and
    `.patchctl/` when no other engine's is in it; nothing the next holder made (module docstring).
    Nothing is removed through a link: a link planted in the folder is unlinked, not followed."""
    if exists_at(f.dir, "state.json") or exists_at(f.dir, "journal.json"):
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
        os.rmdir(engine, dir_fd=f.top)
    except OSError:
        return  # the next holder's lock is in it already
    _remove_top(root / ".patchctl", f)


def _remove_top(top: Path, f: Folders) -> None:
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
            restore_gitignore(f.top, top)  # another engine's, or the next holder's folder
            return
        unlink_at(f.top, ".gitignore")
        try:
            os.rmdir(".patchctl", dir_fd=f.root)
            return
        except FileNotFoundError:
            return
        except OSError:
            continue  # something came in between: look again
    restore_gitignore(f.top, top)
