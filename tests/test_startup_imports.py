"""What `ensure` (ExecStartPre= on every service start), `status` and `--help` import: none of the
heavy libraries. Each runs the real entry point in a fresh interpreter, which then lists the heavy
modules present at exit."""

from __future__ import annotations

import json

import pytest
from support.builders import install_fake_dist
from support.fixtures import PRISTINE, loader_with
from support.invoke import heavy_imports as probe_heavy_imports
from support.invoke import heavy_imports_run, run_json

HEAVY = ("requests", "git", "rich", "matplotlib", "urllib3")


def heavy_imports(*argv: str) -> dict:
    return probe_heavy_imports(argv, HEAVY)


@pytest.fixture
def applied(builder, tmp_path):
    """A tree with vllm 1.0's metadata and one patch applied by `patchctl apply`."""
    variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
    builder.add("vllm", "loader", variants={"1.0": variant})
    tree = tmp_path / "site"
    install_fake_dist(tree, "vllm", "1.0", PRISTINE)
    run_json("apply", "vllm", "--target", str(tree), "--store", str(builder.root), expect=0)
    return builder.root, tree


def test_ensure_on_an_intact_target_imports_nothing_heavy(applied):
    store, tree = applied
    report = heavy_imports("ensure", "vllm", "--target", str(tree), "--store", str(store), "--json")
    assert report == {"exit": 0, "heavy": []}


def test_status_imports_nothing_heavy(applied):
    _, tree = applied
    report = heavy_imports("status", "vllm", "--target", str(tree), "--json")
    assert report == {"exit": 0, "heavy": []}


def test_revert_imports_nothing_heavy(applied):
    _, tree = applied
    report = heavy_imports("revert", "vllm", "--target", str(tree), "--json")
    assert report == {"exit": 0, "heavy": []}


def test_apply_to_a_directory_imports_nothing_heavy(builder, tmp_path):
    variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
    builder.add("vllm", "loader", variants={"1.0": variant})
    tree = tmp_path / "site"
    install_fake_dist(tree, "vllm", "1.0", PRISTINE)
    report = heavy_imports("apply", "vllm", "--target", str(tree), "--store", str(builder.root), "--json")
    assert report == {"exit": 0, "heavy": []}
    assert (tree / "vllm/loader.py").read_text() == loader_with({10: "ten\n"})


def test_help_imports_nothing_heavy():
    assert heavy_imports("--help") == {"exit": 0, "heavy": []}


@pytest.mark.parametrize("command", ["ensure", "status"])
def test_text_output_off_a_terminal_imports_nothing_heavy(applied, command):
    """systemd's journal is not a terminal: plain text, and rich is never imported."""
    store, tree = applied
    extra = ["--store", str(store)] if command == "ensure" else []
    report = heavy_imports(command, "vllm", "--target", str(tree), *extra)
    assert report == {"exit": 0, "heavy": []}


# What ensure on an intact tree must not import (issue 24, item 7: its CPU <= 2x the import floor,
# benchmarks/ensure_cpu.py): the apply engine, the check command, the network.
NOT_ON_THE_INTACT_PATH = (
    "patchctl.patching.evaluate",
    "patchctl.patching.hunks",
    "patchctl.patching.diffread",
    "patchctl.cli.commands.check",
    "patchctl.sources.http",
    "unidiff",
)


def test_ensure_on_an_intact_target_with_no_store_stays_off_the_apply_engine(applied):
    _, tree = applied  # no --store: the record names the store
    report, stdout, stderr = heavy_imports_run(["ensure", "vllm", "--target", str(tree), "--json"], NOT_ON_THE_INTACT_PATH)
    assert report == {"exit": 0, "heavy": []}, stderr[-2000:]
    assert json.loads(stdout)["written"] == []
