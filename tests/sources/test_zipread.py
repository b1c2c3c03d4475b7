"""The zip reading behind sparse wheel reads, on bytes alone (no server): real zips made by zipfile."""

import base64
import hashlib
import io
import zipfile

import pytest

from patchctl.sources import zipread


def make_zip(members: dict[str, bytes], force_zip64: bool = False) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            with zf.open(name, "w", force_zip64=force_zip64) as f:
                f.write(data)
    return buf.getvalue()


def read_member(archive: bytes, entry: zipread.ZipEntry) -> bytes:
    start, end = zipread.local_header_span(entry, len(archive))
    head = archive[start : end + 1]
    offset = zipread.payload_start(head, entry)
    return zipread.inflate(entry, archive[start + offset : start + offset + entry.compressed_size])


@pytest.mark.parametrize("force_zip64", [False, True])
def test_every_member_comes_back_from_its_central_directory(force_zip64):
    members = {"vllm/__init__.py": b"", "vllm/loader.py": b"line\n" * 500, "vllm/x.bin": bytes(range(256)) * 40}
    archive = make_zip(members, force_zip64)
    tail_start = max(0, len(archive) - 4096)
    where = zipread.locate_central_directory(archive[tail_start:], tail_start)
    if where.zip64_record is not None:
        where = zipread.zip64_location(archive[where.zip64_record : where.zip64_record + 56])
    entries = zipread.parse_central_directory(archive[where.offset : where.offset + where.size])
    assert set(entries) == set(members)
    for name, data in members.items():
        assert read_member(archive, entries[name]) == data


def test_a_flipped_byte_fails_the_crc():
    archive = bytearray(make_zip({"a.py": b"x = 1\n" * 100}))
    where = zipread.locate_central_directory(bytes(archive), 0)
    (entry,) = zipread.parse_central_directory(bytes(archive[where.offset : where.offset + where.size])).values()
    start = entry.header_offset + zipread.payload_start(bytes(archive[entry.header_offset :]), entry)
    archive[start + 2] ^= 0xFF
    with pytest.raises(zipread.ZipFormatError):
        read_member(bytes(archive), entry)


def test_no_end_record_is_a_format_error():
    with pytest.raises(zipread.ZipFormatError, match="no zip end record"):
        zipread.locate_central_directory(b"not a zip at all", 0)


def test_record_hashes():
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"hello").digest()).rstrip(b"=").decode()
    raw = f"vllm/a.py,sha256={digest},5\nvllm-1.0.dist-info/RECORD,,\n".encode()
    assert zipread.record_hashes(raw) == {"vllm/a.py": hashlib.sha256(b"hello").hexdigest()}
