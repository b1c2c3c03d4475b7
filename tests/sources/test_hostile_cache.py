"""A cache that someone else wrote (issue 23: the cache is not trusted): a symlink in place of a cache
file or folder, a FIFO, a huge file, bytes read from another URL; and the cache's format version and
its migration from older layouts. Each hostile case fails on a patchctl before sources/cache.py."""

from __future__ import annotations

import hashlib
import os
import tracemalloc

import pytest
from support import index_server
from support.builders import build_wheel, filler_blobs
from support.fixtures import PRISTINE
from support.index_server import IndexServer
from support.invoke import run_json

from patchctl.sources import fetch

EVIL = "import os\nos.system('touch /tmp/owned')\n"
# Incompressible filler: the wheel (~3 MB) is then read by ranges, not whole (release.choose).
FILLER = filler_blobs(20)


@pytest.fixture
def index(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **FILLER))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        yield server


def check(index, store, expect=0):
    fetch._index.cache_clear()
    return run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=expect)


def framed(data: bytes) -> bytes:
    """A cache member as patchctl frames it: its sha256, a newline, the bytes (self-checking, so a
    planted file framed this way passes the check: only the way it is opened can refuse it)."""
    return hashlib.sha256(data).hexdigest().encode() + b"\n" + data


def members(cache):
    found = [p for p in cache.glob("*/*/members/*") if p.suffix == ""]
    assert found
    return found


def test_a_symlink_in_place_of_a_member_is_not_followed(index, store, fresh_cache, tmp_path):
    check(index, store)
    planted = tmp_path / "planted"
    planted.write_bytes(framed(EVIL.encode()))
    for member in members(fresh_cache):
        member.unlink()
        member.symlink_to(planted)
    doc = check(index, store)
    assert doc["patches"][0]["outcome"] == "clean"  # the release's bytes, read again; not the planted ones
    assert planted.read_bytes() == framed(EVIL.encode())  # untouched
    assert all(not m.is_symlink() and m.is_file() for m in members(fresh_cache))


def test_a_symlink_in_place_of_a_cache_folder_is_not_followed(index, store, fresh_cache, tmp_path):
    check(index, store)
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder,) = {m.parent for m in members(fresh_cache)}
    for member in folder.iterdir():
        (outside / member.name).write_bytes(framed(EVIL.encode()))
    names = sorted(p.name for p in outside.iterdir())
    os.rename(folder, tmp_path / "moved")
    folder.symlink_to(outside)
    doc = check(index, store)
    assert doc["patches"][0]["outcome"] == "clean"
    assert not folder.is_symlink() and folder.is_dir()
    assert sorted(p.name for p in outside.iterdir()) == names  # nothing written or removed out there
    assert all(p.read_bytes() == framed(EVIL.encode()) for p in outside.iterdir())


@pytest.mark.timeout(60)
def test_a_fifo_in_place_of_a_cache_file_does_not_hang(index, store, fresh_cache):
    check(index, store)
    for member in members(fresh_cache):
        member.unlink()
        os.mkfifo(member)
    doc = check(index, store)
    assert doc["patches"][0]["outcome"] == "clean"
    assert all(m.is_file() for m in members(fresh_cache))


def test_a_huge_cache_file_is_not_read_into_memory(index, store, fresh_cache):
    check(index, store)
    for member in members(fresh_cache):
        with open(member, "r+b") as f:
            f.truncate(300 << 20)  # sparse: no disk used
    tracemalloc.start()
    try:
        doc = check(index, store)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert doc["patches"][0]["outcome"] == "clean"
    assert peak < 100 << 20, f"{peak / 1e6:.0f} MB"


def test_a_symlinked_member_offline_is_a_clear_error(index, store, fresh_cache, tmp_path):
    check(index, store)
    planted = tmp_path / "planted"
    planted.write_bytes(framed(EVIL.encode()))
    for member in members(fresh_cache):
        member.unlink()
        member.symlink_to(planted)
    fetch._index.cache_clear()
    doc = run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), "--offline", expect=3)
    assert "symlink" in doc["error"]["message"] and "without --offline" in doc["error"]["message"]


class _LyingHashes:
    """The index server's hashlib, with one lie: the evil wheel is announced with the real one's sha256."""

    def __init__(self, evil: bytes, real: bytes):
        self.evil, self.real = evil, real

    def sha256(self, data: bytes = b"") -> hashlib._Hash:
        return hashlib.sha256(self.real if data == self.evil else data)


def test_bytes_read_from_a_lying_index_are_not_served_for_another_url(store, fresh_cache, tmp_path, monkeypatch):
    """A lying index, once: range reads cannot check the wheel's sha256, so what they gave is kept for
    that URL only. The honest index, later, is read again, and its bytes are what `check` sees."""
    honest_files, lying_files = tmp_path / "honest", tmp_path / "lying"
    honest_files.mkdir()
    lying_files.mkdir()
    real = build_wheel(honest_files, "vllm", "1.0", dict(PRISTINE, **FILLER))
    evil = build_wheel(lying_files, "vllm", "1.0", dict(PRISTINE, **FILLER, **{"vllm/loader.py": EVIL}))
    monkeypatch.setattr(index_server, "hashlib", _LyingHashes(evil.read_bytes(), real.read_bytes()))
    with IndexServer(lying_files) as liar:
        liar.add("vllm", evil)
        lied = check(liar, store, expect=None)
    assert lied["source"]["sha256"] == hashlib.sha256(real.read_bytes()).hexdigest()  # the lie
    assert lied["source"]["verified"] is False  # and the document says the bytes are as served
    with IndexServer(honest_files) as honest:
        honest.add("vllm", real)
        doc = check(honest, store)
        assert [p for p, _ in honest.requests if p.startswith("/files/")]  # read again, from this URL
    assert doc["patches"][0]["outcome"] == "clean"


def test_verified_says_whether_the_bytes_were_checked_against_the_index_hash(index, store, fresh_cache):
    doc = check(index, store)
    assert doc["source"]["read"] == "ranges" and doc["source"]["verified"] is False
    index.honour_range = False
    (fresh_cache / "artifacts").rename(fresh_cache / "gone")  # the range-read members
    doc = check(index, store)
    assert "whole" in doc["source"]["read"] and doc["source"]["verified"] is True
    doc = check(index, store)  # warm: members taken from the verified artifact
    assert doc["source"]["read"] == "cache" and doc["source"]["verified"] is True


# The format and its migration -----------------------------------------------------------------


def test_an_older_cache_is_migrated(index, store, fresh_cache):
    from patchctl.sources.cache import FORMAT

    sha = hashlib.sha256((index.files_dir / "vllm-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    old = fresh_cache / "artifacts" / sha  # format 2: range-read bytes under the claimed hash alone
    (old / "members").mkdir(parents=True)
    (old / "members" / ("0" * 32)).write_bytes(framed(EVIL.encode()))
    (fresh_cache / "validators").mkdir()
    (fresh_cache / "validators" / "series-0.marshal").write_bytes(b"code")
    nightly = fresh_cache / "artifacts" / ("url-" + "b" * 64)
    (nightly / "members").mkdir(parents=True)
    (nightly / "artifact").write_bytes(b"whole")
    doc = check(index, store)
    assert doc["patches"][0]["outcome"] == "clean"
    assert (fresh_cache / "FORMAT").read_text() == f"{FORMAT}\n"
    assert not old.exists() and not (fresh_cache / "validators").exists()
    moved = fresh_cache / "artifacts" / ("unhashed-" + "b" * 16)
    assert (moved / "artifact").read_bytes() == b"whole" and not (moved / "members").exists()


def test_a_newer_cache_format_is_refused_with_a_clear_error(index, store, fresh_cache):
    from patchctl.sources.cache import ArtifactCache

    fresh_cache.mkdir()
    (fresh_cache / "FORMAT").write_text("99\n")
    ArtifactCache._migrated.discard(fresh_cache)
    doc = check(index, store, expect=3)
    assert "format 99" in doc["error"]["message"] and "newer patchctl" in doc["error"]["message"]
