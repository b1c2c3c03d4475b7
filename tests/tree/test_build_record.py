"""The state record names the build it patched (version, commit, where it came from), `status` says it,
and a record that knows no build (a tree with no dist-info to read it from) still reads: `build` is null
until the next write."""

from __future__ import annotations

import json
import sys

from support.builders import install_fake_dist
from support.fixtures import PRISTINE
from support.invoke import run_json as cli

from patchctl.tree.bookkeeping.record import StateRecord, seal

NIGHTLY = "1.1.dev3+gabc123def"


def state_file(root) -> object:
    return root / ".patchctl" / "vllm" / "state.json"


def test_a_record_without_build_still_reads(store, tree):
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    raw = json.loads(state_file(tree).read_text())
    body = raw["record"]
    assert body["build"] == {
        "kind": "installed",
        "version": "1.0",
        "commit": None,
        "url": None,
        "artifact": None,
        "sha256": None,
        "record_sha256": None,
        "index_url": None,
        "spec": None,
        "installer": None,
    }
    # A record that knows no build.
    body["build"] = None
    state_file(tree).write_bytes(seal("record", body))
    doc = cli("status", "vllm@1.0", "--target", str(tree), expect=0)
    assert doc["state"] == "intact" and doc["build"] is None
    assert doc["installed_build"]["version"] == "1.0"
    assert StateRecord.from_json(body).build is None
    # The next write records the build.
    cli("revert", "vllm@1.0", "--target", str(tree), expect=0)
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    assert cli("status", "vllm@1.0", "--target", str(tree), expect=0)["build"]["version"] == "1.0"


def test_a_damaged_build_is_refused(store, tree):
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    body = json.loads(state_file(tree).read_text())["record"]
    body["build"]["commit"] = "not a sha"
    state_file(tree).write_bytes(seal("record", body))
    doc = cli("status", "vllm@1.0", "--target", str(tree), expect=3)
    assert doc["error"]["kind"] == "state-damaged" and "commit" in doc["error"]["message"]


def test_a_nightly_installed_elsewhere_is_named_from_its_dist_info(store, tmp_path, monkeypatch):
    """Installed by someone else (uv pip install from a wheel URL, or from git): its direct_url.json
    (PEP 610) and its +g<sha> name the build; a reinstall of that build keeps the record's build."""
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", NIGHTLY, PRISTINE)
    url = "https://wheels.example/abc123def/vllm-1.1.dev3%2Bgabc123def-cp38-abi3-manylinux_2_31_x86_64.whl"
    (site / f"vllm-{NIGHTLY}.dist-info" / "direct_url.json").write_text(json.dumps({"url": url, "archive_info": {}}))
    monkeypatch.setenv("PYTHONPATH", str(site))
    py = ["--python", sys.executable]
    doc = cli("apply", "vllm", *py, "--store", str(store), expect=0)
    assert doc["build"] == {
        "kind": "installed",
        "version": NIGHTLY,
        "commit": "abc123def",
        "url": url,
        "artifact": None,
        "sha256": None,
        "record_sha256": None,
        "index_url": None,
        "spec": None,
        "installer": None,
    }
    status = cli("status", "vllm", *py, expect=0)
    assert status["build"]["commit"] == "abc123def" and status["build"]["url"] == url
    # A git install: the commit comes from vcs_info, the URL is pip's git+URL@SHA.
    sha = "abc123def" + "0" * 31
    (site / f"vllm-{NIGHTLY}.dist-info" / "direct_url.json").write_text(
        json.dumps({"url": "https://git.example/vllm.git", "vcs_info": {"vcs": "git", "commit_id": sha}})
    )
    install_fake_dist(site, "vllm", NIGHTLY, PRISTINE)  # reinstalled: the patches are wiped
    assert cli("status", "vllm", *py, expect=1)["state"] == "wiped"
    doc = cli("ensure", "vllm", *py, "--store", str(store), expect=0)
    assert doc["state_before"] == "wiped"
    # The same version again: the record's build (from the first apply) is kept.
    assert cli("status", "vllm", *py, expect=0)["build"]["url"] == url
    assert cli("status", "vllm", *py, expect=0)["installed_build"]["url"] == f"git+https://git.example/vllm.git@{sha}"
    assert cli("status", "vllm", *py, expect=0)["installed_build"]["commit"] == sha
