"""Sparse wheel reads, whole-artifact fallback, cache, offline and failure modes, against a real
HTTP index on 127.0.0.1 serving real wheels and sdists."""

import io
import tarfile

import pytest
from support.builders import build_wheel, filler_blobs
from support.fixtures import PRISTINE
from support.index_server import IndexServer
from support.invoke import run_json

# Incompressible filler so that the wheel (~6 MB) is much larger than what a sparse read needs, and
# than the first tail read (1 MB for a project patchctl has not measured yet).
BIG = filler_blobs(40)


@pytest.fixture
def index(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **BIG))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        yield server


def check(*args, expect=None):
    return run_json("check", *args, expect=expect)


def test_sparse_check_reads_a_small_part_of_the_wheel(index, store, fresh_cache):
    doc = check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"
    wheel_size = (index.files_dir / "vllm-1.0-py3-none-any.whl").stat().st_size
    assert doc["source"]["kind"] == "wheel"
    assert 0 < doc["source"]["bytes_fetched"] < wheel_size / 4
    assert all(rng for path, rng in index.requests if path.startswith("/files/"))
    # warm: served from the cache, no file request at all
    index.requests.clear()
    check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    assert not [p for p, _ in index.requests if p.startswith("/files/")]


def test_server_ignoring_range_falls_back_to_whole_artifact(index, store, fresh_cache):
    index.honour_range = False
    doc = check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"
    assert doc["source"]["bytes_fetched"] >= (index.files_dir / "vllm-1.0-py3-none-any.whl").stat().st_size


def test_html_index_pages_work_too(index, store, fresh_cache):
    index.json_api = False
    assert check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)["patches"][0]["outcome"] == "clean"


def test_sdist_only_release(tmp_path, store, fresh_cache):
    files = tmp_path / "files"
    files.mkdir()
    sdist = files / "vllm-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for rel, text in PRISTINE.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-1.0/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with IndexServer(files) as server:
        server.add("vllm", sdist)
        doc = check("vllm@1.0", "--index-url", server.url, "--store", str(store), expect=0)
    assert doc["source"]["kind"] == "sdist" and doc["patches"][0]["outcome"] == "clean"


def test_unknown_version_lists_what_exists(index, store, fresh_cache):
    doc = check("vllm@9.9.9", "--index-url", index.url, "--store", str(store), expect=2)
    assert "9.9.9 is not on the package index" in doc["error"]["message"] and "1.0" in doc["error"]["message"]


def test_network_down_with_and_without_cache(index, store, fresh_cache):
    dead = "http://127.0.0.1:9/simple"
    doc = check("vllm@1.0", "--index-url", dead, "--store", str(store), expect=3)
    assert doc["error"]["kind"] == "network" and "nothing is cached" in doc["error"]["message"]
    check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    # same index URL, now unreachable: the cached index page and members carry the check
    index.__exit__(None, None, None)
    assert check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)["patches"][0]["outcome"] == "clean"
    assert check("vllm@1.0", "--index-url", index.url, "--store", str(store), "--offline", expect=0)["ok"]


def test_offline_without_cache_is_an_environment_error(store, fresh_cache):
    doc = check("vllm@1.0", "--index-url", "http://127.0.0.1:9/simple", "--offline", "--store", str(store), expect=3)
    assert "offline" in doc["error"]["message"]


def test_corrupt_cache_entry_is_fetched_again(index, store, fresh_cache):
    check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    members = [p for p in (fresh_cache / "artifacts").rglob("members/*") if p.suffix == ""]
    assert members
    for m in members:
        m.write_bytes(b"garbage")
    index.requests.clear()
    doc = check("vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"
    assert [p for p, _ in index.requests if p.startswith("/files/")]


def test_tampered_wheel_member_fails_its_checks(tmp_path, store, fresh_cache):
    files = tmp_path / "files"
    files.mkdir()
    wheel = build_wheel(files, "vllm", "1.0", PRISTINE)
    data = bytearray(wheel.read_bytes())
    # flip bytes inside a stored member's data: the CRC-32 check must catch it
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo("vllm/loader.py")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + 2
    data[start] ^= 0xFF
    wheel.write_bytes(bytes(data))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        doc = check("vllm@1.0", "--index-url", server.url, "--store", str(store), expect=3)
    message = doc["error"]["message"]
    assert "CRC-32" in message or "sha256" in message or "decompress" in message.lower()
