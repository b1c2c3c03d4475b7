"""Counts and words say what happened (issue 36, item 6): a patch the record keeps as obsolete or
upstreamed was never written, so `status` does not count it as applied (it said "3 patches applied
and intact (loader)", naming one), and ensure's table does not call it "recorded as applied"."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json

FIXED_UTILS = PRISTINE["vllm/utils.py"].replace("return 2", "return 3")


@pytest.fixture
def mixed(builder, tree):
    """On 1.0: `loader` applies, `old` is obsolete (applies_to <1.0), `up` is upstreamed (the tree
    has its change already)."""
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    builder.add(
        "vllm",
        "old",
        applies_to="<1.0",
        variants={"0.9": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({12: "twelve\n"})})},
    )
    builder.add("vllm", "up", variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": FIXED_UTILS})})
    (tree / "vllm/utils.py").write_text(FIXED_UTILS)
    doc = run_json("apply", "vllm@1.0", "--target", str(tree), "--store", str(builder.root), expect=0)
    assert {p["name"]: p["outcome"] for p in doc["patches"]} == {"loader": "clean", "old": "obsolete", "up": "upstreamed"}
    return builder.root


def test_status_counts_only_the_applied_patches_and_lists_the_rest_by_outcome(mixed, tree):
    doc = run_json("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)
    assert doc["state"] == "intact"
    assert [p["name"] for p in doc["applied"]] == ["loader"]
    assert {p["name"]: p["outcome"] for p in doc["not_applied"]} == {"old": "obsolete", "up": "upstreamed"}
    assert doc["message"].startswith("1 patch applied and intact (loader); not applied: ")
    assert "1 obsolete (old)" in doc["message"] and "1 upstreamed (up)" in doc["message"]


def test_status_text_names_a_store_only_for_applied_patches(mixed, tree):
    from patchctl.cli.main import main

    result = CliRunner().invoke(main, ["status", "vllm", "--target", str(tree), "--as-version", "1.0"])
    assert result.exit_code == 0, result.output
    assert "1 patch applied and intact (loader)" in result.stdout
    # A per-patch line "NAME: VARIANT from STORE" is for what is on the tree.
    assert f"loader: 1.0.patch from {mixed}" in result.stdout
    assert "old: -" not in result.stdout and f"up: 1.0.patch from {mixed}" not in result.stdout


def test_ensure_does_not_call_an_obsolete_or_upstreamed_patch_applied(mixed, tree):
    doc = run_json("ensure", "vllm@1.0", "--target", str(tree), expect=0)
    reasons = {p["name"]: (p["outcome"], p["reason"]) for p in doc["patches"]}
    assert reasons["loader"] == ("already-applied", "recorded as applied, and every file it wrote is intact")
    for name, outcome in (("old", "obsolete"), ("up", "upstreamed")):
        assert reasons[name][0] == outcome
        assert "recorded as applied" not in reasons[name][1] and "nothing of it was written" in reasons[name][1]
