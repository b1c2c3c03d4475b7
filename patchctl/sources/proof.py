"""What proves a wheel member the download cache holds (issue 33, 3a): never a sha256 stored beside
the member's bytes (whoever can write the cache rewrites both), but the wheel's RECORD, which was
itself proven when it was read: by the artifact's sha256 (a whole artifact checked against the
index's, `verified/<sha256>/`) or as the range reads of one URL gave it (`artifacts/...`).

RECORD's bytes are kept in the member's folder as `RECORD`, framed (damage) and bound to that folder
(its name is the first line, so a RECORD patchctl wrote for another artifact, moved or linked here,
does not prove this one's members). That file proves something only when `written_by_us` (the
running user or root wrote it, and no one else may write it): another user can plant a RECORD that
matches the members they plant, but not one with this owner. Anything else is read again: the
members from the artifact (re-hashed against the index's sha256) or by range, RECORD with them.
"""
from __future__ import annotations

import csv
import hashlib
from pathlib import Path
from typing import NamedTuple

from patchctl.sources import zipread
from patchctl.sources.cache import ArtifactCache, framed, unframe

RECORD_FILE = "RECORD"


class Record(NamedTuple):
    hashes: dict[str, str]  # member name -> sha256 hex
    listed: frozenset[str]  # every name RECORD lists (with a hash or not): what the wheel holds


def parse(raw: bytes) -> Record:
    """RECORD's rows (ValueError or csv.Error when it is malformed)."""
    return Record(zipread.record_hashes(raw), frozenset(row[0] for row in zipread.record_rows(raw) if row))


def write(cache: ArtifactCache, folder: Path, raw: bytes) -> None:
    """Keep RECORD's bytes (proven by the caller: read from the checked artifact, or by range) in
    `folder`, bound to it."""
    cache.write(folder / RECORD_FILE, framed(folder.name.encode() + b"\n" + raw))


def read(cache: ArtifactCache, folder: Path) -> Record | None:
    """The RECORD kept in `folder`, when it proves anything: written by this user (or root), intact,
    and written for this folder. None otherwise (the caller reads the members again). Damaged (a
    link, a FIFO) propagates to the caller, which removes it or names it offline."""
    data, ours = cache.read_owned(folder / RECORD_FILE)
    inner = unframe(data) if ours else None
    if inner is None:
        return None
    head, sep, raw = inner.partition(b"\n")
    if not sep or head != folder.name.encode():
        return None
    try:
        return parse(raw)
    except (ValueError, csv.Error):
        return None


UNPROVABLE = "RECORD lists no sha256 for it"


def problem(record: Record, name: str, data: bytes | None) -> str | None:
    """Why a cached member (None: cached as absent) is not what the wheel holds; None when RECORD
    proves it. UNPROVABLE when RECORD cannot say (a member it lists without a hash)."""
    if data is None:
        return f"says {name} is not in the wheel, but the wheel's RECORD lists it" if name in record.listed else None
    expected = record.hashes.get(name)
    if expected is None:
        return UNPROVABLE
    if hashlib.sha256(data).hexdigest() != expected:
        return f"does not match the sha256 the wheel's RECORD lists for {name}"
    return None
