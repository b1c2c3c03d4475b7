"""Outcomes of the in-memory engine on small real trees and real format-patch variants."""

import json

import pytest
from packaging.version import Version
from support.builders import write_tree
from support.fixtures import PRISTINE, loader_with

from patchctl.core import outcomes as O
from patchctl.patching.evaluate import Options, evaluate
from patchctl.sources.files import DirectorySource
from patchctl.store.layered import Store
from patchctl.store.series import choose_variant

V = Version("1.0")


def run(builder, tree, version=V, **kw):
    series = Store.open(builder.root).series("vllm")
    return evaluate(series.patches, version, DirectorySource(tree), **kw)


def test_clean_then_dependent_patch_sees_first_result(builder, tree):
    first = loader_with({10: "ten\n"})
    builder.add("vllm", "one", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": first})})
    base2 = dict(PRISTINE, **{"vllm/loader.py": first})
    builder.add(
        "vllm",
        "two",
        depends_on=("one",),
        variants={"1.0": builder.variant(base2, {"vllm/loader.py": loader_with({11: "eleven\n"}, first)})},
    )
    result = run(builder, tree)
    assert [o.outcome for o in result.outcomes] == [O.CLEAN, O.CLEAN]
    (change,) = result.changes
    assert b"ten\n" in change.after and b"eleven\n" in change.after
    assert change.before == PRISTINE["vllm/loader.py"].encode()


def test_offset_fuzz_and_strict(builder, tmp_path):
    builder.add("vllm", "p", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({20: "x\n"})})})
    moved = write_tree(tmp_path / "moved", dict(PRISTINE, **{"vllm/loader.py": "new\n" + PRISTINE["vllm/loader.py"]}))
    assert run(builder, moved).outcomes[0].outcome == O.OFFSET
    fuzzy = write_tree(tmp_path / "fuzzy", dict(PRISTINE, **{"vllm/loader.py": loader_with({17: "seventeen\n"})}))
    result = run(builder, fuzzy)
    assert result.outcomes[0].outcome == O.FUZZ
    assert run(builder, fuzzy, options=Options(strict=True)).outcomes[0].outcome == O.CONFLICT


def test_upstreamed_needs_reverse_apply_proof(builder, tmp_path):
    patched = loader_with({20: "x\n"})
    builder.add("vllm", "p", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": patched})})
    upstream_has_it = write_tree(tmp_path / "up", dict(PRISTINE, **{"vllm/loader.py": patched}))
    result = run(builder, upstream_has_it)
    assert result.outcomes[0].outcome == O.UPSTREAMED and not result.changes
    marked = run(builder, upstream_has_it, options=Options(applied=frozenset({"p"})))
    assert marked.outcomes[0].outcome == O.ALREADY_APPLIED


def test_obsolete_by_range_and_by_missing_target(builder, tmp_path):
    builder.add(
        "vllm",
        "ranged",
        applies_to="<0.5",
        variants={"0.1": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({2: "y\n"})})},
    )
    builder.add("vllm", "gone", variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": "changed\n"})})
    builder.add(
        "vllm",
        "after-gone",
        depends_on=("gone",),
        variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({30: "z\n"})})},
    )
    no_utils = dict(PRISTINE)
    del no_utils["vllm/utils.py"]
    tree = write_tree(tmp_path / "t", no_utils)
    result = run(builder, tree)
    by = {o.name: o for o in result.outcomes}
    assert by["ranged"].outcome == O.OBSOLETE and "outside applies_to" in by["ranged"].reason
    assert by["gone"].outcome == O.OBSOLETE and "vllm/utils.py" in by["gone"].reason
    assert by["after-gone"].outcome == O.OBSOLETE and "depends on gone" in by["after-gone"].reason


def test_conflict_reports_hunk_and_upstream_context(builder, tmp_path):
    builder.add("vllm", "p", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({20: "x\n"})})})
    rewritten = write_tree(tmp_path / "r", dict(PRISTINE, **{"vllm/loader.py": loader_with({19: "A\n", 20: "B\n", 21: "C\n"})}))
    result = run(builder, rewritten)
    assert not result.ok and result.outcomes[0].outcome == O.CONFLICT
    (hunk,) = [h for h in result.outcomes[0].hunks if h.status == "failed"]
    assert "expected:" in hunk.context and "B" in hunk.context
    assert not result.changes


def test_three_way_merge_against_the_variant_base(builder, tmp_path):
    """Upstream rewrote context *inside* our hunk (between two changed lines): no fuzz can drop
    it, but git merge-file against the variant's base merges cleanly."""
    base = "".join(f"line {i}\n" for i in range(1, 13))
    ours_change = base.replace("line 3\n", "line 3 patched\n").replace("line 8\n", "line 8 patched\n")
    builder.add("vllm", "p", variants={"1.0": builder.variant({"vllm/a.py": base}, {"vllm/a.py": ours_change})})
    upstream_new = base.replace("line 5\n", "line 5 upstream\n").replace("line 6\n", "line 6 upstream\n")
    target = write_tree(tmp_path / "new", {"vllm/a.py": upstream_new})
    base_tree = DirectorySource(write_tree(tmp_path / "base", {"vllm/a.py": base}))
    without = run(builder, target, version=Version("1.1"))
    assert without.outcomes[0].outcome == O.CONFLICT
    merged = run(builder, target, version=Version("1.1"), base_files=lambda v: base_tree)
    assert merged.outcomes[0].outcome == O.THREE_WAY
    text = merged.changes[0].after.decode()
    assert "line 3 patched" in text and "line 8 patched" in text and "line 5 upstream" in text


def test_variant_choice_newest_base_at_or_below(builder):
    v = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({2: "y\n"})})
    builder.add("vllm", "p", applies_to=">=0.16,<0.24", variants={"0.16.0": v, "0.20.0": v, "0.23.0": v})
    patch = Store.open(builder.root).series("vllm").get("p")
    pick = lambda s: choose_variant(patch, Version(s))  # noqa: E731
    assert pick("0.19.1").variant.filename == "0.16.0.patch"
    assert pick("0.20.2").variant.filename == "0.20.0.patch"
    assert pick("0.23.0").reason.endswith("same base")
    assert pick("0.24.0").variant is None and "outside applies_to" in pick("0.24.0").reason


@pytest.mark.parametrize("path", ["evil.pth", "vllm-0.1.dist-info/RECORD", "other_pkg/x.py"])
def test_a_patch_may_only_touch_its_engines_package(builder, tmp_path, path):
    """Was: a variant adding a .pth next to the package passed check and apply (only lint flagged it)."""
    from click.testing import CliRunner

    from patchctl.cli.main import main

    builder.add("vllm", "pth", applies_to=">=1.0", variants={"1.0": builder.variant(PRISTINE, {path: "import os\n"})})
    target = write_tree(tmp_path / "t", PRISTINE)
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    for command in (
        ["check", f"vllm@{target}", "--as-version", "1.0"],
        ["apply", "vllm", "--target", str(target), "--as-version", "1.0"],
    ):
        result = CliRunner().invoke(main, [*command, "--store", str(builder.root), "--json"])
        doc = json.loads(result.stdout)
        assert result.exit_code == 2 and doc["error"]["kind"] == "store", result.stdout
        assert "may only change files inside the vllm/ package" in doc["error"]["message"]
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    assert not (target / path).exists()
    lint = CliRunner().invoke(main, ["lint", "--store", str(builder.root), "--json"])
    assert lint.exit_code == 2 and "not inside vllm/" in lint.stdout
