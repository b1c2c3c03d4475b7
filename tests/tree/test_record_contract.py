"""The record is the contract (issue 24, item 1): state.json names each applied patch, the store it
came from and the sha256 of its variant; `ensure` re-applies the recorded set from the recorded
stores with no --store, and a recorded patch or store that is gone is exit 3 naming both."""

from __future__ import annotations

import hashlib
import shutil

from support.builders import install_fake_dist
from support.fixtures import PRISTINE, four_release_index, loader_with
from support.invoke import run_json

from patchctl.core.yamlio import dump_yaml, load_yaml
from patchctl.tree.bookkeeping import TargetState

EDIT2 = PRISTINE["vllm/utils.py"] + "# edit2, by hand\n"


def _record(site):
    return TargetState(site, "vllm").load()


def _captured(tmp_path, builder):
    """apply from store A, then a hand edit captured by `new` into a user store S."""
    site, mine = tmp_path / "site", tmp_path / "mine"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    return site, mine, builder.root


def test_ensure_brings_back_a_captured_patch_from_its_recorded_store(tmp_path, builder):
    with four_release_index(tmp_path, builder) as server:
        site, mine, store_a = _captured(tmp_path, builder)
        index = ["--index-url", server.url]
        run_json("apply", "vllm", "--target", str(site), "--store", str(store_a), *index, expect=0)
        (site / "vllm/utils.py").write_text(EDIT2)
        run_json(
            "new", "vllm", "edit2", "--target", str(site), "--store", str(mine), "--title", "t", "--why", "w", *index, expect=0
        )
        record = _record(site)
        assert record.build is not None and record.build.version == "1.0"  # new keeps the build (item 5)
        by_name = {p.name: p for p in record.patches}
        assert set(by_name) == {"loader", "edit2"}
        assert by_name["edit2"].store.path == str(mine.resolve()) and by_name["edit2"].store.kind == "user"
        assert by_name["loader"].store.path == str(store_a.resolve())
        variant = mine / "vllm/edit2/1.0.patch"
        assert by_name["edit2"].sha256 == hashlib.sha256(variant.read_bytes()).hexdigest()
        assert by_name["loader"].sha256 == hashlib.sha256((store_a / "vllm/loader/1.0.patch").read_bytes()).hexdigest()

        # pip install --force-reinstall: every file back to the release's
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        doc = run_json("ensure", "vllm", "--target", str(site), *index, expect=0)
        assert {p["name"] for p in doc["patches"]} == {"loader", "edit2"}, doc
        assert (site / "vllm/utils.py").read_text() == EDIT2
        assert (site / "vllm/loader.py").read_text() == loader_with({10: "ten\n"})
        assert run_json("ensure", "vllm", "--target", str(site), *index, expect=0)["written"] == []
        assert run_json("status", "vllm", "--target", str(site), expect=0)["state"] == "intact"

        # the user's store is gone: ensure refuses to start the engine without edit2
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        shutil.move(mine, tmp_path / "elsewhere")
        doc = run_json("ensure", "vllm", "--target", str(site), *index, expect=3)
        assert doc["error"]["kind"] == "record-unmet"
        assert "edit2" in doc["error"]["message"] and str(mine.resolve()) in doc["error"]["message"]
        assert (site / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]  # nothing written

        # the store is back but edit2 is not in it any more: exit 3 naming the patch and the store
        shutil.move(tmp_path / "elsewhere", mine)
        series = load_yaml((mine / "vllm/series.yaml").read_text())
        series["patches"] = [e for e in series["patches"] if e["name"] != "edit2"]
        (mine / "vllm/series.yaml").write_text(dump_yaml(series))
        shutil.rmtree(mine / "vllm/edit2")
        doc = run_json("ensure", "vllm", "--target", str(site), *index, expect=3)
        assert doc["error"]["kind"] == "record-unmet"
        assert "edit2" in doc["error"]["message"] and str(mine.resolve()) in doc["error"]["message"]
        assert (site / "vllm/utils.py").read_text() == PRISTINE["vllm/utils.py"]

        # changing the set is an explicit apply
        doc = run_json("apply", "vllm", "--target", str(site), "--store", str(store_a), *index, expect=0)
        assert run_json("ensure", "vllm", "--target", str(site), *index, expect=0)["written"] == []
