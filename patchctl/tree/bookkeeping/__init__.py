"""What patchctl did to a target, kept in the target itself (place.py draws the layout): the record
and its codec (record.py), the one module that knows on-disk format versions (upgrade.py), the
folders and the lock (lock.py), blobs (blobs.py), the write-ahead journal and the bytecode stash
(journal.py), and TargetState, the session the work layer uses (session.py). The names here are
what the rest of patchctl imports."""

from patchctl.tree.bookkeeping.record import (
    BuildRecord,
    Change,
    FileRecord,
    PatchRecord,
    Selection,
    StateRecord,
    StoreRef,
    sha256,
)
from patchctl.tree.bookkeeping.session import TargetState

__all__ = ["BuildRecord", "Change", "FileRecord", "PatchRecord", "Selection", "StateRecord", "StoreRef", "TargetState", "sha256"]
