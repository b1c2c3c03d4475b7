"""Pristine files of one released version, read from the package index.

Wheels are zip files: the central directory and just the members a patch needs are fetched with
HTTP range reads, each member checked against its CRC-32 and the sha256 the wheel's RECORD lists.
Without a usable wheel (or a server that ignores Range) the whole artifact is downloaded, checked
against the index's sha256, and the needed members are taken from it.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import struct
import tarfile
import zipfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, NamedTuple

from patchctl.engines import Engine
from patchctl.errors import NetworkError, UsageError
from patchctl.sources import http
from patchctl.sources.base import NoProgress, ProgressSink, Provenance
from patchctl.sources.index import IndexFile, IndexProject, _atomic_write

TAIL_MIN, TAIL_MAX = 1 << 16, 1 << 21
FETCH_THREADS = 8


def tail_guess(size: int) -> int:
    """Bytes to read from the end of a wheel so that the central directory usually comes in the
    same request (vLLM's is ~0.5 MB in a ~270 MB wheel): one round trip instead of two."""
    return max(TAIL_MIN, min(TAIL_MAX, size // 256))


class ZipEntry(NamedTuple):
    name: str
    header_offset: int
    compressed_size: int
    size: int
    method: int
    crc: int


def choose_artifact(project: IndexProject, version, prefer_sdist: bool = False) -> IndexFile:
    """The cheapest artifact to read files from: a wheel for sparse reads; an sdist when a whole
    tree is wanted (vLLM's sdist is 47 MB against a 300 MB wheel, with the same Python sources)."""
    files = [f for f in project.files_for(version) if f.sha256]
    if not files:
        known = project.versions(include_pre=True)
        near = ", ".join(str(v) for v in known[-5:]) or "none"
        raise UsageError(
            f"{project.name} {version} is not on the package index {project.index_url} "
            f"(newest there: {near})"
        )

    def rank(f: IndexFile):
        if prefer_sdist and f.kind == "sdist":
            return (-1, 0, f.size or 0)
        if f.kind == "wheel":
            pure = "none-any" in f.tags
            x86 = "x86_64" in f.tags
            return (0, 0 if pure else (1 if x86 else 2), f.size or 0)
        return (1, 0, f.size or 0)

    return sorted(files, key=rank)[0]


class ReleaseSource:
    """FileSource over one artifact of a release; member paths are relative to the import root."""

    def __init__(self, engine: Engine, artifact: IndexFile, cache_root: Path, *,
                 offline: bool = False, progress: ProgressSink | None = None, sparse: bool = True):
        self.engine = engine
        self.artifact = artifact
        self.dir = cache_root / "artifacts" / artifact.sha256
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

    def provenance(self) -> Provenance:
        return Provenance(self.artifact.kind, self.artifact.filename, self.artifact.sha256, self.bytes_fetched)

    # cache ------------------------------------------------------------------------------------
    def _member_file(self, path: str) -> Path:
        return self.dir / "members" / hashlib.sha256(path.encode()).hexdigest()[:32]

    def _absent_file(self, path: str) -> Path:
        return self._member_file(path).with_suffix(".absent")

    def _full_file(self) -> Path:
        return self.dir / "artifact"

    def _cached_ok(self, path: str) -> bool:
        member = self._member_file(path)
        if self._absent_file(path).is_file():
            return True
        meta = member.with_suffix(".sha256")
        if member.is_file() and meta.is_file():
            if hashlib.sha256(member.read_bytes()).hexdigest() == meta.read_text().strip():
                return True
            member.unlink()  # corrupt cache entry: fetch again
        return False

    def _store(self, path: str, data: bytes | None) -> None:
        if data is None:
            _atomic_write(self._absent_file(path), b"")
            return
        _atomic_write(self._member_file(path), data)
        _atomic_write(self._member_file(path).with_suffix(".sha256"), hashlib.sha256(data).hexdigest().encode())

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
        if cd_file.is_file():
            rows = json.loads(cd_file.read_text())
            self._entries = {r[0]: ZipEntry(*r) for r in rows}
            return self._entries
        self._need_network("the wheel's file list")
        size = self.artifact.size or self._remote_size()
        tail_start = max(0, size - tail_guess(size))
        tail = self._range(tail_start, size - 1)
        self._tail = (tail_start, tail)
        eocd = tail.rfind(b"PK\x05\x06")
        if eocd < 0:
            raise NetworkError(f"{self.artifact.filename}: no zip end record in the last {size - tail_start} bytes")
        cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
        loc = tail.rfind(b"PK\x06\x07", 0, eocd)
        if loc >= 0 and (cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF):
            (z64_offset,) = struct.unpack("<Q", tail[loc + 8 : loc + 16])
            z64 = self._range(z64_offset, z64_offset + 55)
            cd_size, cd_offset = struct.unpack("<QQ", z64[40:56])
        if cd_offset >= tail_start:
            cd = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]
        else:
            cd = self._range(cd_offset, cd_offset + cd_size - 1)
        entries = _parse_central_directory(cd)
        _atomic_write(cd_file, json.dumps([list(e) for e in entries.values()]).encode())
        self._entries = entries
        return entries

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
            raw = self._read_member(entries[record_name])
            for row in csv.reader(io.StringIO(raw.decode("utf-8"))):
                if len(row) >= 2 and row[1].startswith("sha256="):
                    digest = base64.urlsafe_b64decode(row[1][7:] + "==").hex()
                    hashes[row[0]] = digest
        self._record = hashes
        return hashes

    def _read_member(self, entry: ZipEntry) -> bytes:
        # The local header's extra field may differ from the central one: read a little slack.
        end = entry.header_offset + 30 + len(entry.name.encode()) + 256 + entry.compressed_size - 1
        if self.artifact.size:
            end = min(end, self.artifact.size - 1)
        head = self._range(entry.header_offset, end)
        if head[:4] != b"PK\x03\x04":
            raise NetworkError(f"{self.artifact.filename}: bad local header for {entry.name}")
        name_len, extra_len = struct.unpack("<HH", head[26:30])
        start = 30 + name_len + extra_len
        payload = head[start : start + entry.compressed_size]
        if len(payload) < entry.compressed_size:
            more = self._range(entry.header_offset + start + len(payload),
                               entry.header_offset + start + entry.compressed_size - 1)
            payload += more
        if entry.method == 0:
            data = payload
        elif entry.method == 8:
            try:
                data = zlib.decompress(payload, -15)
            except zlib.error as exc:
                raise NetworkError(f"{self.artifact.filename}: {entry.name} is corrupt ({exc})") from None
        else:
            raise NetworkError(f"{self.artifact.filename}: {entry.name} uses zip method {entry.method}")
        if zlib.crc32(data) & 0xFFFFFFFF != entry.crc or len(data) != entry.size:
            raise NetworkError(f"{self.artifact.filename}: {entry.name} failed its CRC-32 check")
        return data

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
                    expected = record.get(entry.name)
                    if expected and hashlib.sha256(data).hexdigest() != expected:
                        raise NetworkError(f"{self.artifact.filename}: {entry.name} does not match the sha256 in RECORD")
                    self._store(path, data)
        finally:
            self.progress.finish()

    # whole artifact --------------------------------------------------------------------------
    def download_full(self) -> Path:
        target = self._full_file()
        if target.is_file():
            if _sha256_file(target) == self.artifact.sha256:
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
        if digest.hexdigest() != self.artifact.sha256:
            tmp.unlink(missing_ok=True)
            raise NetworkError(
                f"{self.artifact.filename}: sha256 {digest.hexdigest()} does not match the index's {self.artifact.sha256}"
            )
        os.replace(tmp, target)
        return target

    def _fetch_from_full(self, paths: list[str]) -> None:
        archive = self.download_full()
        wanted = {self._archive_name(p): p for p in paths}
        found: dict[str, bytes] = {}
        if self.artifact.kind == "wheel" or archive.read_bytes()[:2] == b"PK":
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    if name in wanted:
                        found[wanted[name]] = zf.read(name)
        else:
            with tarfile.open(archive) as tf:
                for member in tf:
                    path = self.engine.sdist_member_path(member.name) if member.isfile() else None
                    if path in wanted and wanted[path] not in found:
                        found[wanted[path]] = tf.extractfile(member).read()
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


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _parse_central_directory(cd: bytes) -> dict[str, ZipEntry]:
    entries: dict[str, ZipEntry] = {}
    pos = 0
    while pos + 46 <= len(cd) and cd[pos : pos + 4] == b"PK\x01\x02":
        (method,) = struct.unpack("<H", cd[pos + 10 : pos + 12])
        crc, csize, usize = struct.unpack("<III", cd[pos + 16 : pos + 28])
        name_len, extra_len, comment_len = struct.unpack("<HHH", cd[pos + 28 : pos + 34])
        (offset,) = struct.unpack("<I", cd[pos + 42 : pos + 46])
        name = cd[pos + 46 : pos + 46 + name_len].decode("utf-8")
        extra = cd[pos + 46 + name_len : pos + 46 + name_len + extra_len]
        if 0xFFFFFFFF in (csize, usize, offset):
            usize, csize, offset = _zip64_extra(extra, usize, csize, offset)
        entries[name] = ZipEntry(name, offset, csize, usize, method, crc)
        pos += 46 + name_len + extra_len + comment_len
    return entries


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack("<HH", extra[pos : pos + 4])
        if tag == 1:
            body = extra[pos + 4 : pos + 4 + size]
            values = list(struct.unpack(f"<{len(body) // 8}Q", body[: len(body) // 8 * 8]))
            if usize == 0xFFFFFFFF:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF:
                offset = values.pop(0)
            break
        pos += 4 + size
    return usize, csize, offset
