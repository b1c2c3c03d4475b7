"""Every path that reads wheel members checks them against the wheel's RECORD: range reads and the
whole-artifact download alike (a server without Range support, `export --full`). The wheels are real
(`build_wheel`), re-zipped with one member's bytes changed after RECORD was written, so that the
zip's own CRC-32s are right and only RECORD can tell."""

import zipfile

import pytest
from support.builders import build_wheel, filler_blobs
from support.fixtures import PRISTINE
from support.index_server import IndexServer
from support.invoke import run_json

from patchctl.core.errors import NetworkError


def tamper(wheel, member: str, data: bytes) -> None:
    """Rewrite the wheel with `member` holding `data`, every other member (RECORD included) as built."""
    with zipfile.ZipFile(wheel) as zf:
        members = [(info.filename, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in members:
            zf.writestr(name, data if name == member else content)


@pytest.fixture
def files(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    return folder


# With Range support, incompressible filler makes range reads cheaper than one GET of the wheel
# (a wheel of a few KB is fetched whole: see test_fetch_cost.py).
FILLER = filler_blobs(40)


def serve(files, member: str | None, data: bytes = b"", *, ranges: bool) -> IndexServer:
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **FILLER) if ranges else PRISTINE)
    if member:
        tamper(wheel, member, data)
    server = IndexServer(files)
    server.honour_range = ranges
    server.add("vllm", wheel)
    return server


TAMPERED_LOADER = PRISTINE["vllm/loader.py"].replace("line 3\n", "line 3; import os; os.system('x')\n").encode()


@pytest.mark.parametrize("ranges", [True, False], ids=["range-reads", "no-range-support"])
def test_a_member_that_differs_from_record_is_refused(files, store, fresh_cache, ranges):
    with serve(files, "vllm/loader.py", TAMPERED_LOADER, ranges=ranges) as server:
        doc = run_json("check", "vllm@1.0", "--index-url", server.url, "--store", str(store), expect=3)
        plain_gets = [p for p, rng in server.requests if p.startswith("/files/") and rng is None]
        assert bool(plain_gets) == (not ranges)  # no Range support: the whole wheel was downloaded
        # nothing of the refused member was cached: the next run refuses it again
        again = run_json("check", "vllm@1.0", "--index-url", server.url, "--store", str(store), expect=3)
    message = doc["error"]["message"]
    assert "vllm/loader.py does not match the sha256 in RECORD" in message
    assert "vllm-1.0-py3-none-any.whl" in message and doc["error"]["kind"] == "network"
    assert again["error"]["message"] == message


def test_the_same_untampered_wheel_passes_on_both_paths(files, store, fresh_cache):
    with serve(files, None, ranges=False) as server:
        doc = run_json("check", "vllm@1.0", "--index-url", server.url, "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"
    assert doc["source"]["bytes_fetched"] >= (files / "vllm-1.0-py3-none-any.whl").stat().st_size


def test_export_full_downloads_the_wheel_and_checks_every_member(files, store, fresh_cache, tmp_path):
    """The patch touches loader.py only: the range-read check passes; `export --full` reads the whole
    package from the downloaded wheel and must refuse the tampered utils.py."""
    tampered = b"def helper():\n    return 2\n"
    with serve(files, "vllm/utils.py", tampered, ranges=True) as server:
        run_json("check", "vllm@1.0", "--index-url", server.url, "--store", str(store), expect=0)
        doc = run_json(
            "export", "vllm@1.0", str(tmp_path / "out"), "--full", "--index-url", server.url, "--store", str(store), expect=3
        )
    assert "vllm/utils.py does not match the sha256 in RECORD" in doc["error"]["message"]


def test_release_source_without_sparse_reads_checks_record(files, fresh_cache):
    """The full-download path itself (ReleaseSource(sparse=False)), as `export --full` and a
    server without Range use it."""
    from patchctl.core.engines import get_engine
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.release import ReleaseSource, choose_artifact

    with serve(files, "vllm/loader.py", TAMPERED_LOADER, ranges=True) as server:
        project = PackageIndex(server.url, fresh_cache).project("vllm")
        artifact = choose_artifact(project, project.versions()[-1])
        source = ReleaseSource(get_engine("vllm"), artifact, fresh_cache, sparse=False)
        assert source.read("vllm/utils.py") == PRISTINE["vllm/utils.py"].encode()
        with pytest.raises(NetworkError, match="vllm/loader.py does not match the sha256 in RECORD"):
            source.read("vllm/loader.py")
        assert all(rng is None for path, rng in server.requests if path.startswith("/files/"))


def test_a_malformed_record_is_an_error_naming_the_wheel(files, store, fresh_cache):
    record = "vllm-1.0.dist-info/RECORD"
    with serve(files, record, b"vllm/loader.py,sha256=abcde,5\n", ranges=False) as server:
        doc = run_json("check", "vllm@1.0", "--index-url", server.url, "--store", str(store), expect=3)
    assert f"vllm-1.0-py3-none-any.whl: {record} is malformed" in doc["error"]["message"]
