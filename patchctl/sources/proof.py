"""What proves a wheel member the download cache holds: never a sha256 stored beside the member's
bytes (whoever can write the cache rewrites both; issue 33, 3a), but the wheel's RECORD, which was
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

from patchctl.sources import zipread
from patchctl.sources.cache import ArtifactCache, framed, unframe

RECORD_FILE = "RECORD"


class Record:
    """A wheel's RECORD, parsed only as far as it is asked: a warm read checks a few members against
    it, and vLLM's lists ~5800 files (a whole parse: ~15 ms, where finding one row is ~0.1 ms)."""

    def __init__(self, raw: bytes):
        raw.decode("utf-8")  # not UTF-8: a ValueError now, as a whole parse would raise
        self.raw = raw
        self._text = b"\n" + raw  # so that every row, the first too, starts after a newline
        # The rows split on newlines and commas alone (zipread.record_rows' fast case).
        self._plain = not any(c in raw for c in (b'"', b"\r", b"\0"))
        self._hashes: dict[str, str] | None = None
        self._listed: frozenset[str] | None = None

    @property
    def hashes(self) -> dict[str, str]:
        """member name -> sha256 hex, for every row with one."""
        if self._hashes is None:
            self._hashes = zipread.record_hashes(self.raw)
        return self._hashes

    def lookup(self, name: str) -> tuple[bool, str | None]:
        """Whether RECORD lists `name`, and the sha256 (hex) it gives for it, if any."""
        key = b"\n" + name.encode() + b","
        text = self._text
        if self._plain and self._hashes is None and "\n" not in name and "," not in name and text.count(key) <= 1:
            at = text.find(key)
            if at < 0:
                return False, None
            end = text.find(b"\n", at + 1)
            row = text[at + 1 :] if end < 0 else text[at + 1 : end]
            return True, zipread.record_hashes(row).get(name)  # the same decoding as a whole parse
        if self._listed is None:
            self._listed = frozenset(row[0] for row in zipread.record_rows(self.raw) if row)
        return name in self._listed, self.hashes.get(name)


def parse(raw: bytes) -> Record:
    """RECORD's rows (ValueError or csv.Error when it is malformed)."""
    record = Record(raw)
    record.hashes  # noqa: B018  (parsed now, so that a malformed RECORD is refused where it is read)
    return record


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
        return Record(raw)  # it was parsed whole before it was written: rows are read as asked
    except ValueError:
        return None


UNPROVABLE = "RECORD lists no sha256 for it"


def problem(record: Record, name: str, data: bytes | None) -> str | None:
    """Why a cached member (None: cached as absent) is not what the wheel holds; None when RECORD
    proves it. UNPROVABLE when RECORD cannot say (a member it lists without a hash)."""
    try:
        listed, expected = record.lookup(name)
    except (ValueError, csv.Error):  # it parsed whole before it was written: not expected, not trusted
        return UNPROVABLE
    if data is None:
        return f"says {name} is not in the wheel, but the wheel's RECORD lists it" if listed else None
    if expected is None:
        return UNPROVABLE
    if hashlib.sha256(data).hexdigest() != expected:
        return f"does not match the sha256 the wheel's RECORD lists for {name}"
    return None
