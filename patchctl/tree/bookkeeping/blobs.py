"""File contents by sha256 in `<tree>/.patchctl/<engine>/blobs/`: the pristine backups revert puts
back, the staged new contents of a journaled write, and stashed bytecode. A blob is checked against
its name when read: a missing or altered one is damage, never trusted."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from patchctl.core.atomic import write_atomic_at
from patchctl.core.errors import StateDamaged
from patchctl.core.nofollow import open_dir, read_at
from patchctl.tree.bookkeeping.lock import Folders
from patchctl.tree.bookkeeping.record import sha256


def put(f: Folders, data: bytes, shown: Path) -> str:
    """Store `data` (unless a blob with its bytes is there already); its sha256. shown: the blobs
    folder, for messages."""
    digest = hashlib.sha256(data).hexdigest()
    blobs = open_dir(f.dir, "blobs", shown, create=True, owners=f.owners)
    assert blobs is not None  # created
    try:
        if sha256(read_at(blobs, digest, shown / digest, owners=f.owners)) != digest:
            write_atomic_at(blobs, digest, data, shown=str(shown / digest))
    finally:
        os.close(blobs)
    return digest


def get(f: Folders | None, digest: str, shown: Path, hint: str) -> bytes:
    """The blob's bytes, checked against its name (f None: the bookkeeping folder is missing)."""
    blobs = None if f is None else open_dir(f.dir, "blobs", shown, owners=f.owners)
    data = None
    if f is not None and blobs is not None:
        try:
            data = read_at(blobs, digest, shown / digest, owners=f.owners)
        finally:
            os.close(blobs)
    if data is None:
        raise StateDamaged(f"backup {digest[:12]}… is missing from {shown}", hint=hint)
    if sha256(data) != digest:
        raise StateDamaged(f"backup {digest[:12]}… in {shown} is corrupt", hint=hint)
    return data
