"""TargetState: the bookkeeping of one engine in one tree, as the work layer uses it (tree.apply,
tree.revert, tree.status, tree.edits): a Place (its files, record and blobs) with the lock, the journaled write and recovery.
Under the lock it is a session: the folders' descriptors the lock opened serve every read and write
of the target's bookkeeping in this process until it is let go (Place.holding)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from patchctl.core.nofollow import exists_at
from patchctl.tree.bookkeeping import journal, lock
from patchctl.tree.bookkeeping.place import Place
from patchctl.tree.bookkeeping.record import Change, StateRecord


class TargetState(Place):
    @contextmanager
    def locked(self, wait_seconds: float = 0.0, *, read_only_ok: bool = False) -> Iterator[str | None]:
        """The target's lock (lock.py); yields None when it is held. read_only_ok: a tree nothing may be
        written into (a read-only mount, a user without write permission: status as another user, ensure
        as a service user under ProtectSystem=) is read without it, as long as no interrupted write
        waits to be undone: it then yields why the lock could not be taken ("Read-only file system"),
        and the caller must write nothing. When nothing is applied any more, the bookkeeping folder is
        removed on the way out (revert leaves the tree as it was), never what the next holder made.
        Taking it writes nothing: the lock file is never written."""
        with lock.hold(self.root, self.engine, wait_seconds, read_only_ok=read_only_ok) as held:
            if isinstance(held, str):
                yield held
                return
            with self.holding(held):
                yield None

    def recover(self) -> bool:
        """Undo an interrupted write and sweep temp files of dead processes; True when there was one."""
        return journal.recover(self)

    def write_files(self, changes: list[Change], new_record: StateRecord | None) -> None:
        """Replace files under the root all-or-nothing, then save new_record."""
        journal.write_files(self, changes, new_record)

    def capture(self, rel: str) -> tuple[int | None, tuple[tuple[str, str], ...]]:
        """The file's mtime and its .pyc files (stashed as blobs), to put back when it is restored."""
        return journal.capture(self, rel)

    def set_aside_damaged(self) -> None:
        """The record and the journal renamed out of the way (kept for a person to read), not replayed."""
        with self.folders() as f:
            if f is None:
                return
            for name in ("journal.json", "state.json"):
                if exists_at(f.dir, name):
                    os.rename(name, f"{name}.damaged-{int(time.time())}", src_dir_fd=f.dir, dst_dir_fd=f.dir)
