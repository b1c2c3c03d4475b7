"""Range reads of a wheel: its tail (end record, central directory and, usually, RECORD) in one
request sized by what the project needed last, then each member's local header and payload, inflated
and CRC-checked (zipread's pure functions over the bytes). No cache here: `release.py` keeps what this
reads in the artifact cache, and checks the members against RECORD."""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from patchctl.core.errors import NetworkError
from patchctl.sources import ranges, zipread
from patchctl.sources.zipread import CentralDirectoryLocation, ZipEntry, tail_guess


class SparseWheel:
    """One wheel at `url`, read by byte ranges; `count(n)` is told every byte that came over the wire."""

    def __init__(self, url: str, filename: str, size: int | None, count: Callable[[int], None]):
        self.url = url
        self.filename = filename
        self.size = size
        self._count = count
        self._tail: tuple[int, bytes] | None = None
        self._lock = threading.Lock()

    def central_directory(self, measured: int | None) -> tuple[dict[str, ZipEntry], bytes, int]:
        """The entries, the central directory's own bytes (what the cache keeps) and what the tail
        read had to hold (for the project's next estimate: zipread.tail_need)."""
        tail_start, size = self._read_tail(measured)
        entries, where, cd = self._parse_tail(tail_start)
        return entries, cd, zipread.tail_need(size, entries, where.offset)

    def member(self, entry: ZipEntry) -> bytes:
        """A member's bytes, inflated and checked against its CRC-32."""
        with self.zip_errors():
            head = self._range(*zipread.local_header_span(entry, self.size))
            start = zipread.payload_start(head, entry)
            payload = head[start : start + entry.compressed_size]
            if len(payload) < entry.compressed_size:
                payload += self._range(
                    entry.header_offset + start + len(payload), entry.header_offset + start + entry.compressed_size - 1
                )
            return zipread.inflate(entry, payload)

    @contextmanager
    def zip_errors(self) -> Iterator[None]:
        """A malformed zip is the artifact's fault (truncated, tampered): said with its name."""
        try:
            yield
        except (zipread.ZipFormatError, struct.error, UnicodeDecodeError) as exc:  # a record cut short, a name not UTF-8
            raise NetworkError(f"{self.filename}: {exc}") from None

    def _read_tail(self, measured: int | None) -> tuple[int, int]:
        """The first read: the tail sized by the project's last measured need (else a default that
        holds every release measured). Returns (where the tail starts, the file's size)."""
        if self.size:
            tail_start = max(0, self.size - tail_guess(self.size, measured))
            self._tail = (tail_start, self._range(tail_start, self.size - 1))
            return tail_start, self.size
        # No size on the index: a suffix range answers with the size, instead of a HEAD first.
        guess = int(measured * zipread.TAIL_GROWTH) + zipread.TAIL_SLACK if measured else zipread.TAIL_DEFAULT
        size, data = ranges.get_suffix(self.url, max(zipread.TAIL_MIN, guess), what=self.filename)
        self._count(len(data))
        self.size = size
        self._tail = (size - len(data), data)
        return size - len(data), size

    def _parse_tail(self, tail_start: int) -> tuple[dict[str, ZipEntry], CentralDirectoryLocation, bytes]:
        """The central directory (its entries, where it is, its bytes) from the tail read, with one
        more read when the tail fell short."""
        tail = self._tail[1] if self._tail else b""
        with self.zip_errors():
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

    def _range(self, start: int, end: int) -> bytes:
        tail = self._tail
        if tail and tail[0] <= start and end < tail[0] + len(tail[1]):
            # Already read with the central directory (RECORD is usually the last member).
            offset = start - tail[0]
            return tail[1][offset : offset + end - start + 1]
        data = ranges.get_range(self.url, start, end, what=self.filename)
        self._count(len(data))
        return data
