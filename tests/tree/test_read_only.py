"""A healthy server starts (issue 24, item 3): `ensure` and `status` on a tree nothing may be written
into — a real read-only bind mount, a user without write permission — exit 0 without writing when
the tree is intact by the record's fingerprints and no interrupted write waits in it, saying so on
stderr (and in --json warnings); with a journal present, or work needed, exit 3 with the cause and the
fix. Root only (mounts, setuid); each mount is undone in a finally."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import crash_at
from support.builders import write_tree
from support.fixtures import PRISTINE
from support.invoke import as_nobody, run_json

from patchctl.cli.main import main

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: bind mounts and a switch to another user")


@contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """folder bind-mounted read-only over itself (what ProtectSystem=strict makes of a venv)."""
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(folder), str(folder)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def snapshot(tree: Path) -> dict[str, tuple[int, int]]:
    """Every file's mtime and size, the lock's included (nothing writes into it)."""
    return {str(p.relative_to(tree)): (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(tree.rglob("*")) if p.is_file()}


def text_run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_ensure_and_status_on_a_read_only_mount(store, tree):
    run_json("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    before = snapshot(tree)
    with read_only(tree):
        doc = run_json("ensure", "vllm@1.0", "--target", str(tree), expect=0)  # the recorded store
        assert doc["written"] == [] and any("Read-only file system" in w for w in doc["warnings"]), doc
        code, out, err = text_run("ensure", "vllm@1.0", "--target", str(tree))
        assert code == 0 and "Read-only file system" in err and "nothing was written" in err, (out, err)
        doc = run_json("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)
        assert doc["state"] == "intact" and any("Read-only file system" in w for w in doc["warnings"])
        # the store changed since (a patchctl upgrade): intact by the record's variant fingerprints still
        (store / "vllm/loader/patch.yaml").write_text((store / "vllm/loader/patch.yaml").read_text() + "\n")
        assert run_json("ensure", "vllm@1.0", "--target", str(tree), expect=0)["written"] == []
    assert snapshot(tree) == before


def test_work_needed_on_a_read_only_mount_is_exit_3_with_the_cause(store, tree):
    run_json("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    write_tree(tree, PRISTINE)  # pip reinstalled the engine: the patches are gone
    with read_only(tree):
        doc = run_json("ensure", "vllm@1.0", "--target", str(tree), expect=3)
        assert "Read-only file system" in doc["error"]["message"] and "needs writing" in doc["error"]["message"]
        assert "writable" in doc["error"]["hint"]
    fresh = tree.parent / "fresh"
    write_tree(fresh, PRISTINE)
    with read_only(fresh):  # nothing applied yet: the first apply needs writing too
        doc = run_json("ensure", "vllm@1.0", "--target", str(fresh), "--store", str(store), expect=3)
        assert "Read-only file system" in doc["error"]["message"]


def test_a_journal_on_a_read_only_mount_is_exit_3_naming_it(store, tree):
    proc = crash_at.run("file:1", ["apply", "vllm@1.0", "--target", str(tree), "--store", str(store)])
    assert proc.returncode == -9 and (tree / ".patchctl/vllm/journal.json").exists()
    with read_only(tree):
        for command in (["ensure", "vllm@1.0"], ["status", "vllm", "--as-version", "1.0"]):
            doc = (
                run_json(*command, "--target", str(tree), "--store", str(store), expect=3)
                if command[0] == "ensure"
                else run_json(*command, "--target", str(tree), expect=3)
            )
            assert "journal.json" in doc["error"]["message"] and "patchctl status" in doc["error"]["hint"]
    assert run_json("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)["state"] == "not-applied"


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder another user can reach (pytest's tmp_path is root's alone), owned by root."""
    base = Path(tempfile.mkdtemp(prefix="patchctl-ro-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def test_ensure_and_status_as_a_user_who_cannot_write_the_tree(shared_tmp):
    from support.builders import StoreBuilder
    from support.fixtures import loader_with

    store = shared_tmp / "store"
    b = StoreBuilder(store)
    b.add("vllm", "loader", variants={"1.0": b.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    tree = write_tree(shared_tmp / "tree", PRISTINE)
    home = shared_tmp / "home"
    home.mkdir()
    home.chmod(0o777)
    for p in [shared_tmp, *shared_tmp.rglob("*")]:
        if p.is_dir():
            p.chmod(p.stat().st_mode | stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    run_json("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    before = snapshot(tree)  # as_nobody's warm-up run as root takes the lock, writing nothing
    code, doc = as_nobody("ensure", "vllm@1.0", "--target", str(tree), home=home)
    assert code == 0 and doc["written"] == [], doc
    assert any("Permission denied" in w for w in doc["warnings"]), doc
    code, doc = as_nobody("status", "vllm", "--target", str(tree), "--as-version", "1.0", home=home)
    assert code == 0 and doc["state"] == "intact" and any("Permission denied" in w for w in doc["warnings"])
    assert snapshot(tree) == before
    write_tree(tree, PRISTINE)  # wiped: the service user cannot re-apply (the apply above loaded its modules)
    code, doc = as_nobody("ensure", "vllm@1.0", "--target", str(tree), home=home, warm=False)
    assert code == 3 and "Permission denied" in doc["error"]["message"], doc
