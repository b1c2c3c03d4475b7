"""Pristine files of one released version, read from the package index.

Wheels are zip files: the central directory and just the members a patch needs are fetched with
HTTP range reads, each member checked against its CRC-32 and the sha256 the wheel's RECORD lists.
Without a usable wheel (or a server that ignores Range) the whole artifact is downloaded, checked
against the index's sha256, and the needed members are taken from it (a wheel's, again checked against
its RECORD). Cached file lists that do not parse are read again, or refused offline.

An index that publishes no hash (vLLM's nightly wheel repository) is accepted for wheels only: every
member read must then be listed in the wheel's RECORD and match it (and its CRC-32), the sha256 of a
downloaded artifact is recorded, and the document's `source` says `"index_sha256": null,
"verified_by": "RECORD"`. An sdist has no RECORD, so without the index's sha256 it is refused.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import struct
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from packaging.utils import canonicalize_name

from patchctl.atomic import read_verified, write_atomic, write_verified
from patchctl.engines import Engine
from patchctl.errors import EnvironmentProblem, NetworkError, UsageError
from patchctl.sources import http, zipread
from patchctl.sources.files import NoProgress, ProgressSink, Provenance, resolve_inside
from patchctl.sources.index import IndexFile, IndexProject
from patchctl.sources.zipread import ZipEntry, tail_guess

FETCH_THREADS = 8
VERIFY_MARK_BYTES = 8 << 20


# A round trip, in bytes it could have carried instead: 20 ms at ~12 MB/s. Range reads take two more
# than one whole GET (the tail, then the members), and start more connections.
ROUND_TRIP_BYTES = 256 << 10
MEMBERS_GUESS = 64 << 10  # what a series' members take deflated (vLLM 0.23.0's: ~70 KB)


class ArtifactChoice(NamedTuple):
    file: IndexFile
    whole: bool  # fetched in one GET (False: range reads of a wheel)
    reason: str  # for the document: why this artifact, and how it is read


def choose_artifact(project: IndexProject, version, prefer_sdist: bool = False) -> IndexFile:
    return choose(project, version, prefer_sdist=prefer_sdist).file


def choose(project: IndexProject, version, *, prefer_sdist: bool = False, cache_root: Path | None = None,
           installable: bool = False, offline: bool = False) -> ArtifactChoice:
    """The artifact that costs the fewest bytes (round trips counted as bytes) for what is wanted.
    A few files (check, apply): a big wheel by range reads, or a small sdist or wheel in one GET when
    that is cheaper (vllm-gguf-plugin: a 115 KB sdist against a 6.4 MB wheel's ~80 KB of ranges and
    two more round trips). A whole tree (prefer_sdist): the sdist (vLLM's is 36 MB against a 274 MB
    wheel, with the same Python sources). `installable`: a wheel (compiled parts included), whole."""
    candidates = project.files_for(version)
    # A wheel without an index hash is still verifiable (its RECORD); an sdist is not.
    files = [f for f in candidates if f.sha256 or f.kind == "wheel"]
    if not files:
        known = project.versions(include_pre=True)
        near = ", ".join(str(v) for v in known[-5:]) or "none"
        unusable = ("; it lists only sdists without a sha256, which patchctl cannot verify (no RECORD): "
                    + ", ".join(f.filename for f in candidates)) if candidates else ""
        raise UsageError(
            f"{project.name} {version} is not on the package index {project.index_url} "
            f"(newest there: {near}){unusable}"
        )

    def rank(f: IndexFile):
        hashed = 0 if f.sha256 else 1  # (releases: every file is hashed, so the order is as before)
        if prefer_sdist and f.kind == "sdist":
            return (hashed, -1, 0, f.size or 0)
        if f.kind == "wheel":
            pure = "none-any" in f.tags
            x86 = "x86_64" in f.tags
            return (hashed, 0, 0 if pure else (1 if x86 else 2), f.size or 0)
        return (hashed, 1, 0, f.size or 0)

    ranked = sorted(files, key=rank)
    first = ranked[0]
    if prefer_sdist:
        return ArtifactChoice(first, True, f"{first.kind}, whole: a whole tree is wanted")
    if installable or first.kind != "wheel":
        why = "the installable artifact" if installable and first.kind == "wheel" else "no usable wheel"
        return ArtifactChoice(first, True, f"{first.kind}, whole: {why}")
    # Offline, what an earlier run read is what there is. Online the choice must not depend on this
    # machine's cache: the matrix records the artifact, and another machine must read the same one.
    if cache_root is not None and offline:
        for f in (first, *(f for f in ranked if f.kind == "sdist")):
            folder = cache_root / "artifacts" / str(f.sha256)
            if f.sha256 and (folder / "artifact").is_file():
                return ArtifactChoice(f, True, f"{f.kind}, whole: already in the cache")
            if f is first and f.sha256 and (folder / CENTRAL_DIRECTORY_FILE).is_file():
                return ArtifactChoice(f, False, "wheel by range reads: its file list is already in the cache")
    measured = tail_estimate(cache_root, project.name, version) if cache_root else None
    ranges = (min(first.size, tail_guess(first.size, measured)) + MEMBERS_GUESS + 2 * ROUND_TRIP_BYTES
              if first.size else None)
    options = [(f.size, f) for f in ranked if f.size and f.sha256 and (f.kind == "sdist" or f is first)]
    cheapest = min(options, key=lambda o: o[0], default=None)
    if ranges is None or (cheapest is not None and cheapest[0] <= ranges):
        if cheapest is None:
            return ArtifactChoice(first, False, "wheel by range reads: the index gives no size to compare")
        size, f = cheapest
        return ArtifactChoice(f, True, f"{f.kind}, whole: {_mb(size)} in one request costs less than range "
                              f"reads of {first.filename} (~{_mb(ranges)} counting round trips)")
    others = [f"{f.kind} {_mb(size)}" for size, f in options if f is not first]
    return ArtifactChoice(first, False, f"wheel by range reads: ~{_mb(ranges)} counting round trips"
                          + (f", against {', '.join(others)} whole" if others else "")
                          + f" ({_mb(first.size)} wheel)")


def _mb(n: int | None) -> str:
    return "? MB" if n is None else (f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} KB")


def tail_estimate(cache_root: Path, project: str, version) -> int | None:
    """The tail a wheel of `project` needed last (the release nearest below `version`, else above):
    kept in <cache>/tails/<project>.json by every central directory read."""
    needs = _read_tails(cache_root, project)
    if not needs:
        return None
    below = [(v, n) for v, n in needs.items() if v <= version]
    if below:
        return max(below)[1]
    return min(needs.items())[1]


def _tails_file(cache_root: Path, project: str) -> Path:
    return cache_root / "tails" / f"{project}.json"


def _read_tails(cache_root: Path, project: str) -> dict:
    from packaging.version import InvalidVersion, Version

    try:
        raw = json.loads(_tails_file(cache_root, project).read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    out = {}
    if isinstance(raw, dict):  # an estimate only: anything that is not {version: int} is ignored
        for key, need in raw.items():
            try:
                if isinstance(need, int) and need > 0:
                    out[Version(key)] = need
            except InvalidVersion:
                continue
    return out


_tails_lock = threading.Lock()  # the matrix reads several releases of a project at once


def _record_tail(cache_root: Path, project: str, version, need: int) -> None:
    with _tails_lock:
        needs = {str(v): n for v, n in _read_tails(cache_root, project).items()}
        if needs.get(str(version)) != need:
            needs[str(version)] = need
            write_atomic(_tails_file(cache_root, project), json.dumps(needs, sort_keys=True).encode(), durable=False)


class ReleaseSource:
    """FileSource over one artifact of a release; member paths are relative to the import root."""

    def __init__(self, engine: Engine, artifact: IndexFile, cache_root: Path, *,
                 offline: bool = False, progress: ProgressSink | None = None, sparse: bool = True,
                 details: dict | None = None, whole: bool = False, reason: str | None = None):
        if artifact.sha256 is None and artifact.kind != "wheel":
            raise UsageError(f"{artifact.filename}: the index publishes no sha256 for it, and an sdist "
                             "has no RECORD to check its files against")
        self.engine = engine
        self.artifact = artifact
        # Without an index hash the cache is keyed by the URL (a nightly's URL names its commit).
        key = artifact.sha256 or "url-" + hashlib.sha256(artifact.url.encode()).hexdigest()
        self.dir = cache_root / "artifacts" / key
        self.details = dict(details or {})
        self.offline = offline
        self.progress = progress or NoProgress()
        self.cache_root = cache_root
        self.reason = reason
        self.sparse = sparse and artifact.kind == "wheel" and not whole
        self.bytes_fetched = 0
        self._how: set[str] = set()  # "ranges", "whole": how this run read the artifact
        self._verified: dict[str, bytes | None] = {}  # members checked by prefetch, until read() takes them
        self._artifact_ok = False
        self._entries: dict[str, ZipEntry] | None = None
        self._record: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._tail: tuple[int, bytes] | None = None

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
        if self.sparse and not self._full_file().is_file():
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

    def provenance(self) -> Provenance:
        details = dict(self.details)
        sha256 = self.artifact.sha256
        if self.unhashed:
            sha256 = _read_text(self._fetched_digest_file())  # of the whole wheel, when it was downloaded
            details.update(index_sha256=None, verified_by="RECORD",
                           record_sha256=_read_text(self.dir / "record.sha256"))
        if self.reason:
            details["why"] = self.reason
        details["read"] = "+".join(sorted(self._how)) or "cache"  # "ranges", "whole", "ranges+whole"
        return Provenance(self.artifact.kind, self.artifact.filename, sha256, self.bytes_fetched,
                          tuple(details.items()))

    # cache ------------------------------------------------------------------------------------
    def _member_file(self, path: str) -> Path:
        return self.dir / "members" / hashlib.sha256(path.encode()).hexdigest()[:32]

    def _absent_file(self, path: str) -> Path:
        return self._member_file(path).with_suffix(".absent")

    def _full_file(self) -> Path:
        return self.dir / "artifact"

    def _fetched_digest_file(self) -> Path:
        return self.dir / "artifact.sha256"

    def _cached_ok(self, path: str) -> bool:
        """Whether the cache holds the member (or knows it is absent); its bytes, checked against
        the sha256 the file starts with, wait in _verified for read()."""
        member = self._member_file(path)
        if self._absent_file(path).is_file():
            self._verified[path] = None
            return True
        data = read_verified(member)
        if data is not None:
            self._verified[path] = data
            return True
        member.unlink(missing_ok=True)  # corrupt (or an older cache's layout): fetch again
        return False

    def _store(self, path: str, data: bytes | None) -> None:
        self._verified[path] = data
        if data is None:
            write_atomic(self._absent_file(path), b"", durable=False)
            return
        # Its sha256 first, which every read checks (_cached_ok): so not fsynced (two fsyncs, ~16 ms
        # here, per member, and the matrix writes a few hundred).
        write_verified(self._member_file(path), data)

    def _archive_name(self, path: str) -> str:
        return self.engine.layout_prefix(self.artifact.kind) + path

    def _need_network(self, what: str) -> None:
        if self.offline:
            raise NetworkError(f"offline, and the cache lacks {what} of {self.artifact.filename}",
                               hint="run once with the network to fill the cache")

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
        tail_start, size = self._read_tail(measured)
        entries, where, cd = self._parse_tail(tail_start)
        # Kept as the zip's own bytes (parsed again on a warm read as fast as JSON would load, and
        # a tenth of the CPU to write): the matrix caches ~180k entries cold.
        write_verified(cd_file, cd)
        (self.dir / "central-directory.json").unlink(missing_ok=True)  # an older patchctl's form of it
        _record_tail(self.cache_root, project, self.artifact.version, zipread.tail_need(size, entries, where.offset))
        self._entries = entries
        return entries

    def _parse_tail(self, tail_start: int) -> tuple[dict[str, ZipEntry], zipread.CentralDirectoryLocation, bytes]:
        """The central directory (its entries, where it is, its bytes) from the tail read, with one
        more read when the tail fell short."""
        tail = self._tail[1] if self._tail else b""
        with self._zip_errors():
            where = zipread.locate_central_directory(tail, tail_start)
            if where.zip64_record is not None:
                where = zipread.zip64_location(self._range(where.zip64_record, where.zip64_record + 55))
            missing = zipread.missing_span(where, tail_start)
            if missing is not None:  # the estimate fell short: the rest (and RECORD) in one more read
                more = self._range(*missing)
                self._tail = (missing[0], more + tail)
                tail_start, tail = self._tail
            cd = tail[where.offset - tail_start : where.offset - tail_start + where.size]
            return zipread.parse_central_directory(cd), where, cd

    _warm_connections = 0  # _fetch_sparse: one per member to fetch, up to the pool

    def _read_tail(self, measured: int | None) -> tuple[int, int]:
        """The first read: the tail sized by the project's last measured need (else a default that
        holds every release measured). Returns (where the tail starts, the file's size)."""
        if self.artifact.size:
            size = self.artifact.size
            tail_start = max(0, size - tail_guess(size, measured))
            self._tail = (tail_start, self._range(tail_start, size - 1))
            return tail_start, size
        # No size on the index: a suffix range answers with the size, instead of a HEAD first.
        guess = int(measured * zipread.TAIL_GROWTH) + zipread.TAIL_SLACK if measured else zipread.TAIL_DEFAULT
        size, data = http.get_suffix(self.artifact.url, max(zipread.TAIL_MIN, guess), what=self.artifact.filename)
        self._count(len(data))
        self._tail = (size - len(data), data)
        return size - len(data), size

    def _cached_central_directory(self, cd_file: Path) -> dict[str, ZipEntry] | None:
        """The cached file list, or None when there is none. A damaged one is deleted when the network
        can read the list again; offline, it is an error that says how to refresh it."""
        if not cd_file.is_file():
            return None
        cd = read_verified(cd_file)
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
            raise EnvironmentProblem(f"cache file {cd_file} is damaged; run once without --offline "
                                     f"to refresh it ({wrong})")
        cd_file.unlink(missing_ok=True)
        return None

    def _range(self, start: int, end: int) -> bytes:
        if self._tail and self._tail[0] <= start and end < self._tail[0] + len(self._tail[1]):
            # Already read with the central directory (RECORD is usually the last member).
            offset = start - self._tail[0]
            return self._tail[1][offset : offset + end - start + 1]
        data = http.get_range(self.artifact.url, start, end, what=self.artifact.filename)
        self._count(len(data))
        return data

    def _count(self, n: int) -> None:
        with self._lock:  # members are fetched from several threads
            self._how.add("ranges")
            self.bytes_fetched += n
            self.progress.advance(n)

    def _record_hashes(self) -> dict[str, str]:
        if self._record is not None:
            return self._record
        entries = self._central_directory()
        record_name = zipread.record_name(entries)
        hashes: dict[str, str] = {}
        if record_name:
            hashes = self._parse_record(record_name, self._read_member(entries[record_name]))
        elif self.unhashed:
            raise NetworkError(f"{self.artifact.filename}: the index publishes no sha256 and the wheel has "
                               "no RECORD: nothing vouches for its files")
        self._record = hashes
        return hashes

    def _parse_record(self, record_name: str, raw: bytes) -> dict[str, str]:
        if self.unhashed:
            write_atomic(self.dir / "record.sha256", hashlib.sha256(raw).hexdigest().encode())
        try:
            return zipread.record_hashes(raw)
        except (ValueError, csv.Error) as exc:  # not UTF-8, a sha256 that is not base64, a NUL byte
            raise NetworkError(f"{self.artifact.filename}: {record_name} is malformed ({exc})") from None

    def _check_record(self, name: str, data: bytes, record: dict[str, str]) -> None:
        """A wheel member against the sha256 its RECORD lists (members RECORD does not hash: none)."""
        expected = record.get(name)
        if not expected and self.unhashed:
            raise NetworkError(f"{self.artifact.filename}: {name} has no sha256 in RECORD, and the index "
                               "publishes none for the wheel: nothing vouches for it")
        if expected and hashlib.sha256(data).hexdigest() != expected:
            raise NetworkError(f"{self.artifact.filename}: {name} does not match the sha256 in RECORD")

    def _read_member(self, entry: ZipEntry) -> bytes:
        with self._zip_errors():
            head = self._range(*zipread.local_header_span(entry, self.artifact.size))
            start = zipread.payload_start(head, entry)
            payload = head[start : start + entry.compressed_size]
            if len(payload) < entry.compressed_size:
                payload += self._range(entry.header_offset + start + len(payload),
                                       entry.header_offset + start + entry.compressed_size - 1)
            return zipread.inflate(entry, payload)

    @contextmanager
    def _zip_errors(self) -> Iterator[None]:
        """A malformed zip is the artifact's fault (truncated, tampered): said with its name."""
        try:
            yield
        except (zipread.ZipFormatError, struct.error, UnicodeDecodeError) as exc:  # a record cut short, a name not UTF-8
            raise NetworkError(f"{self.artifact.filename}: {exc}") from None

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
                futures = {path: pool.submit(self._read_member, entry)
                           for path, entry in wanted.items() if entry is not None}
                record = record_future.result()
                for path, entry in wanted.items():
                    if entry is None:
                        self._store(path, None)
                        continue
                    data = futures[path].result()
                    self._check_record(entry.name, data, record)
                    self._store(path, data)
        finally:
            self.progress.finish()

    # whole artifact --------------------------------------------------------------------------
    def download_full(self) -> Path:
        target = self._full_file()
        expected = self.artifact.sha256 or _read_text(self._fetched_digest_file())
        if self._artifact_ok and target.is_file():
            return target
        if target.is_file():
            # Hashed once when it was written; read again only when its size or mtime moved since.
            if expected and (_read_text(self._verified_file()) == _stat_key(target, expected)
                             or _sha256_file(target) == expected):
                self._mark_verified(target, expected)
                return target
            target.unlink()  # corrupt: fetch again
        self._need_network("the artifact")
        response = http.get(self.artifact.url, stream=True, what=self.artifact.filename)
        if response.status_code != 200:
            raise NetworkError(f"{self.artifact.filename}: HTTP {response.status_code}")
        total = int(response.headers.get("Content-Length") or self.artifact.size or 0) or None
        self.progress.start(self.artifact.filename, total)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".artifact.{os.getpid()}.part")
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as out:
                for chunk in response.iter_content(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    self.bytes_fetched += len(chunk)
                    self.progress.advance(len(chunk))
            self._how.add("whole")
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            raise NetworkError(f"download of {self.artifact.filename} broke off: {exc}") from None
        finally:
            self.progress.finish()
        if self.artifact.sha256 is None:
            # Nothing to compare with: RECORD checks the members read from it; the digest is recorded.
            write_atomic(self._fetched_digest_file(), digest.hexdigest().encode())
        elif digest.hexdigest() != self.artifact.sha256:
            tmp.unlink(missing_ok=True)
            raise NetworkError(
                f"{self.artifact.filename}: sha256 {digest.hexdigest()} does not match "
                f"the index's {self.artifact.sha256}"
            )
        os.replace(tmp, target)
        self._mark_verified(target, digest.hexdigest())
        return target

    def _verified_file(self) -> Path:
        return self.dir / "artifact.verified"

    def _mark_verified(self, target: Path, sha256: str) -> None:
        self._artifact_ok = True
        key = _stat_key(target, sha256)
        # Only where hashing again costs more than the write (two fsyncs, ~16 ms here): ~8 MB.
        if target.stat().st_size >= VERIFY_MARK_BYTES and _read_text(self._verified_file()) != key:
            write_atomic(self._verified_file(), key.encode())

    def _fetch_from_full(self, paths: list[str]) -> None:
        archive = self.download_full()
        wanted = {self._archive_name(p): p for p in paths}
        found: dict[str, bytes] = {}
        try:
            if self.artifact.kind == "wheel" or _starts_with(archive, b"PK"):
                with zipfile.ZipFile(archive) as zf:
                    for name in zf.namelist():
                        if name in wanted:
                            found[wanted[name]] = zf.read(name)
                    if self.artifact.kind == "wheel":
                        # The same check as a sparse read: each member against the wheel's RECORD.
                        record = self._zip_record(zf)
                        for name, path in wanted.items():
                            if path in found:
                                self._check_record(name, found[path], record)
            else:
                with tarfile.open(archive) as tf:
                    for member in tf:
                        path = self.engine.sdist_member_path(member.name) if member.isfile() else None
                        if path in wanted and wanted[path] not in found:
                            found[wanted[path]] = tf.extractfile(member).read()
        except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, NotImplementedError) as exc:
            raise NetworkError(f"{self.artifact.filename}: {exc}") from None
        for path in paths:
            self._store(path, found.get(path))

    def files_under(self, prefix: str) -> list[str]:
        """Paths (relative to the import root) below a directory: used to relocate moved code. A whole
        artifact's list is read once and kept (<cache>/artifacts/<sha256>/names.json): a warm rebase
        does not gunzip vLLM's 36 MB sdist again to list it."""
        return [p for p in self.names() if p.startswith(prefix)]

    def names(self) -> list[str]:
        """Every file of the artifact, relative to the import root (members outside it left out)."""
        if self.sparse:
            layout = self.engine.layout_prefix(self.artifact.kind)
            return [n[len(layout):] for n in self._central_directory()
                    if n.startswith(layout) and not n.endswith("/")]
        names_file = self.dir / "names.json"
        try:
            cached = json.loads(names_file.read_bytes())
        except (OSError, ValueError, RecursionError):
            cached = None
        if isinstance(cached, list) and all(isinstance(n, str) for n in cached):
            return cached
        archive = self.download_full()
        with self._archive_errors():
            if self.artifact.kind == "wheel" or _starts_with(archive, b"PK"):
                layout = self.engine.layout_prefix(self.artifact.kind)
                with zipfile.ZipFile(archive) as zf:
                    names = [n[len(layout):] for n in zf.namelist() if n.startswith(layout) and not n.endswith("/")]
            else:
                with tarfile.open(archive) as tf:
                    names = [p for p in (self.engine.sdist_member_path(m.name) for m in tf if m.isfile()) if p]
        write_atomic(names_file, json.dumps(names).encode(), durable=False)  # checked on read
        return names

    def extract(self, prefixes: tuple[str, ...], dest: Path) -> list[str]:
        """Stream the members below `prefixes` from the whole artifact into dest, keeping their file
        modes (exec bits), each wheel member checked against RECORD as it is written; nothing is kept
        in memory or copied into the member cache (the artifact is the one cached copy). Returns
        the paths written, relative to the import root."""
        archive = self.download_full()
        written: list[str] = []
        with self._archive_errors():
            if self.artifact.kind == "wheel" or _starts_with(archive, b"PK"):
                layout = self.engine.layout_prefix(self.artifact.kind)
                with zipfile.ZipFile(archive) as zf:
                    record = self._zip_record(zf) if self.artifact.kind == "wheel" else None
                    for info in zf.infolist():
                        rel = info.filename[len(layout):] if info.filename.startswith(layout) else None
                        if not rel or not rel.startswith(prefixes) or info.is_dir():
                            continue
                        with zf.open(info) as src:
                            digest = _stream_to(src, resolve_inside(dest, rel), (info.external_attr >> 16) & 0o777)
                        if record is not None:
                            self._check_digest(info.filename, digest, record)
                        written.append(rel)
            else:
                with tarfile.open(archive) as tf:
                    for member in tf:
                        rel = self.engine.sdist_member_path(member.name) if member.isfile() else None
                        if not rel or not rel.startswith(prefixes):
                            continue
                        src = tf.extractfile(member)
                        assert src is not None  # a regular file
                        with src:
                            _stream_to(src, resolve_inside(dest, rel), member.mode & 0o777)
                        written.append(rel)
        return written

    def _zip_record(self, zf: zipfile.ZipFile) -> dict[str, str]:
        record_name = zipread.record_name(zf.namelist())
        if record_name is None and self.unhashed:
            raise NetworkError(f"{self.artifact.filename}: the index publishes no sha256 and "
                               "the wheel has no RECORD: nothing vouches for its files")
        return self._parse_record(record_name, zf.read(record_name)) if record_name else {}

    def _check_digest(self, name: str, digest: str, record: dict[str, str]) -> None:
        expected = record.get(name)
        if not expected and self.unhashed:
            raise NetworkError(f"{self.artifact.filename}: {name} has no sha256 in RECORD, and the index "
                               "publishes none for the wheel: nothing vouches for it")
        if expected and digest != expected:
            raise NetworkError(f"{self.artifact.filename}: {name} does not match the sha256 in RECORD")

    @contextmanager
    def _archive_errors(self) -> Iterator[None]:
        try:
            yield
        except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, NotImplementedError) as exc:
            raise NetworkError(f"{self.artifact.filename}: {exc}") from None


def _stream_to(src, path: Path, mode: int) -> str:
    """Copy a member to path in 1 MB pieces, returning its sha256; the mode's permission bits kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            out.write(chunk)
            digest.update(chunk)
    if mode:
        os.chmod(path, mode)
    return digest.hexdigest()


def _stat_key(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {sha256}"


# A wheel's central directory as the cache keeps it (atomic.write_verified, as the members are).
CENTRAL_DIRECTORY_FILE = "central-directory.bin"


def _starts_with(path: Path, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


