"""Smoke checks of builds that are not releases: a nightly wheel from a per-commit wheel index laid
out like vLLM's (no index hashes), a git ref, and the nightly row of the matrix with its CPU smoke."""

import hashlib
import json
import sys

import pytest
import yaml
from click.testing import CliRunner
from support.builders import git, write_tree
from support.fixtures import PRISTINE, loader_with
from support.nightly_index import NightlyIndex, build_dev_wheel

from patchctl.cli.main import main

DEV = "1.1.dev3+gabc1234"
CHECK = """
def test_patched_tree_has_the_change(patched_tree, pristine_tree, engine_version):
    assert str(engine_version) == "{version}"
    assert "ten" in (patched_tree / "vllm/loader.py").read_text()
    assert "ten" not in (pristine_tree / "vllm/loader.py").read_text()
"""


def invoke(*args):
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def store(builder):
    def make(version: str):
        variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
        patch = builder.add("vllm", "good", variants={"1.0": variant}, extra_meta={"smoke": {"env": "test"}})
        (patch / "checks").mkdir()
        (patch / "checks" / "test_good.py").write_text(CHECK.format(version=version))
        return builder.root

    return make


@pytest.fixture
def nightly(tmp_path):
    files = {path: text.encode() for path, text in PRISTINE.items()}
    (tmp_path / "abc1234").mkdir()
    wheel = build_dev_wheel(tmp_path / "abc1234", DEV, files)
    with NightlyIndex(tmp_path) as server:
        server.publish("abc1234", wheel)
        yield server, wheel


def test_smoke_runs_on_the_nightly_wheel(nightly, store, fresh_cache):
    server, wheel = nightly
    code, doc = invoke(
        "smoke", "vllm@nightly", "--nightly-source", server.url, "--store", str(store(DEV)), "--python", sys.executable
    )
    assert code == 0, doc
    assert doc["version"] == DEV
    (result,) = doc["results"]
    assert result["status"] == "passed" and result["passed"] == 1
    # the index publishes no hash: the tree is keyed by the wheel as fetched, which RECORD vouched for
    assert doc["source"]["kind"] == "nightly"
    assert doc["source"]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()


def test_smoke_runs_on_a_git_ref(tmp_path, store, fresh_cache):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_tree(repo, {path: text.encode() for path, text in PRISTINE.items()})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release")
    git(repo, "tag", "v1.1")
    code, doc = invoke("smoke", "vllm@git:v1.1", "--repo", str(repo), "--store", str(store("1.1")), "--python", sys.executable)
    assert code == 0, doc
    (result,) = doc["results"]
    assert result["status"] == "passed"
    assert doc["source"]["kind"] == "git" and doc["source"]["sha256"] == git(repo, "rev-parse", "HEAD").strip()


def test_smoke_of_a_directory_says_what_it_needs(tmp_path, store):
    (tmp_path / "vllm").mkdir()
    code, doc = invoke("smoke", f"vllm@{tmp_path}", "--store", str(store("1.0")), "--as-version", "1.0")
    assert code == 2 and "smoke checks need" in doc["error"]["message"]


def test_matrix_nightly_row_carries_its_smoke(nightly, store, tmp_path, fresh_cache):
    server, _ = nightly
    out = tmp_path / "nightly.yaml"
    code, doc = invoke(
        "matrix",
        "--engine",
        "vllm",
        "--version",
        "nightly",
        "--smoke",
        "--nightly-source",
        server.url,
        "--store",
        str(store(DEV)),
        "--python",
        sys.executable,
        "-o",
        str(out),
    )
    assert code == 0, doc
    data = yaml.safe_load(out.read_text())["engines"]["vllm"]
    assert list(data["versions"]) == ["nightly"]  # --version nightly: no release rows
    row = data["versions"]["nightly"]
    assert row["version"] == DEV and data["nightly"].startswith("ran on")
    cell = row["patches"]["good"]
    assert cell["smoke"] == {"status": "passed", "reason": "1 passed"}
    assert cell["evidence"] == "applies + CPU checks passed"
