"""A release that removes one of the files a patch edits while the others stay (vLLM 0.34.0 removed
the V1 runner's block_table.py, not the V2 one slot-mapping-bounds also fixes): `check` says
conflict, not obsolete (the fix is still needed in the files that stay), `rebase` leaves a
modify/delete conflict to resolve, and `resolve` refuses a resolution that would create the gone
file whole. A release that removes every file a patch edits is still obsolete."""

import subprocess

import pytest
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json

UTILS_FIXED = PRISTINE["vllm/utils.py"].replace("return 1", "return 10")
NO_UTILS = {k: v for k, v in PRISTINE.items() if k != "vllm/utils.py"}


@pytest.fixture
def index(tmp_path, builder, fresh_cache):
    files = tmp_path / "files"
    files.mkdir()
    builder.add(
        "vllm",
        "both",
        variants={
            "1.0": builder.variant(
                PRISTINE, {"vllm/loader.py": loader_with({20: "twenty fixed\n"}), "vllm/utils.py": UTILS_FIXED}
            )
        },
    )
    builder.add("vllm", "only-utils", variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": UTILS_FIXED})})
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        server.add("vllm", build_wheel(files, "vllm", "1.1", NO_UTILS))
        yield ["--index-url", server.url, "--store", str(builder.root)], builder.root


def test_check_says_conflict_when_part_of_a_patch_is_gone(index):
    common, _ = index
    doc = run_json("check", "vllm@1.1", *common, expect=1)
    by = {p["name"]: p for p in doc["patches"]}
    assert by["both"]["outcome"] == "conflict", by["both"]
    assert "vllm/utils.py" in by["both"]["reason"] and "vllm/loader.py is still there" in by["both"]["reason"]
    assert by["only-utils"]["outcome"] == "obsolete" and "target file gone" in by["only-utils"]["reason"]
    # and apply refuses it: nothing is dropped silently
    assert run_json("apply", "vllm@1.1", "--dry-run", *common)["ok"] is False


def test_rebase_leaves_a_modify_delete_conflict_and_resolve_needs_the_file_removed(index, tmp_path):
    common, store = index
    work = tmp_path / "w"
    doc = run_json("rebase", "vllm", "--onto", "1.1", "--workdir", str(work), *common, expect=1)
    items = {i["name"]: i for i in doc["items"]}
    assert items["only-utils"]["classification"] == "obsolete"
    both = items["both"]
    assert both["classification"] == "conflict", both
    assert both["conflict"]["gone_upstream"] == ["vllm/utils.py"]
    assert "`git rm` it in the conflict worktree" in both["reason"]

    # kept in the worktree, the gone file would be created whole by the variant: refused, nothing written
    resolve = ["resolve", "vllm", str(work), "--patch", "both", "--onto", "1.1", "--store", str(store)]
    doc = run_json(*resolve, expect=2)
    assert "vllm/utils.py is gone upstream" in doc["error"]["message"]
    assert not (store / "vllm/both/1.1.patch").exists()

    worktree = work / "conflicts/both"
    subprocess.run(["git", "-C", str(worktree), "rm", "-qf", "vllm/utils.py"], check=True)
    run_json(*resolve, expect=0)
    variant = (store / "vllm/both/1.1.patch").read_text()
    assert "+twenty fixed" in variant and "vllm/utils.py" not in variant.split("\n---\n", 1)[1]
    # resolving again (say after a refusal to write the store) finds the cherry-pick concluded: same bytes
    run_json(*resolve, expect=0)
    assert (store / "vllm/both/1.1.patch").read_text() == variant
    by = {p["name"]: p for p in run_json("check", "vllm@1.1", *common)["patches"]}
    assert by["both"]["outcome"] == "clean" and by["both"]["variant"] == "1.1.patch"
