"""The record is the contract for `apply` too (issue 34, item 3a): after a patch was captured into a
store of the user's (`new --store mine`), `apply` with none of --store/--patch/--exclude re-applies
what the record names, as `ensure` does; and when the command line does change the set, every patch
that leaves the tree is named (--json `removed`, a warning in the text), --dry-run included."""

from __future__ import annotations

from click.testing import CliRunner
from support.builders import install_fake_dist
from support.fixtures import PRISTINE, four_release_index, loader_with
from support.invoke import run_json

EDIT2 = PRISTINE["vllm/utils.py"] + "# edit2, by hand\n"
LOADER = loader_with({10: "ten\n"})


def _text(*args: str) -> tuple[int, str]:
    from patchctl.cli.main import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_apply_without_store_keeps_a_captured_patch_and_a_change_of_set_names_what_leaves(tmp_path, builder, monkeypatch):
    with four_release_index(tmp_path, builder) as server:
        site, mine = tmp_path / "site", tmp_path / "mine"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        # The user's everyday store comes from the environment (as the bundled set would): no --store.
        monkeypatch.setenv("PATCHCTL_STORE", str(builder.root))
        common = ["--target", str(site), "--index-url", server.url]
        run_json("apply", "vllm", *common, expect=0)
        (site / "vllm/utils.py").write_text(EDIT2)
        run_json("new", "vllm", "edit2", *common, "--store", str(mine), "--title", "t", "--why", "w", expect=0)
        assert run_json("ensure", "vllm", *common, "--store", str(mine), expect=0)["written"] == []

        # The README's first example again, with no --store: the record's stores and choice are kept.
        doc = run_json("apply", "vllm", *common, "--dry-run", expect=0)
        assert doc["removed"] == [] and {p["name"] for p in doc["patches"]} == {"loader", "edit2"}, doc
        doc = run_json("apply", "vllm", *common, expect=0)
        assert doc["removed"] == [] and doc["written"] == [], doc
        assert {p["name"] for p in doc["patches"]} == {"loader", "edit2"}
        assert (site / "vllm/utils.py").read_text() == EDIT2
        assert (site / "vllm/loader.py").read_text() == LOADER

        # --store names the stores: edit2's is not among them, so edit2 leaves, and is named first.
        explicit = [*common, "--store", str(builder.root)]
        doc = run_json("apply", "vllm", *explicit, "--dry-run", expect=0)
        assert doc["removed"] == ["edit2"], doc
        assert any("edit2" in w for w in doc["warnings"]), doc
        assert (site / "vllm/utils.py").read_text() == EDIT2  # a dry run writes nothing
        code, text = _text("apply", "vllm", *explicit, "--dry-run")
        assert code == 0 and "edit2" in text, text
        doc = run_json("apply", "vllm", *explicit, expect=0)
        assert doc["removed"] == ["edit2"] and doc["written"] == ["vllm/utils.py"], doc
        assert any("edit2" in w for w in doc["warnings"]), doc
        assert (site / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]
        assert (site / "vllm/loader.py").read_text() == LOADER
        status = run_json("status", "vllm", "--target", str(site), expect=0)
        assert {p["name"] for p in status["applied"]} == {"loader"}


def test_a_recorded_store_that_is_gone_stops_ensure_and_apply_names_what_leaves_with_it(tmp_path, builder, monkeypatch):
    """ensure refuses (exit 3); apply, the explicit way to change the set, takes the patch out and says
    why, in the dry run first."""
    import shutil

    with four_release_index(tmp_path, builder) as server:
        site, mine = tmp_path / "site", tmp_path / "mine"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        monkeypatch.setenv("PATCHCTL_STORE", str(builder.root))
        common = ["--target", str(site), "--index-url", server.url]
        run_json("apply", "vllm", *common, expect=0)
        (site / "vllm/utils.py").write_text(EDIT2)
        run_json("new", "vllm", "edit2", *common, "--store", str(mine), "--title", "t", "--why", "w", expect=0)
        shutil.move(mine, tmp_path / "elsewhere")
        assert run_json("ensure", "vllm", *common, expect=3)["error"]["kind"] == "record-unmet"
        doc = run_json("apply", "vllm", *common, "--dry-run", expect=0)
        assert doc["removed"] == ["edit2"] and (site / "vllm/utils.py").read_text() == EDIT2, doc
        assert any("edit2" in w and "is gone" in w for w in doc["warnings"]), doc["warnings"]
        doc = run_json("apply", "vllm", *common, expect=0)
        assert doc["removed"] == ["edit2"] and doc["written"] == ["vllm/utils.py"], doc
        assert (site / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]
        assert run_json("ensure", "vllm", *common, expect=0)["written"] == []


def test_a_smaller_choice_names_the_patches_it_takes_out(tmp_path, builder):
    """--exclude takes an applied patch out; the document says which, in the dry run as well."""
    from support.builders import write_tree

    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": LOADER})})
    builder.add(
        "vllm",
        "utils",
        variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": PRISTINE["vllm/utils.py"].replace("return 2", "return 3")})},
    )
    tree = write_tree(tmp_path / "tree", PRISTINE)
    common = ["vllm@1.0", "--target", str(tree), "--store", str(builder.root)]
    assert run_json("apply", *common, expect=0)["removed"] == []
    doc = run_json("apply", *common, "--exclude", "utils", "--dry-run", expect=0)
    assert doc["removed"] == ["utils"] and doc["written"] == [], doc
    assert (tree / "vllm/utils.py").read_text() != PRISTINE["vllm/utils.py"]
    doc = run_json("apply", *common, "--exclude", "utils", expect=0)
    assert doc["removed"] == ["utils"] and doc["written"] == ["vllm/utils.py"], doc
    # The choice is recorded: apply with no flags keeps it, and takes nothing out.
    doc = run_json("apply", "vllm@1.0", "--target", str(tree), expect=0)
    assert doc["removed"] == [] and doc["written"] == [], doc
    assert {p["name"] for p in doc["patches"]} == {"loader"}
    status = run_json("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)
    assert status["selection"] == {"patches": None, "exclude": ["utils"]}
    assert (tree / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]
