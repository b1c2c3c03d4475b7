"""The zip format as far as sparse wheel reads need it, as pure functions over bytes: where the central
directory is (from the end-of-central-directory record, zip64 included), its entries, a member's
payload from its local header, inflating and CRC-checking it, and the sha256s a wheel's RECORD lists.
No I/O here: `release.py` fetches the byte ranges these ask for (read_zip_member reads a member of
an archive already open, under the same limits as inflate)."""

from __future__ import annotations

import binascii
import csv
import io
import struct
import zipfile
import zlib
from collections.abc import Iterable, Reversible
from typing import NamedTuple

from patchctl.core.errors import ZipFormatError

# The first tail read of a wheel should hold the end record, the central directory and RECORD (the
# last member in every wheel the build tools write), so that one round trip gives the file list and
# every member's sha256. What that takes, measured on the matrix (bytes from RECORD's local header to
# the end): vLLM 0.16-0.24 289-708 KB, SGLang 0.5.4-0.5.23 169-936 KB, vllm-gguf-plugin 5-17 KB:
# ~150 bytes per member, and at most 6.3% of the wheel (SGLang 0.5.4's 2.7 MB). With no measurement
# of a project yet, TAIL_SHARE of the wheel up to TAIL_DEFAULT covers every one of them.
TAIL_MIN, TAIL_DEFAULT = 1 << 16, 1 << 20
TAIL_SHARE = 0.08
TAIL_GROWTH = 1.1  # room for the next release: most grew <= 6% (a jump, e.g. vLLM 0.20 +54%, costs one more read)
TAIL_SLACK = 16 << 10


def tail_guess(size: int, measured: int | None = None) -> int:
    """Bytes to read from the end of a wheel of `size` bytes: the project's last measured need
    (`tail_need`) with room to grow, else TAIL_SHARE of the wheel up to TAIL_DEFAULT; never more
    than the file."""
    want = int(measured * TAIL_GROWTH) + TAIL_SLACK if measured else min(TAIL_DEFAULT, int(size * TAIL_SHARE))
    return min(size, max(TAIL_MIN, want))


class ZipEntry(NamedTuple):
    name: str
    header_offset: int
    compressed_size: int
    size: int
    method: int
    crc: int


class CentralDirectoryLocation(NamedTuple):
    offset: int
    size: int
    zip64_record: int | None  # where the zip64 end record is, when the 32-bit fields overflowed


def tail_need(size: int, entries: dict[str, ZipEntry], cd_offset: int) -> int:
    """What a tail read of this wheel had to hold: from RECORD's local header (or the central
    directory, without RECORD) to the end."""
    name = record_name(entries)
    start = min(cd_offset, entries[name].header_offset) if name is not None else cd_offset
    return size - start


def missing_span(where: CentralDirectoryLocation, tail_start: int) -> tuple[int, int] | None:
    """When the tail missed part of the central directory: one range that holds the rest of it and,
    by the central directory's own size, the RECORD before it, so that a miss costs one more round
    trip, not two. RECORD has one row per member as the central directory has one entry: a row is
    the name + ~58 bytes, an entry the name + 46 or more, so RECORD is at most ~1.3x its size."""
    if where.offset >= tail_start:
        return None
    start = max(0, where.offset - int(where.size * 1.3) - TAIL_SLACK)
    return start, tail_start - 1


def locate_central_directory(tail: bytes, tail_start: int) -> CentralDirectoryLocation:
    """From the last bytes of the archive (starting at offset tail_start)."""
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise ZipFormatError(f"no zip end record in the last {len(tail)} bytes")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12 : eocd + 20])
    loc = tail.rfind(b"PK\x06\x07", 0, eocd)
    if loc >= 0 and (cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF):
        (z64_offset,) = struct.unpack("<Q", tail[loc + 8 : loc + 16])
        return CentralDirectoryLocation(cd_offset, cd_size, z64_offset)
    # The central directory ends where the end record begins: one that claims more (a larger span
    # to read, see missing_span) is not the zip the index served.
    _check_directory_size(cd_size)
    if cd_offset + cd_size > tail_start + eocd:
        raise ZipFormatError(f"the central directory ({cd_size} bytes at {cd_offset}) overlaps its end record")
    return CentralDirectoryLocation(cd_offset, cd_size, None)


MAX_CENTRAL_DIRECTORY_BYTES = 16 << 20  # vLLM's (5800 members) is ~0.5 MB


def _check_directory_size(size: int) -> None:
    if size > MAX_CENTRAL_DIRECTORY_BYTES:
        raise ZipFormatError(
            f"a central directory of {size} bytes, more than the {MAX_CENTRAL_DIRECTORY_BYTES >> 20} MiB one may be"
        )


def zip64_location(record: bytes) -> CentralDirectoryLocation:
    """The central directory's size and offset from a zip64 end record (56 bytes)."""
    if record[:4] != b"PK\x06\x06" or len(record) < 56:
        raise ZipFormatError("bad zip64 end record")
    cd_size, cd_offset = struct.unpack("<QQ", record[40:56])
    _check_directory_size(cd_size)
    return CentralDirectoryLocation(cd_offset, cd_size, None)


# One central-directory entry's fixed 46 bytes, the fields read: signature, method, CRC-32, sizes,
# the three variable lengths, the local header's offset. One unpack per entry (a wheel has thousands).
_CD_ENTRY = struct.Struct("<4s6xH4xIIIHHH8xI")


_new_entry = tuple.__new__  # a ZipEntry without NamedTuple's generated __new__ (a third of the loop)


def parse_central_directory(cd: bytes) -> dict[str, ZipEntry]:
    entries: dict[str, ZipEntry] = {}
    unpack = _CD_ENTRY.unpack_from
    pos, end = 0, len(cd)
    while pos + 46 <= end:
        sig, method, crc, csize, usize, name_len, extra_len, comment_len, offset = unpack(cd, pos)
        if sig != b"PK\x01\x02":
            break
        name_end = pos + 46 + name_len
        name = cd[pos + 46 : name_end].decode("utf-8")
        if csize == 0xFFFFFFFF or usize == 0xFFFFFFFF or offset == 0xFFFFFFFF:
            usize, csize, offset = zip64_extra(cd[name_end : name_end + extra_len], usize, csize, offset)
        entries[name] = _new_entry(ZipEntry, (name, offset, csize, usize, method, crc))
        pos = name_end + extra_len + comment_len
    return entries


def record_name(names: Reversible[str]) -> str | None:
    """The wheel's own RECORD (`<name>-<version>.dist-info/RECORD` at the top, not a vendored
    package's), looked for from the end: the build tools write it last."""
    for name in reversed(names):
        if name.endswith(".dist-info/RECORD") and name.count("/") == 1:
            return name
    return None


def zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
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


def local_header_span(entry: ZipEntry, archive_size: int | None) -> tuple[int, int]:
    """The byte range to read for a member: its local header, name, a little slack for an extra
    field that differs from the central one, and the payload."""
    end = entry.header_offset + 30 + len(entry.name.encode()) + 256 + entry.compressed_size - 1
    if archive_size:
        end = min(end, archive_size - 1)
    return entry.header_offset, end


def payload_start(head: bytes, entry: ZipEntry) -> int:
    """Where the member's compressed bytes begin, relative to its local header."""
    if head[:4] != b"PK\x03\x04":
        raise ZipFormatError(f"bad local header for {entry.name}")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return 30 + name_len + extra_len


# What one member may cost in memory (docs/limits.md): the largest member patchctl reads is a
# module of ~320 KB (vLLM's gpu_model_runner.py), the highest real ratio above a MiB ~58:1 (a .hpp
# of CUTLASS's, 603 KB). A zip bomb inflates ~1000:1.
MAX_MEMBER_BYTES = 32 << 20
MAX_RATIO = 100  # inflated : deflated, for members over RATIO_GRACE
RATIO_GRACE = 1 << 20


def check_member_size(name: str, compressed_size: int, size: int) -> None:
    """Refuse, before inflating a byte, a member larger than MAX_MEMBER_BYTES or, above
    RATIO_GRACE, inflating more than MAX_RATIO times its deflated size (as its central directory
    states them; inflate holds the member to what it states)."""
    if size > MAX_MEMBER_BYTES:
        raise ZipFormatError(f"{name} is {size} bytes, more than the {MAX_MEMBER_BYTES >> 20} MiB a member may be")
    check_ratio(name, compressed_size, size)


def check_ratio(name: str, compressed_size: int, size: int) -> None:
    """Refuse a member that would inflate, above RATIO_GRACE, more than MAX_RATIO times its deflated
    size (whole-tree extraction: members of any size, but no zip bomb)."""
    if size > RATIO_GRACE and size > MAX_RATIO * compressed_size:
        raise ZipFormatError(f"{name} would inflate {compressed_size} bytes to {size}, more than {MAX_RATIO}:1 (a zip bomb?)")


def inflate(entry: ZipEntry, payload: bytes) -> bytes:
    """The member's bytes, checked against its CRC-32 and size. Inflated in one bounded step: never
    more than the size the central directory states (plus the one byte that shows a lie)."""
    check_member_size(entry.name, entry.compressed_size, entry.size)
    if entry.method == 0:
        data = payload
    elif entry.method == 8:
        inflater = zlib.decompressobj(-15)
        try:
            data = inflater.decompress(payload, entry.size + 1)
        except zlib.error as exc:
            raise ZipFormatError(f"{entry.name} is corrupt ({exc})") from None
        if len(data) > entry.size:
            raise ZipFormatError(f"{entry.name} inflates to more than the {entry.size} bytes its central directory states")
    else:
        raise ZipFormatError(f"{entry.name} uses zip method {entry.method}")
    if zlib.crc32(data) & 0xFFFFFFFF != entry.crc or len(data) != entry.size:
        raise ZipFormatError(f"{entry.name} failed its CRC-32 check")
    return data


def read_zip_member(zf: zipfile.ZipFile, name: str) -> bytes:
    """A member of a whole archive, under inflate's limits: refused before a byte is inflated when
    its stated sizes are over them, and read in pieces that stop at its stated size (ZipFile.read
    inflates the whole deflated stream in one call, whatever the central directory states)."""
    info = zf.getinfo(name)
    check_member_size(name, info.compress_size, info.file_size)
    out = bytearray()
    with zf.open(info) as src:
        while piece := src.read(1 << 20):  # zipfile stops at file_size and then checks the CRC
            out += piece
            if len(out) > info.file_size:
                raise ZipFormatError(f"{name} inflates to more than the {info.file_size} bytes its central directory states")
    return bytes(out)


def record_rows(raw: bytes) -> Iterable[list[str]]:
    """The rows of a wheel's RECORD. Split on commas directly unless the text needs the csv module's
    rules (a quoted path, a CR, a NUL, which csv refuses): RECORD files run to tens of thousands of
    rows, read on `ensure`'s path."""
    text = raw.decode("utf-8")
    if '"' in text or "\r" in text or "\0" in text:
        return csv.reader(io.StringIO(text))
    return (line.split(",") for line in text.split("\n"))


def record_hashes(raw: bytes) -> dict[str, str]:
    """path -> sha256 hex from a wheel's RECORD (rows without a sha256 are left out)."""
    hashes: dict[str, str] = {}
    for row in record_rows(raw):
        if len(row) >= 2 and row[1].startswith("sha256="):
            # base64.urlsafe_b64decode, without its per-call wrappers (non-base64 characters are
            # dropped as it drops them; a non-ASCII one is a ValueError as there)
            hashes[row[0]] = binascii.a2b_base64(row[1][7:].replace("-", "+").replace("_", "/") + "==").hex()
    return hashes
