"""Items 5 and 9 of issue 23, in the tree itself: a patched file that became a link inside the tree
is reverted with the mode of the file it named (not the link's 0777); one that became a link out of
the tree is named as such (not "state.json is damaged") and nothing is written through it; and bad
patch input the tree writer cannot hold (a name over NAME_MAX, a file under a file, a file over a
folder) is exit 2 before anything is written, not exit 3 from the writer."""

import os
import stat

import pytest
from hostile_cli import contents, run_cli
from support.fixtures import PRISTINE


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o640, 0o755, 0o700, 0o444])
@pytest.mark.parametrize("rel", ["vllm/loader.py", "vllm/utils.py"])
def test_reverting_an_in_tree_link_keeps_the_files_mode(case, site, store, rel, mode):
    c = case("tree: in-tree link, mode")
    assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    copy = site / "vllm/copy_of_it.py"
    os.rename(site / rel, copy)
    os.chmod(copy, mode)
    (site / rel).symlink_to(copy.name)
    out = c.record(run_cli("revert", "vllm", "--target", str(site)))
    assert out.code == 0, out
    assert not (site / rel).is_symlink() and (site / rel).read_text() == PRISTINE[rel]
    assert stat.S_IMODE((site / rel).stat().st_mode) == mode


@pytest.mark.parametrize("command", ["status", "revert", "apply"])
@pytest.mark.parametrize("rel", ["vllm/loader.py", "vllm/utils.py", "vllm/added.py"])
def test_a_patched_file_linked_out_of_the_tree_is_named_as_such(case, site, store, rel, command):
    c = case("tree: link out of the tree")
    assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    target = c.outside / "elsewhere.py"
    os.rename(site / rel, target)  # the patched bytes, now outside: status would call them "patched"
    c.before = contents(c.outside)
    (site / rel).symlink_to(target)
    extra = ["--store", str(store)] if command == "apply" else []
    out = c.record(run_cli(command, "vllm", "--target", str(site), *extra))
    assert out.code == 3 and "symlink" in out.message and "outside the tree" in out.message, out
    assert "damaged" not in out.message


def _new_file_variant(path: str) -> bytes:
    """A git format-patch mail creating `path` (written by hand: git cannot make such a tree)."""
    return (
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: patchctl <patchctl@localhost>\nDate: Sat, 1 Jan 2000 00:00:00 +0000\n"
        f"Subject: [PATCH] bad input\n\n---\n"
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n"
        f"index 0000000000000000000000000000000000000000..7d4290a117a4ddcc11daae7ea675841033830c8f\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x = 1\n"
    ).encode()


BAD = {
    "name-256": "vllm/" + "n" * 253 + ".py",
    "name-300": "vllm/" + "n" * 297 + ".py",
    "name-1000": "vllm/" + "n" * 997 + ".py",
    "dir-name-300": "vllm/" + "d" * 300 + "/x.py",
    "under-a-file": "vllm/loader.py/x.py",
    "deep-under-a-file": "vllm/utils.py/a/b.py",
    "over-a-folder": "vllm/sub",
    "over-a-full-folder": "vllm/full",
}


@pytest.mark.parametrize("command", ["apply", "ensure"])
@pytest.mark.parametrize("name", list(BAD))
def test_bad_patch_input_is_exit_2_before_anything_is_written(case, site, builder, name, command):
    c = case("tree: bad patch input")
    (site / "vllm/sub").mkdir()
    (site / "vllm/full").mkdir()
    (site / "vllm/full/keep.py").write_text("keep = 1\n")
    builder.add("vllm", "bad", variants={"1.0": _new_file_variant(BAD[name])})
    before = contents(site)
    out = c.record(run_cli(command, "vllm", "--target", str(site), "--store", str(builder.root)))
    assert out.code == 2 and "refusing" in out.message, out
    assert contents(site) == before
