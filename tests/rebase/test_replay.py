"""rebase on a local index of real wheels: every classification, relocation, deterministic
refresh, recorded resolutions reused only when the smoke checks pass; bisect; droppable."""

import sys

import pytest
import yaml
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json

SERVER = """import os


def pick_backend(capability):
    major = capability[0]
    if major == 9:
        return "flashmla"
    if major == 10:
        return "trtllm"
    return "triton"
"""
OVERRIDES = """class Overrides:
    def apply(self):
        pass

    def pick_backend(self, capability):
        major = capability[0]
        if major == 9:
            return "flashmla"
        if major == 10:
            return "trtllm"
        return "triton"
"""
BASE = dict(PRISTINE, **{"vllm/server.py": SERVER})
CLASH_UPSTREAM = loader_with({20: "upstream twenty\n", 30: "thirty upstreamed\n"})


def release(version):
    if version == "1.0":
        return BASE
    loader = "# header added upstream\n" + CLASH_UPSTREAM
    if version == "1.2":
        loader = "# header added upstream\n# and another\n" + CLASH_UPSTREAM
    tree = dict(PRISTINE, **{"vllm/loader.py": loader, "vllm/arg_groups/overrides.py": OVERRIDES})
    return tree


CHECK = """
def test_clash_resolution(patched_tree):
    text = (patched_tree / "vllm/loader.py").read_text()
    assert "resolved twenty" in text
"""


@pytest.fixture
def setup(tmp_path, builder):
    files = tmp_path / "files"
    files.mkdir()
    add = lambda name, change, **kw: builder.add("vllm", name, variants={"1.0": builder.variant(BASE, change)}, **kw)  # noqa: E731
    add("shift", {"vllm/loader.py": loader_with({10: "ten patched\n"})})
    add("upstream", {"vllm/loader.py": loader_with({30: "thirty upstreamed\n"})}, drop_when="upstreamed")
    clash = add("clash", {"vllm/loader.py": loader_with({20: "our twenty\n"})}, extra_meta={"smoke": {"env": "test"}})
    (clash / "checks").mkdir()
    (clash / "checks/test_clash.py").write_text(CHECK)
    add(
        "moved",
        {"vllm/server.py": SERVER.replace('return "triton"', 'return "trtllm" if major == 12 else "triton"')},
        drop_when="vllm>=1.2",
    )
    with IndexServer(files) as server:
        for version in ("1.0", "1.1", "1.2"):
            server.add("vllm", build_wheel(files, "vllm", version, release(version)))
        yield server, builder.root


run = run_json


@pytest.mark.slow  # ~45 s here (four rebases, two of them running the smoke checks)
def test_rebase_classifies_relocates_and_reuses_reviewed_resolutions(setup, tmp_path, fresh_cache):
    server, store = setup
    common = ["--index-url", server.url, "--store", str(store)]
    doc = run("rebase", "vllm", "--onto", "1.1", "--workdir", str(tmp_path / "w1"), *common, expect=1)
    items = {i["name"]: i for i in doc["items"]}
    assert {n: i["classification"] for n, i in items.items()} == {
        "shift": "refreshed",
        "upstream": "upstreamed",
        "clash": "conflict",
        "moved": "obsolete",
    }
    refreshed = (store / "vllm/shift/1.1.patch").read_bytes()
    assert b"+ten patched" in refreshed and b"@@ -8," in refreshed  # moved down one line by the header
    assert yaml.safe_load((store / "vllm/series.yaml").read_text())["patches"][0]["variants"]["1.1.patch"]
    # the conflict: a JSON report with the markers and a worktree stopped at the conflict
    conflict = items["clash"]["conflict"]
    (cfile,) = conflict["files"]
    assert cfile["path"] == "vllm/loader.py" and "<<<<<<<" in cfile["conflicts"][0]["text"]
    worktree = tmp_path / "w1/conflicts/clash"
    assert "<<<<<<<" in (worktree / "vllm/loader.py").read_text()
    # the moved code is found in its new file, re-indented, and proposed as relocated
    (proposal,) = items["moved"]["relocations"]
    assert proposal["to"] == "vllm/arg_groups/overrides.py" and proposal["status"] == "relocated"
    assert '+        return "trtllm" if major == 12 else "triton"' in proposal["diff"]

    # re-running gives byte-identical variants (deterministic export)
    (store / "vllm/shift/1.1.patch").unlink()
    run("pin", "--store", str(store))
    run("rebase", "vllm", "--onto", "1.1", "--from", "1.0", *common)
    assert (store / "vllm/shift/1.1.patch").read_bytes() == refreshed

    # a person resolves the conflict; patchctl records it (rerere, versioned in the store)
    text = (worktree / "vllm/loader.py").read_text()
    start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
    end = text.index("\n", end) + 1
    (worktree / "vllm/loader.py").write_text(text[:start] + "resolved twenty\n" + text[end:])
    run("resolve", "vllm", str(tmp_path / "w1"), "--patch", "clash", "--onto", "1.1", "--store", str(store), expect=0)
    assert b"+resolved twenty" in (store / "vllm/clash/1.1.patch").read_bytes()
    assert any((store / "vllm/rerere").rglob("postimage"))

    # the same conflict on 1.2, replayed from 1.0: the recorded resolution is reused — and kept
    # only because the patch's smoke check passes with it
    (store / "vllm/clash/1.1.patch").unlink()
    run("pin", "--store", str(store))
    doc = run("rebase", "vllm", "--onto", "1.2", "--from", "1.0", "--python", sys.executable, *common)
    clash = next(i for i in doc["items"] if i["name"] == "clash")
    assert clash["classification"] == "refreshed" and clash["resolution"] == "reused"
    assert b"+resolved twenty" in (store / "vllm/clash/1.2.patch").read_bytes()

    # and rejected when the smoke check fails with it
    (store / "vllm/clash/1.2.patch").unlink()
    run("pin", "--store", str(store))
    (store / "vllm/clash/checks/test_clash.py").write_text(CHECK.replace("resolved twenty", "something else"))
    doc = run("rebase", "vllm", "--onto", "1.2", "--from", "1.0", "--python", sys.executable, *common, expect=1)
    clash = next(i for i in doc["items"] if i["name"] == "clash")
    assert clash["classification"] == "conflict" and clash["resolution"] == "rejected"
    assert "smoke checks pass" in clash["reason"] and not (store / "vllm/clash/1.2.patch").exists()


def test_bisect_finds_first_bad_release(setup, fresh_cache):
    server, store = setup
    doc = run(
        "bisect", "vllm", "clash", "--from", "1.0", "--to", "1.2", "--index-url", server.url, "--store", str(store), expect=0
    )
    assert doc["first_bad"] == "1.1" and doc["last_good"] == "1.0"
    bad = run(
        "bisect", "vllm", "clash", "--from", "1.1", "--to", "1.2", "--index-url", server.url, "--store", str(store), expect=2
    )
    assert "expected good" in bad["error"]["message"]


def test_droppable_evaluates_rules(setup, fresh_cache):
    server, store = setup
    doc = run("droppable", "--index-url", server.url, "--store", str(store), expect=0)
    rows = {r["patch"]: r for r in doc["patches"]}
    assert rows["upstream"]["droppable"] and "reverse-apply" in rows["upstream"]["why"]
    assert rows["moved"]["droppable"] and "vllm>=1.2" in rows["moved"]["why"]
    assert not rows["shift"]["droppable"]


def test_patch_option_writes_only_the_named_patches(setup, tmp_path, fresh_cache):
    """--patch: the named patches' variants are written; the others are replayed and classified (a
    later patch is carried on top of them) but nothing is written for them, and a conflict only in one
    of those is reported without failing the command."""
    server, store = setup
    common = ["--index-url", server.url, "--store", str(store)]
    doc = run("rebase", "vllm", "--onto", "1.1", "--patch", "shift", *common, expect=0)
    items = {i["name"]: i for i in doc["items"]}
    assert items["shift"]["classification"] == "refreshed" and (store / "vllm/shift/1.1.patch").is_file()
    assert items["clash"]["classification"] == "conflict"  # reported, not the command's failure

    (store / "vllm/shift/1.1.patch").unlink()
    run("pin", "--store", str(store))
    doc = run("rebase", "vllm", "--onto", "1.1", "--patch", "clash", *common, expect=1)
    shift = next(i for i in doc["items"] if i["name"] == "shift")
    assert shift["classification"] == "refreshed" and shift["reason"].startswith("would write 1.1.patch")
    assert shift["reason"].endswith("not named by --patch") and not (store / "vllm/shift/1.1.patch").exists()

    doc = run("rebase", "vllm", "--onto", "1.1", "--patch", "nope", *common, expect=2)
    assert "no patch 'nope' in the vllm series" in doc["error"]["message"]
