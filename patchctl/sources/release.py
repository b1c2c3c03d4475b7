"""Pristine files of one released version, read from the package index.

Wheels are zip files: the central directory and just the members a patch needs are fetched with
HTTP range reads, each member checked against its CRC-32 and the sha256 the wheel's RECORD lists.
Without a usable wheel (or a server that ignores Range) the whole artifact is downloaded, checked
against the index's sha256, and the needed members are taken from it (a wheel's, again checked against
its RECORD). Cached file lists that do not parse are read again, or refused offline.

This module composes the parts: `cache` (where each file lives, read without following symlinks),
`choice` (which artifact, read how), `sparse` (the range reads), `download` (the whole artifact
against its sha256), `whole` (the cached artifact, proven on every read), `proof` (cached members
against RECORD), `archive` (reading and extracting members). Provenance: bytes read by range are
kept per artifact URL and claimed hash and served only for that URL; the details of `provenance()`
say `"verified": true` only when every file served came from a whole artifact checked against the
index's sha256 (else the bytes are as the index served them, each checked against the wheel's RECORD).

An index that publishes no hash (vLLM's nightly wheel repository) is accepted for wheels only: every
member read must then be listed in the wheel's RECORD and match it (and its CRC-32), the sha256 of a
downloaded artifact is recorded, and the document's `source` says `"index_sha256": null,
"verified_by": "RECORD"`. An sdist has no RECORD, so without the index's sha256 it is refused.
"""

from __future__ import annotations

import csv
import hashlib
import json
import struct
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from packaging.utils import canonicalize_name

from patchctl.core.engines import Engine
from patchctl.core.errors import EnvironmentProblem, NetworkError, UsageError
from patchctl.core.yamlio import load_json
from patchctl.sources import archive, http, proof, zipread
from patchctl.sources.cache import (
    ArtifactCache,
    Damaged,
    framed,
    member_key,
    unframe,
)

# Re-exported: callers (fetch.py, the tests) import the choice from here, where it used to live.
from patchctl.sources.choice import (  # noqa: F401
    CENTRAL_DIRECTORY_FILE,
    ArtifactChoice,
    choose,
    choose_artifact,
    record_tail,
    tail_estimate,
)
from patchctl.sources.files import NoProgress, ProgressSink, Provenance
from patchctl.sources.index import IndexFile
from patchctl.sources.sparse import SparseWheel
from patchctl.sources.whole import VERIFY_MARK_BYTES, WholeArtifact  # noqa: F401  (re-exported)
from patchctl.sources.zipread import ZipEntry

FETCH_THREADS = 8


class ReleaseSource(WholeArtifact):
    """FileSource over one artifact of a release; member paths are relative to the import root."""

    def __init__(
        self,
        engine: Engine,
        artifact: IndexFile,
        cache_root: Path,
        *,
        offline: bool = False,
        progress: ProgressSink | None = None,
        sparse: bool = True,
        details: dict | None = None,
        whole: bool = False,
        reason: str | None = None,
        verify: bool = False,
    ):
        if artifact.sha256 is None and artifact.kind != "wheel":
            raise UsageError(
                f"{artifact.filename}: the index publishes no sha256 for it, and an sdist "
                "has no RECORD to check its files against"
            )
        self.engine = engine
        self.artifact = artifact
        self.cache = ArtifactCache(cache_root)
        # What range reads gave is kept per URL and claimed hash (as the index served it); a whole
        # artifact checked against the index's sha256 is kept by that hash, for any URL.
        self.dir = self.cache.unverified(artifact.url, artifact.sha256)
        self.verified_dir = self.cache.verified(artifact.sha256) if artifact.sha256 else None
        self.details = dict(details or {})
        self.offline = offline
        self.progress = progress or NoProgress()
        self.cache_root = cache_root
        self.reason = reason
        self.sparse = sparse and artifact.kind == "wheel" and not whole and not verify
        # --verify: serve only what a whole artifact checked against the index's sha256 gave (never the
        # range reads a run before kept, which are as the index served them).
        self.verify = verify
        self.bytes_fetched = 0
        self._how: set[str] = set()  # "ranges", "whole": how this run read the artifact
        self._verified: dict[str, bytes | None] = {}  # members checked by prefetch, until read() takes them
        self._as_served = False  # some file this run served is as the index served it (not hash-verified)
        self._entries: dict[str, ZipEntry] | None = None
        self._record: dict[str, str] | None = None
        self._proven: dict[Path, proof.Record | None] = {}  # each folder's RECORD, read once
        self._refetched: list[str] = []  # cache files that were not what they claimed, read again
        self._artifact_key: str | None = None  # the stat key of the artifact this run proved
        self._lock = threading.Lock()
        self._wheel = SparseWheel(artifact.url, artifact.filename, artifact.size, self._count)

    # FileSource -----------------------------------------------------------------------------
    def read(self, path: str) -> bytes | None:
        if path not in self._verified:
            self.prefetch([path])
        # Each member is hashed once per read: prefetch checked it and keeps the bytes until here.
        return self._verified.pop(path, None)

    def prefetch(self, paths: Iterable[str]) -> None:
        missing = [p for p in dict.fromkeys(paths) if p not in self._verified and not self._cached_ok(p)]
        if not missing:
            return
        if self.sparse and not self._exists(self._full_file()):
            try:
                self._fetch_sparse(missing)
                return
            except http.RangeNotSupported:
                self.sparse = False
        self._fetch_from_full(missing)

    @property
    def unhashed(self) -> bool:
        """The index publishes no sha256 for this artifact: RECORD is what vouches for its files."""
        return self.artifact.sha256 is None

    @property
    def verified(self) -> bool:
        """Whether every file this source served came from a whole artifact checked against the
        index's sha256 (False: as the index served them, each checked against the wheel's RECORD)."""
        return not self.unhashed and not self._as_served

    def provenance(self) -> Provenance:
        details = dict(self.details)
        sha256 = self.artifact.sha256
        if self.unhashed:
            sha256 = self._read_text(self._fetched_digest_file())  # of the whole wheel, when it was downloaded
            details.update(index_sha256=None, verified_by="RECORD", record_sha256=self._read_text(self.dir / "record.sha256"))
        if self.reason:
            details["why"] = self.reason
        details["read"] = "+".join(sorted(self._how)) or "cache"  # "ranges", "whole", "ranges+whole"
        details["verified"] = self.verified
        if self._refetched:
            details["refetched"] = list(self._refetched)
        return Provenance(self.artifact.kind, self.artifact.filename, sha256, self.bytes_fetched, tuple(details.items()))

    # cache ------------------------------------------------------------------------------------
    def _member_file(self, path: str, verified: bool = False) -> Path:
        folder = self.verified_dir if verified and self.verified_dir is not None else self.dir
        return folder / "members" / member_key(path)

    def _absent_file(self, path: str, verified: bool = False) -> Path:
        return self._member_file(path, verified).with_suffix(".absent")

    def _full_file(self) -> Path:
        return (self.verified_dir or self.dir) / "artifact"

    def _fetched_digest_file(self) -> Path:
        return self.dir / "artifact.sha256"

    def _verified_file(self) -> Path:
        return (self.verified_dir or self.dir) / "artifact.verified"

    def _names_file(self) -> Path:
        return (self.verified_dir or self.dir) / "names.json"

    def _damaged(self, exc: Damaged) -> None:
        """A cache file that is not what patchctl wrote there: removed (never followed) and read again;
        offline, an error that says how to refresh it."""
        if self.offline:
            raise EnvironmentProblem(f"{exc}; run once without --offline to refresh it") from None
        self.cache.remove(exc.path)

    def _read(self, path: Path) -> bytes | None:
        try:
            return self.cache.read_file(path)
        except Damaged as exc:
            self._damaged(exc)
            return None

    def _exists(self, path: Path) -> bool:
        try:
            return self.cache.exists(path)
        except Damaged as exc:
            self._damaged(exc)
            return False

    def _read_text(self, path: Path) -> str | None:
        try:
            return (self._read(path) or b"").decode().strip() or None
        except UnicodeDecodeError:
            return None

    def _cached_ok(self, path: str) -> bool:
        """Whether the cache holds the member (or knows it is absent), proven by the wheel's RECORD
        kept in the same folder (`proof`), never by the sha256 the member's file starts with (that
        only tells damage). An sdist has no RECORD: its cached members count only when this user (or
        root) wrote them and no one else may write them. The bytes wait in _verified for read().
        Members taken from a verified whole artifact first; then what range reads of this URL gave."""
        for verified in (True,) if self.verify else (True, False) if self.verified_dir is not None else (False,):
            member = self._member_file(path, verified)
            absent = self._absent_file(path, verified)
            raw, ours = self._read_owned(absent)
            found = raw is not None
            data = None
            if not found:
                raw, ours = self._read_owned(member)
                data = unframe(raw)
                if data is None:
                    if raw is not None:
                        self.cache.remove(member)  # damaged: fetch again
                    continue
            if self.artifact.kind == "wheel":
                record = self._proven_record(member.parent.parent)
                if record is None:
                    continue  # nothing proven to check it against: read again, RECORD with it
                wrong = proof.problem(record, self._archive_name(path), data)
            else:
                wrong = None if ours else proof.UNPROVABLE
            if wrong is None:
                self._verified[path] = data
                self._as_served = self._as_served or not verified
                return True
            if wrong != proof.UNPROVABLE:
                self._distrust(absent if found else member, wrong)
        return False

    def _read_owned(self, path: Path) -> tuple[bytes | None, bool]:
        try:
            return self.cache.read_owned(path)
        except Damaged as exc:
            self._damaged(exc)
            return None, False

    def _proven_record(self, folder: Path) -> proof.Record | None:
        if folder not in self._proven:
            try:
                self._proven[folder] = proof.read(self.cache, folder)
            except Damaged as exc:
                self._damaged(exc)
                self._proven[folder] = None
        return self._proven[folder]

    def _distrust(self, path: Path, why: str) -> None:
        """A cache file whose bytes RECORD disproves (edited in place, planted): never served. Online
        it is removed and read again, and the document says so; offline, an error naming it."""
        if self.offline:
            raise EnvironmentProblem(
                f"cache file {path} {why}: it was changed after patchctl wrote it",
                hint="run once without --offline to read it again",
            )
        self.cache.remove(path)
        self._refetched.append(f"cache file {path} {why}: read again")

    def _store(self, path: str, data: bytes | None, *, verified: bool) -> None:
        self._verified[path] = data
        self._as_served = self._as_served or not verified
        if data is None:
            self.cache.write(self._absent_file(path, verified), b"")
            return
        # Its sha256 first (damage), and RECORD beside it (proof), which every read checks
        # (_cached_ok): so not fsynced (two fsyncs, ~16 ms here, per member, and the matrix writes a
        # few hundred).
        self.cache.write(self._member_file(path, verified), framed(data))

    def _archive_name(self, path: str) -> str:
        return self.engine.layout_prefix(self.artifact.kind) + path

    def _need_network(self, what: str) -> None:
        if self.offline:
            raise NetworkError(
                f"offline, and the cache lacks {what} of {self.artifact.filename}",
                hint="run once with the network to fill the cache",
            )

    # sparse wheel reads ----------------------------------------------------------------------
    def _central_directory(self) -> dict[str, ZipEntry]:
        if self._entries is not None:
            return self._entries
        cd_file = self.dir / CENTRAL_DIRECTORY_FILE
        cached = self._cached_central_directory(cd_file)
        if cached is not None:
            self._entries = cached
            return cached
        self._need_network("the wheel's file list")
        project = canonicalize_name(self.engine.dist)
        measured = tail_estimate(self.cache_root, project, self.artifact.version)
        # The members come next, on other connections: open them while the tail is on its way.
        http.warm(self.artifact.url, self._warm_connections)
        entries, cd, need = self._wheel.central_directory(measured)
        # Kept as the zip's own bytes (parsed again on a warm read as fast as JSON would load, and
        # a tenth of the CPU to write): the matrix caches ~180k entries cold.
        self.cache.write(cd_file, framed(cd))
        record_tail(self.cache_root, project, self.artifact.version, need)
        self._entries = entries
        return entries

    _warm_connections = 0  # _fetch_sparse: one per member to fetch, up to the pool

    def _cached_central_directory(self, cd_file: Path) -> dict[str, ZipEntry] | None:
        """The cached file list, or None when there is none. A damaged one is deleted when the network
        can read the list again; offline, it is an error that says how to refresh it."""
        raw = self._read(cd_file)
        if raw is None:
            return None
        cd = unframe(raw)
        wrong = "its bytes do not match the sha256 it starts with"
        if cd is not None:
            try:
                entries = zipread.parse_central_directory(cd)
                if entries or not cd:
                    return entries
                wrong = "not a central directory"
            except (zipread.ZipFormatError, struct.error, UnicodeDecodeError) as exc:
                wrong = f"not a central directory ({exc})"
        if self.offline:
            raise EnvironmentProblem(f"cache file {cd_file} is damaged; run once without --offline to refresh it ({wrong})")
        self.cache.remove(cd_file)
        return None

    def _count(self, n: int) -> None:
        with self._lock:  # members are fetched from several threads
            self._how.add("ranges")
            self.bytes_fetched += n
            self.progress.advance(n)

    def _record_hashes(self) -> dict[str, str]:
        if self._record is not None:
            return self._record
        kept = None if self.unhashed else self._proven_record(self.dir)
        if kept is not None:  # RECORD as this URL's range reads gave it before (no round trip)
            self._record = kept.hashes
            return kept.hashes
        entries = self._central_directory()
        record_name = zipread.record_name(entries)
        hashes: dict[str, str] = {}
        if record_name:
            hashes = self._parse_record(record_name, self._wheel.member(entries[record_name]), self.dir)
        elif self.unhashed:
            raise NetworkError(
                f"{self.artifact.filename}: the index publishes no sha256 and the wheel has "
                "no RECORD: nothing vouches for its files"
            )
        self._record = hashes
        return hashes

    def _parse_record(self, record_name: str, raw: bytes, folder: Path) -> dict[str, str]:
        """RECORD's hashes; its bytes are kept in `folder` (where the members it proves go)."""
        if self.unhashed:
            self.cache.write(self.dir / "record.sha256", hashlib.sha256(raw).hexdigest().encode(), durable=True)
        try:
            record = proof.parse(raw)
        except (ValueError, csv.Error) as exc:  # not UTF-8, a sha256 that is not base64, a NUL byte
            raise NetworkError(f"{self.artifact.filename}: {record_name} is malformed ({exc})") from None
        proof.write(self.cache, folder, raw)
        self._proven[folder] = record
        return record.hashes

    def _check_record(self, name: str, data: bytes, record: dict[str, str]) -> None:
        """A wheel member against the sha256 its RECORD lists (members RECORD does not hash: none)."""
        self._check_digest(name, hashlib.sha256(data).hexdigest(), record)

    def _check_digest(self, name: str, digest: str, record: dict[str, str]) -> None:
        expected = record.get(name)
        if not expected and self.unhashed:
            raise NetworkError(
                f"{self.artifact.filename}: {name} has no sha256 in RECORD, and the index "
                "publishes none for the wheel: nothing vouches for it"
            )
        if expected and digest != expected:
            raise NetworkError(f"{self.artifact.filename}: {name} does not match the sha256 in RECORD")

    def _fetch_sparse(self, paths: list[str]) -> None:
        self._need_network("files")
        self.progress.start(f"{self.artifact.filename} (sparse)", None)
        try:
            self._warm_connections = min(FETCH_THREADS, len(paths) + 1) - 1
            entries = self._central_directory()
            wanted = {path: entries.get(self._archive_name(path)) for path in paths}
            # RECORD and the members in parallel: each is one round trip, and they are independent.
            with ThreadPoolExecutor(max_workers=FETCH_THREADS) as pool:
                record_future = pool.submit(self._record_hashes)
                futures = {path: pool.submit(self._wheel.member, entry) for path, entry in wanted.items() if entry is not None}
                record = record_future.result()
                for path, entry in wanted.items():
                    if entry is None:
                        self._store(path, None, verified=False)
                        continue
                    data = futures[path].result()
                    self._check_record(entry.name, data, record)
                    self._store(path, data, verified=False)
        finally:
            self.progress.finish()

    def _path_of(self, name: str) -> str | None:
        """An archive member's path relative to the import root (None: outside it)."""
        if self.artifact.kind == "wheel" or self._zip_artifact:
            layout = self.engine.layout_prefix(self.artifact.kind)
            return name[len(layout) :] if name.startswith(layout) else None
        return self.engine.sdist_member_path(name)

    _zip_artifact = False  # an sdist that is a zip: members named as a wheel's

    def _fetch_from_full(self, paths: list[str]) -> None:
        with self.open_artifact() as f, archive.errors_named(self.artifact.filename):
            self._zip_artifact = archive.is_zip(f)
            found = archive.read(f, self._path_of, set(paths))
            if self.artifact.kind == "wheel":
                # The same check as a sparse read: each member against the wheel's RECORD.
                record = self._zip_record(f)
                for path, data in found.items():
                    self._check_record(self._archive_name(path), data, record)
        for path in paths:
            self._store(path, found.get(path), verified=not self.unhashed)

    def files_under(self, prefix: str) -> list[str]:
        """Paths (relative to the import root) below a directory: used to relocate moved code. A whole
        artifact's list is read once and kept (names.json in the cache): a warm rebase does not gunzip
        vLLM's 36 MB sdist again to list it."""
        return [p for p in self.names() if p.startswith(prefix)]

    def names(self) -> list[str]:
        """Every file of the artifact, relative to the import root (members outside it left out)."""
        if self.sparse:
            layout = self.engine.layout_prefix(self.artifact.kind)
            self._as_served = True
            return [n[len(layout) :] for n in self._central_directory() if n.startswith(layout) and not n.endswith("/")]
        try:
            raw, ours = self.cache.read_owned(self._names_file())
        except Damaged as exc:
            self._damaged(exc)
            raw, ours = None, False
        try:  # a list another user may have written is made again from the (proven) artifact
            cached = load_json(raw or b"null") if ours else None
        except (ValueError, RecursionError):
            cached = None
        if isinstance(cached, list) and all(isinstance(n, str) for n in cached):
            return cached
        with self.open_artifact() as f, archive.errors_named(self.artifact.filename):
            self._zip_artifact = archive.is_zip(f)
            names = [p for p in (self._path_of(m.name) for m in archive.members(f)) if p]
        self.cache.write(self._names_file(), json.dumps(names).encode())  # checked on read
        return names

    def extract(self, prefixes: tuple[str, ...], dest: Path) -> list[str]:
        """Stream the members below `prefixes` from the whole artifact into dest, keeping their file
        modes (exec bits), each wheel member checked against RECORD as it is written; nothing is kept
        in memory or copied into the member cache (the artifact is the one cached copy). Returns
        the paths written, relative to the import root."""
        with self.open_artifact() as f, archive.errors_named(self.artifact.filename):
            self._zip_artifact = archive.is_zip(f)
            record = self._zip_record(f) if self.artifact.kind == "wheel" else None

            def path_of(name: str) -> str | None:
                rel = self._path_of(name)
                return rel if rel and rel.startswith(prefixes) else None

            written = archive.extract(f, dest, path_of)
            if record is not None:
                for _rel, name, digest in written:
                    self._check_digest(name, digest, record)
        self._as_served = self._as_served or self.unhashed
        return [rel for rel, _name, _digest in written]

    def _zip_record(self, f: BinaryIO) -> dict[str, str]:
        names = [m.name for m in archive.members(f)]
        record_name = zipread.record_name(names)
        if record_name is None and self.unhashed:
            raise NetworkError(
                f"{self.artifact.filename}: the index publishes no sha256 and "
                "the wheel has no RECORD: nothing vouches for its files"
            )
        if not record_name:
            return {}
        folder = self.dir if self.unhashed or self.verified_dir is None else self.verified_dir
        return self._parse_record(record_name, archive.read(f, lambda n: n, {record_name})[record_name], folder)
