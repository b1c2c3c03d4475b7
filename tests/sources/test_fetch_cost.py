"""What a read costs on the wire: the artifact chosen by bytes, the central directory in one round
trip, conditional index requests and the freshness window, streaming `export --full`, the cached
name list of a whole artifact and one hash per cached read. Counted on a real HTTP index on
127.0.0.1 (requests and their answers), and on real releases where the choice is about them.
No timings here: benchmarks/throttled_check.py measures those."""

import hashlib
import io
import json
import random
import stat
import tarfile
import zipfile

import pytest
from packaging.version import Version
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json

from patchctl.sources import fetch


def filler(count: int, size: int, seed: int = 0) -> dict[str, str]:
    """Incompressible modules, so that a wheel is much bigger than what a check needs."""
    rng = random.Random(seed)
    return {f"vllm/filler/mod{i}.py": f"DATA = '{rng.randbytes(size // 2).hex()}'\n" for i in range(count)}


BIG = filler(40, 100_000)  # a ~4 MB wheel: range reads beat one GET of it


def sdist(folder, version: str, files: dict[str, str]):
    path = folder / f"vllm-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def files(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    return folder


def check(server, store, *extra, expect=0):
    fetch._index.cache_clear()  # each run as a new process: no index page kept in memory
    return run_json("check", "vllm@1.0", "--index-url", server.url, "--store", str(store), *extra, expect=expect)


def file_gets(server) -> list[tuple[str, str | None]]:
    return [(p, rng) for p, rng in server.requests if p.startswith("/files/")]


# the artifact, by bytes ------------------------------------------------------------------------


def test_a_small_sdist_is_read_whole_instead_of_ranges_of_a_big_wheel(files, store, fresh_cache):
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **BIG))
    small = sdist(files, "1.0", PRISTINE)
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        server.add("vllm", small)
        doc = check(server, store)
        gets = file_gets(server)
    assert doc["patches"][0]["outcome"] == "clean"
    src = doc["source"]
    assert src["kind"] == "sdist" and src["description"] == small.name and src["read"] == "whole"
    assert "costs less than range reads" in src["why"] and wheel.name in src["why"]
    assert src["bytes_fetched"] == small.stat().st_size
    assert gets == [(f"/files/{small.name}", None)]  # one GET, no range read of the wheel


def test_a_big_sdist_leaves_the_wheel_to_range_reads(files, store, fresh_cache):
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **BIG))
    big = sdist(files, "1.0", dict(PRISTINE, **BIG))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        server.add("vllm", big)
        doc = check(server, store)
        gets = file_gets(server)
    src = doc["source"]
    assert src["kind"] == "wheel" and src["read"] == "ranges" and src["why"].startswith("wheel by range reads")
    assert src["bytes_fetched"] < wheel.stat().st_size / 2
    assert gets and all(rng for _, rng in gets)


def test_real_releases_are_read_from_the_cheaper_artifact(tmp_path):
    """vllm-gguf-plugin 0.0.5: the 115 KB sdist whole, not the 6.4 MB wheel; vLLM 0.23.0: its 274 MB
    wheel by ranges, not the 36.6 MB sdist (the index's real sizes; nothing is downloaded; an empty
    cache, as what a cache already holds is chosen first)."""
    from patchctl.sources.release import choose

    index = fetch.SourceContext().index_for()
    plugin = choose(index.project("vllm-gguf-plugin"), Version("0.0.5"), cache_root=tmp_path)
    assert (plugin.file.kind, plugin.whole) == ("sdist", True) and plugin.file.size < 200_000
    vllm = choose(index.project("vllm"), Version("0.23.0"), cache_root=tmp_path)
    assert (vllm.file.kind, vllm.whole) == ("wheel", False)
    assert choose(index.project("vllm"), Version("0.23.0"), prefer_sdist=True).file.kind == "sdist"


def test_the_choice_does_not_depend_on_the_cache_but_offline_serves_what_it_holds(files, store, fresh_cache):
    """Online the artifact is chosen by cost alone (the matrix records it: another machine must read
    the same one); offline, a cache filled when the wheel was read by ranges keeps serving the check."""
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **BIG))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        first = check(server, store)
        server.add("vllm", sdist(files, "1.0", PRISTINE))
        fetch._index.cache_clear()
        doc = check(server, store)  # the page now lists the small sdist too
        offline = check(server, store, "--offline")  # the cached page lists both; the wheel was read first
    assert first["source"]["kind"] == "wheel"
    assert offline["source"]["kind"] == "wheel" and "in the cache" in offline["source"]["why"]
    assert offline["patches"][0]["outcome"] == "clean"
    assert doc["source"]["kind"] == "sdist" and "costs less" in doc["source"]["why"]
    assert doc["patches"][0]["outcome"] == "clean"


# the central directory in one round trip ---------------------------------------------------------


def many_members(count: int) -> dict[str, str]:
    return {f"vllm/pkg{i // 500}/m{i}.py": f"X = {i}\n" for i in range(count)}


def test_central_directory_and_record_come_in_one_range_read(files, store, fresh_cache):
    """A ~4 MB wheel whose central directory (43 members) is far smaller than the default tail: one
    read brings it and RECORD, and the one member the patch needs takes one more."""
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **BIG))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        doc = check(server, store)
        gets = file_gets(server)
    assert doc["source"]["read"] == "ranges"
    assert len(gets) == 2, gets  # the tail (central directory + RECORD), then vllm/loader.py
    assert gets[0][1].endswith(f"-{wheel.stat().st_size - 1}")


def test_the_members_connections_are_opened_without_a_request_of_their_own(files, builder, fresh_cache):
    """Two members to read: their connections are opened while the tail is on its way (http.warm),
    with no request (a HEAD, as before, cost a round trip of its own): the wire carries the index
    page, the tail and the two members, nothing else."""
    patched = {"vllm/loader.py": loader_with({10: "ten\n"}), "vllm/utils.py": PRISTINE["vllm/utils.py"] + "X = 1\n"}
    builder.add("vllm", "two", variants={"1.0": builder.variant(PRISTINE, patched)})
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **BIG))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        doc = check(server, builder.root)
        gets = file_gets(server)
    assert doc["source"]["read"] == "ranges"
    assert server.heads == []
    assert len(gets) == 3, gets  # the tail, then the two members
    assert [p for p, _ in server.requests if not p.startswith("/files/")] == ["/simple/vllm/"]


def test_a_tail_that_falls_short_costs_one_more_read_and_the_next_release_none(files, store, fresh_cache):
    """12k members: central directory + RECORD ~1.6 MB, more than the default first read. The miss
    costs one read (the rest of the central directory and RECORD together); what it took is kept in
    the cache, and the next release of the project gets its central directory in the first read."""
    members = dict(PRISTINE, **many_members(12_000), **BIG)
    old = build_wheel(files / "old", "vllm", "1.0", members)
    new = build_wheel(files / "new", "vllm", "1.1", dict(members, **{"vllm/new.py": "Y = 1\n"}))
    for wheel in (old, new):
        wheel.rename(files / wheel.name)
    with IndexServer(files) as server:
        server.add("vllm", files / old.name)
        server.add("vllm", files / new.name)
        check(server, store)
        first = file_gets(server)
        tails = json.loads((fresh_cache / "tails" / "vllm.json").read_text())
        server.requests.clear()
        fetch._index.cache_clear()
        doc = run_json("check", "vllm@1.1", "--index-url", server.url, "--store", str(store), expect=0)
        second = file_gets(server)
    assert len(first) == 3, first  # tail, the rest of the central directory with RECORD, the member
    assert set(tails) == {"1.0"} and tails["1.0"] > 1 << 20
    assert len(second) == 2, second  # tail (sized from 1.0's need), the member
    assert doc["patches"][0]["outcome"] == "clean"


# conditional index requests -------------------------------------------------------------------------


def page_answers(server) -> list[int]:
    return [status for path, status in server.answers if path.startswith("/simple/")]


def test_a_cached_index_page_is_revalidated_and_a_304_keeps_it(files, store, fresh_cache, monkeypatch):
    monkeypatch.delenv("PATCHCTL_INDEX_MAX_AGE", raising=False)
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **BIG))
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        check(server, store)
        cached = json.loads(next((fresh_cache / "index").rglob("vllm.json")).read_text())
        assert cached["etag"] and cached["last_modified"]
        assert check(server, store)["patches"][0]["outcome"] == "clean"
        assert page_answers(server) == [200, 304]
        # A new release changes the page: the next request gets it whole, with the new version.
        server.add("vllm", build_wheel(files, "vllm", "1.1", dict(PRISTINE, **BIG)))
        fetch._index.cache_clear()
        assert run_json("check", "vllm@1.1", "--index-url", server.url, "--store", str(store), expect=0)["ok"]
        assert page_answers(server) == [200, 304, 200]


def test_an_index_without_validators_is_read_whole_each_time(files, store, fresh_cache, monkeypatch):
    monkeypatch.delenv("PATCHCTL_INDEX_MAX_AGE", raising=False)
    with IndexServer(files) as server:
        server.validators = False
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        check(server, store)
        check(server, store)
        assert page_answers(server) == [200, 200]


def test_within_the_freshness_window_the_index_is_not_asked(files, store, fresh_cache, monkeypatch):
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        monkeypatch.setenv("PATCHCTL_INDEX_MAX_AGE", "600")
        check(server, store)
        check(server, store)
        assert page_answers(server) == [200]
        monkeypatch.setenv("PATCHCTL_INDEX_MAX_AGE", "0")
        check(server, store)
        assert page_answers(server) == [200, 304]
        monkeypatch.setenv("PATCHCTL_INDEX_MAX_AGE", "soon")
        doc = check(server, store, expect=2)
    assert "PATCHCTL_INDEX_MAX_AGE must be a number of seconds" in doc["error"]["message"]


def test_the_freshness_window_from_the_config_file(files, store, fresh_cache, monkeypatch, tmp_path):
    from patchctl.core.schemas import problem

    if problem("config", {"index_max_age": 60}) is not None:
        pytest.skip("patchctl/core/schemas/config.json does not accept index_max_age yet (issue 17 report: the diff)")
    monkeypatch.delenv("PATCHCTL_INDEX_MAX_AGE", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("index_max_age: 600\n")
    monkeypatch.setenv("PATCHCTL_CONFIG", str(config))
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        check(server, store)
        check(server, store)
        assert page_answers(server) == [200]


# streaming exports ------------------------------------------------------------------------------


def with_modes(wheel, modes: dict[str, int]) -> None:
    """Rewrite the wheel with these members' Unix modes (RECORD unchanged: the bytes are the same)."""
    with zipfile.ZipFile(wheel) as zf:
        members = [(info, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in members:
            fresh = zipfile.ZipInfo(info.filename, info.date_time)
            fresh.compress_type = zipfile.ZIP_DEFLATED
            fresh.external_attr = (stat.S_IFREG | modes.get(info.filename, 0o644)) << 16
            zf.writestr(fresh, data)


def test_export_full_streams_the_tree_keeps_modes_and_reports_bytes(files, store, fresh_cache, tmp_path):
    wheel = build_wheel(files, "vllm", "1.0", dict(PRISTINE, **{"vllm/run.sh": "#!/bin/sh\necho hi\n"}))
    with_modes(wheel, {"vllm/run.sh": 0o755})
    out = tmp_path / "out"
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        fetch._index.cache_clear()
        doc = run_json("export", "vllm@1.0", str(out), "--full", "--index-url", server.url, "--store", str(store), expect=0)
    assert stat.S_IMODE((out / "vllm/run.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "vllm/utils.py").stat().st_mode) == 0o644
    assert (out / "vllm/loader.py").read_text() == loader_with({10: "ten\n"})
    assert doc["source"]["bytes_fetched"] >= wheel.stat().st_size and "whole" in doc["source"]["read"]
    # One cached copy: the artifact; the exported members are not copied into the member cache.
    # A whole artifact checked against the index's sha256 is kept by that hash (cache.py's layout).
    (artifact_dir,) = (fresh_cache / "verified").iterdir()
    assert artifact_dir.name == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert (artifact_dir / "artifact").stat().st_size == wheel.stat().st_size
    cached_members = [p for p in fresh_cache.glob("*/*/members/*") if p.suffix == ""]
    assert len(cached_members) <= 1  # at most what the check itself read (loader.py)
    assert not list(tmp_path.glob(".out.patchctl-*"))


def test_export_full_of_a_real_release_keeps_the_exec_bit(tmp_path):
    """vllm-gguf-plugin 0.0.5: `check` reads its sdist, `--full` writes the installable wheel's tree,
    where _C_gguf.abi3.so is executable (0o755 in the wheel)."""
    out = tmp_path / "plugin"
    fetch._index.cache_clear()
    doc = run_json("export", "vllm-gguf-plugin@0.0.5", str(out), "--full", expect=0)
    assert doc["source"]["kind"] == "wheel"
    so = out / "vllm_gguf_plugin" / "_C_gguf.abi3.so"
    assert so.is_file() and so.stat().st_mode & stat.S_IXUSR


def test_a_failed_export_leaves_nothing_at_the_destination(files, store, fresh_cache, tmp_path):
    wheel = build_wheel(files, "vllm", "1.0", PRISTINE)
    with zipfile.ZipFile(wheel) as zf:
        members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:  # utils.py no longer matches RECORD
        for name, data in members:
            zf.writestr(name, b"def helper():\n    return 2\n" if name == "vllm/utils.py" else data)
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        fetch._index.cache_clear()
        doc = run_json(
            "export", "vllm@1.0", str(tmp_path / "out"), "--full", "--index-url", server.url, "--store", str(store), expect=3
        )
    assert "vllm/utils.py does not match the sha256 in RECORD" in doc["error"]["message"]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.patchctl-*"))


# cached name lists, one hash per read ----------------------------------------------------------------


def sdist_source(server, cache):
    from patchctl.core.engines import get_engine
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.release import ReleaseSource, choose_artifact

    project = PackageIndex(server.url, cache).project("vllm")
    artifact = choose_artifact(project, Version("1.0"))
    return ReleaseSource(get_engine("vllm"), artifact, cache, sparse=False)


def test_an_sdists_names_are_listed_once_then_read_from_the_cache(files, fresh_cache, monkeypatch):
    with IndexServer(files) as server:
        server.add("vllm", sdist(files, "1.0", PRISTINE))
        first = sdist_source(server, fresh_cache).files_under("vllm/")
        assert "vllm/loader.py" in first

        def no_gunzip(*args, **kwargs):
            raise AssertionError("the sdist was opened again to list its names")

        monkeypatch.setattr(tarfile, "open", no_gunzip)
        again = sdist_source(server, fresh_cache)
        assert again.files_under("vllm/") == first
        assert again.provenance().bytes_fetched == 0


def test_a_cached_member_is_hashed_once_per_read(files, fresh_cache, monkeypatch):
    from patchctl.sources import release

    with IndexServer(files) as server:
        server.add("vllm", sdist(files, "1.0", PRISTINE))
        sdist_source(server, fresh_cache).read("vllm/loader.py")  # fills the member cache
        source = sdist_source(server, fresh_cache)
        calls = []
        real = hashlib.sha256

        def counting(data=b""):
            calls.append(len(data))
            return real(data)

        monkeypatch.setattr(release.hashlib, "sha256", counting)
        assert source.read("vllm/loader.py") == PRISTINE["vllm/loader.py"].encode()
    # (the cache file's name is a hash of the path too: only hashes of the member's bytes count)
    assert calls.count(len(PRISTINE["vllm/loader.py"].encode())) == 1
