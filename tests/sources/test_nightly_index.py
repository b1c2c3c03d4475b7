"""Nightly for real: vLLM's per-commit wheel repository (laid out exactly as wheels.vllm.ai, serving a
real 0.23.0 wheel's files repackaged as a dev build) and SGLang's main versioned like setuptools-scm."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.version import Version
from support.builders import git, write_tree
from support.invoke import run_json
from support.nightly_index import NightlyIndex, build_dev_wheel, release_files, sglang_layout_repo, touched_paths

from patchctl.core.engines import get_engine
from patchctl.sources.fetch import SourceContext, release

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "patches"
DEV = "0.23.1.dev12+g1234abcd5"
COMMIT = "1234abcd5"
run = run_json


def touched(engine: str) -> list[str]:
    return touched_paths(STORE, engine)


@pytest.fixture(scope="module")
def vllm_files() -> dict[str, bytes]:
    """The real vLLM 0.23.0 files the bundled series touches (read sparsely from the package index)."""
    source = release(get_engine("vllm"), Version("0.23.0"), SourceContext())
    files = {path: source.read(path) for path in touched("vllm")}
    return {p: d for p, d in files.items() if d is not None}


@pytest.fixture(scope="module")
def release_outcomes() -> dict[str, str]:
    doc = run("check", "vllm@0.23.0", "--store", str(STORE))
    return {p["name"]: p["outcome"] for p in doc["patches"]}


@pytest.fixture
def index(tmp_path, vllm_files):
    with NightlyIndex(tmp_path) as server:
        server.publish(COMMIT, build_dev_wheel(tmp_path / COMMIT, DEV, vllm_files))
        yield server


def outcomes(doc: dict) -> dict[str, str]:
    return {p["name"]: p["outcome"] for p in doc["patches"]}


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_nightly_from_vllms_layout(index, release_outcomes, fresh_cache, ranges):
    index.honour_range = ranges
    doc = run("check", "vllm@nightly", "--nightly-source", index.url, "--store", str(STORE))
    assert outcomes(doc) == release_outcomes
    src = doc["source"]
    assert doc["version"] == DEV and src["version"] == DEV and src["commit"] == COMMIT
    assert src["kind"] == "wheel" and src["description"].startswith("vllm-0.23.1.dev12+g1234abcd5-cp38-abi3")
    assert src["index_sha256"] is None and src["verified_by"] == "RECORD" and re.fullmatch("[0-9a-f]{64}", src["record_sha256"])
    assert any(path.startswith(f"/{COMMIT}/vllm-0.23.1.dev12%2Bg1234abcd5-") for path, _ in index.requests)
    # With Range support the build is read by range reads only (this small wheel fits in the first);
    # without, it is downloaded whole.
    assert index.range_requests() >= 1 and (index.full_downloads > 0) != ranges
    if not ranges:  # downloaded whole: the sha256 of what was fetched is recorded
        assert re.fullmatch("[0-9a-f]{64}", src["sha256"])
    # Offline, the build read before is served from the cache.
    again = run("check", "vllm@nightly", "--nightly-source", index.url, "--offline", "--store", str(STORE))
    assert outcomes(again) == release_outcomes and again["source"]["commit"] == COMMIT


def test_commit_spec_reads_the_commits_folder(index, release_outcomes, vllm_files, tmp_path):
    other = "feedbeef0"
    index.publish(other, build_dev_wheel(tmp_path / other, "0.23.1.dev13+gfeedbeef0", vllm_files))
    doc = run("check", f"vllm@commit:{COMMIT}", "--nightly-source", index.url, "--store", str(STORE))
    assert outcomes(doc) == release_outcomes
    assert doc["version"] == DEV and doc["source"]["commit"] == COMMIT
    assert doc["source"]["index"] == f"{index.root}/{COMMIT}"
    assert run("check", "vllm@nightly", "--nightly-source", index.url, "--store", str(STORE))["source"]["commit"] == other
    doc = run("check", "vllm@commit:0badc0de1", "--nightly-source", index.url, "--store", str(STORE), expect=2)
    assert "commit 0badc0de1" in doc["error"]["message"] and "no vllm builds" in doc["error"]["message"]
    assert run("check", "vllm@commit:xyz", "--store", str(STORE), expect=2)["error"]["message"].startswith("bad spec")


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_tampered_member_is_refused(tmp_path, vllm_files, fresh_cache, ranges):
    victim = "vllm/envs.py"
    assert victim in vllm_files
    bad = build_dev_wheel(tmp_path / COMMIT, DEV, vllm_files, tamper={victim: vllm_files[victim] + b"# evil\n"})
    with NightlyIndex(tmp_path) as server:
        server.honour_range = ranges
        server.publish(COMMIT, bad)
        doc = run("check", "vllm@nightly", "--nightly-source", server.url, "--store", str(STORE), expect=3)
    assert doc["error"]["message"].endswith(f"{victim} does not match the sha256 in RECORD"), doc["error"]


def test_variant_subfolder_by_config(tmp_path, vllm_files, monkeypatch):
    cu = "0.23.1.dev12+g1234abcd5.cu130"
    with NightlyIndex(tmp_path) as server:
        server.publish(COMMIT, build_dev_wheel(tmp_path / "cpu", "0.23.1.dev12+g1234abcd5.cpu", vllm_files), variant="cpu")
        server.publish(COMMIT, build_dev_wheel(tmp_path / "cu", cu, vllm_files), variant="cu130")
        config = tmp_path / "config.yaml"
        config.write_text(f"nightly:\n  vllm:\n    url: {server.url}\n    variant: cu130\n")
        monkeypatch.setenv("PATCHCTL_CONFIG", str(config))
        doc = run("check", "vllm@nightly", "--store", str(STORE))
    assert doc["version"] == cu and doc["source"]["commit"] == COMMIT
    assert doc["source"]["index"] == f"{server.url}/cu130"
    assert any(p.startswith("/nightly/cu130/vllm/") for p, _ in server.requests)


def test_vllm_nightly_defaults_to_wheels_vllm_ai(monkeypatch):
    from patchctl.sources.kinds.nightly import nightly_source

    monkeypatch.setenv("PATCHCTL_CONFIG", "/nonexistent/config.yaml")
    vllm = nightly_source(get_engine("vllm"), None)
    assert (vllm.kind, vllm.url) == ("wheel-index", "https://wheels.vllm.ai/nightly")
    sglang = nightly_source(get_engine("sglang"), None)
    assert (sglang.kind, sglang.url, sglang.ref) == ("git", "https://github.com/sgl-project/sglang.git", "main")
    doc = run("check", "vllm@nightly", "--nightly-source", "http://127.0.0.1:9/nightly", "--store", str(STORE), expect=3)
    assert "nightly source for vllm (http://127.0.0.1:9/nightly) is unreachable" in doc["error"]["message"]
    assert "nightly.vllm.url" in doc["error"]["hint"] and "--nightly-source" in doc["error"]["hint"]


# SGLang: main versioned like setuptools-scm -----------------------------------------------------


@pytest.fixture(scope="module")
def sglang_repo(tmp_path_factory) -> tuple[Path, str]:
    files = release_files("sglang", "0.5.9", touched("sglang"))
    repo = sglang_layout_repo(tmp_path_factory.mktemp("sglang") / "repo", files, tag="v0.5.9")
    return repo, git(repo, "rev-parse", "--short=9", "HEAD").strip()  # setuptools-scm: 9 hex digits


def test_sglang_main_is_versioned_from_tags(sglang_repo):
    repo, sha = sglang_repo
    at_tag = run("check", "sglang@git:v0.5.9", "--repo", str(repo), "--store", str(STORE))
    assert at_tag["version"] == "0.5.9"
    doc = run("check", "sglang@git:main", "--repo", str(repo), "--store", str(STORE))
    assert doc["version"] == f"0.5.10.dev2+g{sha}"
    assert doc["patches"] and outcomes(doc) == outcomes(run("check", "sglang@0.5.9", "--store", str(STORE)))
    assert (
        run("check", "sglang@git:main", "--repo", str(repo), "--as-version", "0.5.12", "--store", str(STORE))["version"]
        == "0.5.12"
    )


def test_sglang_version_py_fallback_is_never_a_version(tmp_path):
    repo = tmp_path / "untagged"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_tree(repo, {"python/sglang/version.py": '__version__ = "0.0.0.dev0"\n', "python/sglang/srt/x.py": "x\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "no tag")
    doc = run("check", "sglang@git:main", "--repo", str(repo), "--store", str(STORE), expect=2)
    assert "cannot tell the version" in doc["error"]["message"] and doc["error"]["hint"] == "pass --as-version X.Y.Z"


def test_next_version_like_setuptools_scm():
    from patchctl.sources.kinds.git import next_version

    assert next_version(Version("0.5.23")) == "0.5.24"
    assert next_version(Version("0.5.10rc0")) == "0.5.10rc1"
    assert next_version(Version("1.0.dev3")) == "1.0"


def test_an_sdist_without_an_index_hash_is_refused():
    from patchctl.core.errors import UsageError
    from patchctl.sources.index import IndexProject, _index_file
    from patchctl.sources.release import choose_artifact

    sdist = _index_file("vllm-0.23.1.dev12+g1234abcd5.tar.gz", "http://x/vllm.tar.gz", None, None, False)
    wheel = _index_file(f"vllm-{DEV}-cp38-abi3-manylinux_2_31_x86_64.whl", "http://x/v.whl", None, None, False)
    with pytest.raises(UsageError, match="only sdists without a sha256"):
        choose_artifact(IndexProject("vllm", "http://x", (sdist,), False), Version(DEV))
    assert choose_artifact(IndexProject("vllm", "http://x", (sdist, wheel), False), Version(DEV), prefer_sdist=True) == wheel


def test_commit_spec():
    from patchctl.sources.spec import parse_spec

    ref = parse_spec("vllm@commit:2F3F441F8")
    assert (ref.kind, ref.git_ref, str(ref)) == ("commit", "2f3f441f8", "vllm@commit:2f3f441f8")


def test_a_nightly_after_the_newest_release_gets_its_variants(tmp_path, fresh_cache):
    """Issue 27, item 5 (`check vllm@nightly` classifies the GLM-5.3-Flash patches): the per-commit
    index's stand-in serving the real files of the newest release a variant was written for (0.34.0
    today), repackaged as a dev build after it (the
    files a nightly of that day carries, as near as can be had without wheels.vllm.ai) gets every
    patch with the same outcome and variant as the release itself: triton-sparse-mla and
    slot-mapping-bounds included."""
    from patchctl.store.layered import Store

    series = Store.open(STORE).series("vllm")
    newest = max(v.base for p in series.patches for v in p.variants)
    files = release_files("vllm", str(newest), touched("vllm"))
    dev = f"{newest.major}.{newest.minor}.{newest.micro + 1}.dev3+gabc123def"
    released = run("check", f"vllm@{newest}", "--store", str(STORE))["patches"]
    on_release = {p["name"]: (p["outcome"], p["variant"]) for p in released}
    with NightlyIndex(tmp_path) as server:
        server.publish("abc123def", build_dev_wheel(tmp_path / "abc123def", dev, files))
        doc = run("check", "vllm@nightly", "--nightly-source", server.url, "--store", str(STORE))
    assert doc["version"] == dev
    got = {p["name"]: (p["outcome"], p["variant"]) for p in doc["patches"]}
    assert got == on_release, (got, on_release)
    for name in ("triton-sparse-mla", "slot-mapping-bounds"):  # applied on the nightly, not dropped
        assert got[name][0] in ("clean", "offset"), (name, got[name])
