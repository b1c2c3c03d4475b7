"""The bookkeeping folders of one engine in one tree, opened following no link.

`<tree>/.patchctl/<engine>/` is opened as descriptors (nofollow.open_dir), each folder checked to
belong to the tree's owner, root or the user running patchctl. Also here: the test seam that kills
a run at a named write step.

A module of its own so that the journal (journal.py) and the lock (lock.py), which both work in
these folders, open them one way."""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.core.atomic import write_atomic_at
from patchctl.core.nofollow import exists_at, open_dir

GITIGNORE = b"# patchctl's record of what it changed in this tree\n*\n"


def crash_point(step: str) -> None:
    """Tests kill a real apply at each write step: PATCHCTL_CRASH_AT=<step> sends SIGKILL to self."""
    if os.environ.get("PATCHCTL_CRASH_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


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
                crash_point("gitignore")
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
