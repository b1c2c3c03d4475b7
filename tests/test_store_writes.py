"""Nothing writes into the installed tool (issue 24 item 4): rebase, resolve and pin write only into the
stores a user names; a bundled patch rebased goes into the user's store as an `overrides: true` copy,
and an installed patchctl's bundled patch set is never written, named or not."""

import hashlib
from pathlib import Path

import pytest
import yaml
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json


def digest_tree(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        h.update(str(path.relative_to(root)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def installed_bundled(tmp_path, builder, monkeypatch):
    """A bundled patch set as an installed patchctl has it (site-packages/patchctl/bundled/), holding one
    patch `shift` whose 1.0 variant applies to 1.1 only with moved lines (so rebase refreshes it)."""
    shifted = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten patched\n"})})
    builder.add("vllm", "shift", variants={"1.0": shifted})
    bundled = tmp_path / "site-packages" / "patchctl" / "bundled"
    bundled.parent.mkdir(parents=True)
    builder.root.rename(bundled)
    (bundled / "envs").mkdir()
    monkeypatch.setattr("patchctl.core.bundled.bundled_store", lambda: bundled)
    monkeypatch.setenv("PATCHCTL_BUNDLED", "1")  # the layering itself is under test
    files = tmp_path / "files"
    files.mkdir()
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        server.add(
            "vllm",
            build_wheel(
                files,
                "vllm",
                "1.1",
                dict(PRISTINE, **{"vllm/loader.py": "# a header line upstream\n" + PRISTINE["vllm/loader.py"]}),
            ),
        )
        yield bundled, server


def test_rebase_puts_a_bundled_patch_into_the_users_store_as_an_override(installed_bundled, tmp_path, fresh_cache):
    bundled, server = installed_bundled
    before = digest_tree(bundled)
    mine = tmp_path / "mine"
    mine.mkdir()
    doc = run_json("rebase", "vllm", "--onto", "1.1", "--from", "1.0", "--store", str(mine), "--index-url", server.url, expect=0)
    assert [(i["name"], i["classification"]) for i in doc["items"]] == [("shift", "refreshed")]
    assert digest_tree(bundled) == before  # was: 1.1.patch and a new series.yaml inside site-packages
    meta = yaml.safe_load((mine / "vllm/shift/patch.yaml").read_text())
    assert meta["overrides"] is True
    series = yaml.safe_load((mine / "vllm/series.yaml").read_text())
    assert set(series["patches"][0]["variants"]) == {"1.0.patch", "1.1.patch"}
    # The copy is what the layered store now uses, and it checks clean on 1.1.
    listed = run_json("list", "vllm@1.1", "--store", str(mine), expect=0)["series"]
    assert [(r["name"], r["chosen_variant"], r["store"]) for r in listed] == [("shift", "1.1.patch", str(mine.resolve()))]


def test_rebase_without_a_store_of_ones_own_writes_nothing_and_says_how(installed_bundled, fresh_cache):
    bundled, server = installed_bundled
    before = digest_tree(bundled)
    doc = run_json("rebase", "vllm", "--onto", "1.1", "--from", "1.0", "--index-url", server.url, expect=2)
    assert "which patchctl does not write" in doc["error"]["message"]
    assert "--store DIR" in doc["error"]["hint"]
    assert digest_tree(bundled) == before


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
def test_pin_never_rewrites_an_installed_bundled_series(installed_bundled, named):
    bundled, _ = installed_bundled
    (bundled / "vllm/shift/1.0.patch").write_bytes((bundled / "vllm/shift/1.0.patch").read_bytes() + b"\n")
    before = digest_tree(bundled)
    doc = run_json("pin", *(["--store", str(bundled)] if named else []), expect=2)
    assert "pin rewrites the series of a store you name" in doc["error"]["message"]
    assert digest_tree(bundled) == before


def test_pin_writes_the_checkouts_bundled_set_only_when_named(tmp_path, builder, monkeypatch):
    builder.add("vllm", "shift", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "x\n"})})})
    checkout = tmp_path / "checkout" / "patches"  # a source checkout's patches/: not inside an installed package
    checkout.parent.mkdir()
    builder.root.rename(checkout)
    monkeypatch.setattr("patchctl.core.bundled.bundled_store", lambda: checkout)
    monkeypatch.setenv("PATCHCTL_BUNDLED", "1")
    variant = checkout / "vllm/shift/1.0.patch"
    variant.write_bytes(variant.read_bytes() + b"\n")
    before = digest_tree(checkout)
    run_json("pin", expect=2)
    assert digest_tree(checkout) == before
    assert run_json("pin", "--store", str(checkout), expect=0)["changed"] == ["vllm/shift"]
