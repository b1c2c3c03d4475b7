"""Choosing patches (issue 24, item 2): `apply --patch/--exclude` checked against the series and its
`depends_on`, recorded, kept by `ensure` after a wipe and shown by `status`; `revert --patch` takes one
patch out and leaves the others applied, refused while an applied patch depends on it."""

from __future__ import annotations

import pytest
from support.builders import write_tree
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json

PATCHED_LOADER = loader_with({10: "ten\n"})  # as tests/tree/conftest.py's store writes them
PATCHED_UTILS = PRISTINE["vllm/utils.py"].replace("return 2", "return 3")


@pytest.fixture
def chained(store, builder):
    """loader, utils, and loader2 (line 30 of loader.py) that depends on loader."""
    builder.add(
        "vllm",
        "loader2",
        depends_on=("loader",),
        variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({30: "thirty\n"})})},
    )
    return store


def cli(*args, expect):
    return run_json(*args, expect=expect)


def common(tree, store):
    return ["--target", str(tree), "--store", str(store)]


def test_apply_patch_brings_its_dependencies_and_ensure_keeps_the_choice(chained, tree):
    doc = cli("apply", "vllm@1.0", *common(tree, chained), "--patch", "loader2", expect=0)
    assert {p["name"] for p in doc["patches"]} == {"loader", "loader2"}
    assert doc["selection"] == {"patches": ["loader2"], "exclude": []}
    both = loader_with({10: "ten\n", 30: "thirty\n"})
    assert (tree / "vllm/loader.py").read_text() == both
    assert (tree / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]
    status = cli("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)
    assert status["state"] == "intact" and status["selection"] == {"patches": ["loader2"], "exclude": []}
    assert {p["name"] for p in status["applied"]} == {"loader", "loader2"}

    write_tree(tree, PRISTINE)  # pip reinstalled the engine
    doc = cli("ensure", "vllm@1.0", "--target", str(tree), expect=0)  # no --store, no --patch: the record's
    assert {p["name"] for p in doc["patches"]} == {"loader", "loader2"}
    assert (tree / "vllm/loader.py").read_text() == both
    assert (tree / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]
    assert cli("ensure", "vllm@1.0", "--target", str(tree), expect=0)["written"] == []

    # ensure does not change the set; apply does
    doc = cli("ensure", "vllm@1.0", "--target", str(tree), "--exclude", "utils", expect=2)
    assert "apply" in doc["error"]["hint"]
    cli("apply", "vllm@1.0", *common(tree, chained), expect=0)
    assert (tree / "vllm/utils.py").read_text() == PATCHED_UTILS


def test_unknown_names_and_broken_dependencies_are_usage_errors(chained, tree):
    doc = cli("apply", "vllm@1.0", *common(tree, chained), "--patch", "nope", expect=2)
    assert "'nope'" in doc["error"]["message"]
    doc = cli("apply", "vllm@1.0", *common(tree, chained), "--exclude", "nope", expect=2)
    assert "'nope'" in doc["error"]["message"]
    doc = cli("apply", "vllm@1.0", *common(tree, chained), "--exclude", "loader", expect=2)
    assert "loader2" in doc["error"]["message"] and "loader" in doc["error"]["message"]
    assert not (tree / ".patchctl").exists()
    assert (tree / "vllm/loader.py").read_text() == PRISTINE["vllm/loader.py"]


def test_apply_exclude_takes_an_applied_patch_out(chained, tree):
    cli("apply", "vllm@1.0", *common(tree, chained), expect=0)
    assert (tree / "vllm/added.py").exists()
    doc = cli("apply", "vllm@1.0", *common(tree, chained), "--exclude", "utils", expect=0)
    assert sorted(doc["written"]) == ["vllm/added.py", "vllm/utils.py"]
    assert (tree / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]
    assert not (tree / "vllm/added.py").exists()
    assert (tree / "vllm/loader.py").read_text() == loader_with({10: "ten\n", 30: "thirty\n"})
    status = cli("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)
    assert status["selection"] == {"patches": None, "exclude": ["utils"]}
    assert {p["name"] for p in status["applied"]} == {"loader", "loader2"}
    write_tree(tree, PRISTINE)
    cli("ensure", "vllm@1.0", "--target", str(tree), expect=0)
    assert (tree / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]
    assert (tree / "vllm/loader.py").read_text() == loader_with({10: "ten\n", 30: "thirty\n"})


def test_revert_patch_takes_one_out_and_refuses_a_dependency(chained, tree):
    cli("apply", "vllm@1.0", *common(tree, chained), expect=0)
    doc = cli("revert", "vllm@1.0", *common(tree, chained), "--patch", "loader", expect=2)
    assert "loader2" in doc["error"]["message"] and "--patch loader2" in doc["error"]["hint"]
    assert (tree / "vllm/loader.py").read_text() == loader_with({10: "ten\n", 30: "thirty\n"})
    doc = cli("revert", "vllm@1.0", "--target", str(tree), "--patch", "loader2", expect=0)  # the recorded store
    assert doc["restored"] == ["vllm/loader.py"] and doc["applied"] == ["loader", "utils"]
    assert (tree / "vllm/loader.py").read_text() == PATCHED_LOADER
    assert (tree / "vllm/utils.py").read_text() == PATCHED_UTILS
    status = cli("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)
    assert status["state"] == "intact" and {p["name"] for p in status["applied"]} == {"loader", "utils"}
    assert status["selection"] == {"patches": None, "exclude": ["loader2"]}
    write_tree(tree, PRISTINE)
    cli("ensure", "vllm@1.0", "--target", str(tree), expect=0)
    assert (tree / "vllm/loader.py").read_text() == PATCHED_LOADER
    # both out, then everything back: the pristine files byte for byte
    cli("revert", "vllm@1.0", "--target", str(tree), "--patch", "loader", "--patch", "utils", expect=0)
    assert (tree / "vllm/loader.py").read_text() == PRISTINE["vllm/loader.py"]
    assert not (tree / "vllm/added.py").exists()
    cli("revert", "vllm@1.0", "--target", str(tree), expect=0)
    assert not (tree / ".patchctl").exists()
