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

from patchctl.atomic import write_atomic
from patchctl.engines import Engine
from patchctl.errors import EnvironmentProblem, NetworkError, UsageError
from patchctl.sources import http, zipread
from patchctl.sources.base import NoProgress, ProgressSink, Provenance
from patchctl.sources.index import IndexFile, IndexProject
from patchctl.sources.zipread import ZipEntry, tail_guess

FETCH_THREADS = 8


def choose_artifact(project: IndexProject, version, prefer_sdist: bool = False) -> IndexFile:
    """The cheapest artifact to read files from: a wheel for sparse reads; an sdist when a whole
    tree is wanted (vLLM's sdist is 47 MB against a 300 MB wheel, with the same Python sources)."""
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

    return sorted(files, key=rank)[0]


class ReleaseSource:
    """FileSource over one artifact of a release; member paths are relative to the import root."""

    def __init__(self, engine: Engine, artifact: IndexFile, cache_root: Path, *,
                 offline: bool = False, progress: ProgressSink | None = None, sparse: bool = True,
                 details: dict | None = None):
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
        self.sparse = sparse and artifact.kind == "wheel"
        self.bytes_fetched = 0
        self._entries: dict[str, ZipEntry] | None = None
        self._record: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._tail: tuple[int, bytes] | None = None

    # FileSource -----------------------------------------------------------------------------
    def read(self, path: str) -> bytes | None:
        self.prefetch([path])
        cached = self._member_file(path)
        if cached.is_file():
            return cached.read_bytes()
        return None

    def prefetch(self, paths: Iterable[str]) -> None:
        missing = [p for p in dict.fromkeys(paths) if not self._cached_ok(p)]
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
        member = self._member_file(path)
        if self._absent_file(path).is_file():
            return True
        meta = member.with_suffix(".sha256")
        if member.is_file() and meta.is_file():
            if hashlib.sha256(member.read_bytes()).hexdigest().encode() == meta.read_bytes().strip():
                return True
            member.unlink()  # corrupt cache entry: fetch again
        return False

    def _store(self, path: str, data: bytes | None) -> None:
        if data is None:
            write_atomic(self._absent_file(path), b"")
            return
        write_atomic(self._member_file(path), data)
        write_atomic(self._member_file(path).with_suffix(".sha256"), hashlib.sha256(data).hexdigest().encode())

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
        cd_file = self.dir / "central-directory.json"
        cached = self._cached_central_directory(cd_file)
        if cached is not None:
            self._entries = cached
            return cached
        self._need_network("the wheel's file list")
        size = self.artifact.size or self._remote_size()
        tail_start = max(0, size - tail_guess(size))
        tail = self._range(tail_start, size - 1)
        self._tail = (tail_start, tail)
        with self._zip_errors():
            where = zipread.locate_central_directory(tail, tail_start)
            if where.zip64_record is not None:
                where = zipread.zip64_location(self._range(where.zip64_record, where.zip64_record + 55))
            if where.offset >= tail_start:
                cd = tail[where.offset - tail_start : where.offset - tail_start + where.size]
            else:
                cd = self._range(where.offset, where.offset + where.size - 1)
            entries = zipread.parse_central_directory(cd)
        write_atomic(cd_file, json.dumps([list(e) for e in entries.values()]).encode())
        self._entries = entries
        return entries

    def _cached_central_directory(self, cd_file: Path) -> dict[str, ZipEntry] | None:
        """The cached file list, or None when there is none. A damaged one is deleted when the network
        can read the list again; offline, it is an error that says how to refresh it."""
        if not cd_file.is_file():
            return None
        from patchctl.schemas import problem

        try:
            rows = json.loads(cd_file.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            wrong: str | None = f"not JSON: {exc}"
        else:
            wrong = problem("central-directory", rows)
            if wrong is None and not all(_encodable(r[0]) for r in rows):
                wrong = "a member name is not valid Unicode"
        if wrong is None:
            return {r[0]: ZipEntry(r[0], *(int(v) for v in r[1:])) for r in rows}
        if self.offline:
            raise EnvironmentProblem(f"cache file {cd_file} is damaged; run once without --offline "
                                     f"to refresh it ({wrong})")
        cd_file.unlink(missing_ok=True)
        return None

    def _remote_size(self) -> int:
        response = http.session().head(self.artifact.url, allow_redirects=True, timeout=http.TIMEOUT)
        return int(response.headers["Content-Length"])

    def _range(self, start: int, end: int) -> bytes:
        if self._tail and self._tail[0] <= start and end < self._tail[0] + len(self._tail[1]):
            # Already read with the central directory (RECORD is usually the last member).
            offset = start - self._tail[0]
            return self._tail[1][offset : offset + end - start + 1]
        data = http.get_range(self.artifact.url, start, end, what=self.artifact.filename)
        with self._lock:  # members are fetched from several threads
            self.bytes_fetched += len(data)
            self.progress.advance(len(data))
        return data

    def _record_hashes(self) -> dict[str, str]:
        if self._record is not None:
            return self._record
        entries = self._central_directory()
        record_name = next((n for n in entries if n.endswith(".dist-info/RECORD")), None)
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
        if target.is_file():
            if expected and _sha256_file(target) == expected:
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
        return target

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
                        record_name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD")), None)
                        if record_name is None and self.unhashed:
                            raise NetworkError(f"{self.artifact.filename}: the index publishes no sha256 and "
                                               "the wheel has no RECORD: nothing vouches for its files")
                        record = self._parse_record(record_name, zf.read(record_name)) if record_name else {}
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
        """Paths (relative to the import root) below a directory: used to relocate moved code."""
        if self.sparse:
            prefix_name = self._archive_name(prefix)
            layout = self.engine.layout_prefix(self.artifact.kind)
            return [n[len(layout):] for n in self._central_directory() if n.startswith(prefix_name)]
        archive = self.download_full()
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                return [n for n in zf.namelist() if n.startswith(prefix)]
        with tarfile.open(archive) as tf:
            paths = [self.engine.sdist_member_path(m.name) for m in tf if m.isfile()]
        return [p for p in paths if p and p.startswith(prefix)]


def _starts_with(path: Path, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, from a \ud800 escape
        return False
    return True


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


