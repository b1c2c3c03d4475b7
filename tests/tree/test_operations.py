"""Apply / status / revert / ensure on real trees: all-or-nothing, kill -9 at every write step,
locks, hardlinks, bytecode, permissions, escaping symlinks, tampered patches."""

import os
import sys
from pathlib import Path

import pytest
from support import crash_at
from support.builders import install_fake_dist
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json

PATCHED_LOADER = loader_with({10: "ten\n"})
PATCHED_UTILS = PRISTINE["vllm/utils.py"].replace("return 2", "return 3")


cli = run_json


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_apply_status_revert_roundtrip(store, tree):
    before = snapshot(tree)
    doc = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    assert [p["outcome"] for p in doc["patches"]] == ["clean", "clean"]
    assert (tree / "vllm/loader.py").read_text() == PATCHED_LOADER
    assert (tree / "vllm/added.py").read_text() == "NEW = True\n"
    st = cli("status", "vllm@1.0", "--target", str(tree), expect=0)
    assert st["state"] == "intact" and {f["status"] for f in st["files"]} == {"patched"}
    again = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    assert [p["outcome"] for p in again["patches"]] == ["already-applied", "already-applied"]
    assert again["written"] == []
    cli("revert", "vllm@1.0", "--target", str(tree), expect=0)
    assert snapshot(tree) == before
    assert cli("status", "vllm@1.0", "--target", str(tree), expect=0)["state"] == "not-applied"


def test_all_or_nothing_on_conflict(builder, tree):
    builder.add("vllm", "good", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": PATCHED_LOADER})})
    other = dict(PRISTINE, **{"vllm/utils.py": "something else\n"})
    builder.add("vllm", "bad", variants={"1.0": builder.variant(other, {"vllm/utils.py": "x\n"})})
    before = snapshot(tree)
    doc = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(builder.root), expect=1)
    assert [p["outcome"] for p in doc["patches"]] == ["clean", "conflict"]
    assert "nothing was written" in doc["error"]["message"]
    assert snapshot(tree) == before
    kept = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(builder.root), "--keep-going", expect=1)
    assert kept["written"] == ["vllm/loader.py"]
    assert (tree / "vllm/loader.py").read_text() == PATCHED_LOADER


STEPS = ["journal", "file:1", "file:2", "file:3", "state"]


@pytest.mark.parametrize("step", STEPS)
def test_killed_apply_recovers_to_pristine(store, tree, step):
    before = snapshot(tree)
    proc = crash_at.run(step, ["apply", "vllm@1.0", "--target", str(tree), "--store", str(store)])
    assert proc.returncode == -9, proc.stderr  # really killed by SIGKILL mid-write
    st = cli("status", "vllm@1.0", "--target", str(tree))
    assert st["state"] == "not-applied" and "recovered" in st["message"]
    assert snapshot(tree) == before
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    assert (tree / "vllm/loader.py").read_text() == PATCHED_LOADER


@pytest.mark.parametrize("step", ["journal", "file:2"])
def test_killed_revert_recovers_to_fully_applied(store, tree, step):
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    applied = snapshot(tree)
    proc = crash_at.run(step, ["revert", "vllm@1.0", "--target", str(tree)])
    assert proc.returncode == -9
    assert cli("status", "vllm@1.0", "--target", str(tree))["state"] == "intact"
    assert snapshot(tree) == applied


def test_second_apply_fails_clearly_while_locked(store, tree):
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.tree.target import Target

    target = Target(get_engine("vllm"), tree.resolve(), Version("1.0"), "test")
    with target.state().locked():
        doc = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=3)
    assert "another patchctl" in doc["error"]["message"]


def test_hardlinked_files_are_replaced_not_written_through(store, tree, tmp_path):
    cache_copy = tmp_path / "uv-cache-loader.py"
    os.link(tree / "vllm/loader.py", cache_copy)
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    assert cache_copy.read_text() == PRISTINE["vllm/loader.py"]
    assert (tree / "vllm/loader.py").read_text() == PATCHED_LOADER


def test_stale_bytecode_removed(store, tree):
    cache = tree / "vllm/__pycache__"
    cache.mkdir()
    (cache / "loader.cpython-311.pyc").write_bytes(b"stale")
    (cache / "__init__.cpython-311.pyc").write_bytes(b"keep")
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    assert not (cache / "loader.cpython-311.pyc").exists()
    assert (cache / "__init__.cpython-311.pyc").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions, so a read-only tree cannot be simulated")
def test_read_only_target(store, tree):
    os.chmod(tree / "vllm", 0o555)
    try:
        doc = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=3)
        assert "permission denied" in doc["error"]["message"]
    finally:
        os.chmod(tree / "vllm", 0o755)


def test_read_only_target_as_root_via_immutable_check(store, tree, monkeypatch):
    """As root, permissions do not stop writes; simulate the failed write itself and check rollback."""
    from patchctl.tree.bookkeeping import journal

    before = snapshot(tree)
    real_put = journal.replace_file
    calls = {"n": 0}

    def failing_put(place, rel, *args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise PermissionError(13, "Permission denied", str(place.root / rel))
        return real_put(place, rel, *args)

    monkeypatch.setattr(journal, "replace_file", failing_put)
    doc = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=3)
    assert "nothing was changed" in doc["error"]["message"]
    monkeypatch.setattr(journal, "replace_file", real_put)
    assert snapshot(tree) == before


def test_symlink_escaping_the_root_is_refused(store, tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "loader.py").write_text(PRISTINE["vllm/loader.py"])
    (tree / "vllm/loader.py").unlink()
    (tree / "vllm/loader.py").symlink_to(outside / "loader.py")
    doc = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=2)
    assert "outside" in doc["error"]["message"]
    assert (outside / "loader.py").read_text() == PRISTINE["vllm/loader.py"]


def test_tampered_patch_refused_unless_allowed(store, tree):
    variant = store / "vllm/loader/1.0.patch"
    variant.write_bytes(variant.read_bytes().replace(b"+ten", b"+TEN"))
    doc = cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=2)
    assert "was modified" in doc["error"]["message"]
    assert (tree / "vllm/loader.py").read_text() == PRISTINE["vllm/loader.py"]
    cli("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), "--allow-modified", expect=0)
    assert "TEN" in (tree / "vllm/loader.py").read_text()


def test_installed_engine_wiped_by_upgrade_then_ensure(store, tmp_path, monkeypatch):
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    py = ["--python", sys.executable]
    assert cli("apply", "vllm", *py, "--store", str(store), expect=0)["version"] == "1.0"
    assert cli("ensure", "vllm", *py, "--store", str(store), expect=0)["note"] == "patches intact: nothing to do"
    # pip install --force-reinstall: same version, pristine files back
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    st = cli("status", "vllm", *py, expect=1)
    assert st["state"] == "wiped" and "reinstalled" in st["message"]
    doc = cli("ensure", "vllm", *py, "--store", str(store), expect=0)
    assert doc["state_before"] == "wiped" and (site / "vllm/loader.py").read_text() == PATCHED_LOADER
    # pip install -U: a new version
    (site / "vllm-1.0.dist-info").rename(site / "vllm-1.1.dist-info")
    (site / "vllm-1.1.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 1.1\n")
    install_fake_dist(site, "vllm", "1.1", PRISTINE)
    assert cli("status", "vllm", *py, expect=1)["state"] == "version-changed"
    assert cli("ensure", "vllm", *py, "--store", str(store), expect=0)["state_before"] == "version-changed"
    # a hand edit is drift, not an upgrade: ensure refuses
    (site / "vllm/loader.py").write_text("hand edit\n")
    assert cli("ensure", "vllm", *py, "--store", str(store), expect=1)["state"] == "modified"


def test_engine_not_installed_and_version_mismatch(store, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "empty"))
    doc = cli("apply", "vllm", "--python", sys.executable, "--store", str(store), expect=3)
    assert "not installed" in doc["error"]["message"]
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    doc = cli("apply", "vllm@2.0", "--python", sys.executable, "--store", str(store), expect=2)
    assert "1.0 is installed" in doc["error"]["message"] and "--install" in doc["error"]["hint"]


def test_leftover_corrupt_journal_is_never_trusted(store, tree):
    """Was: a truncated journal was taken to mean "nothing was touched" (a half-patched tree then
    passed for pristine). The journal is written atomically, so a damaged one is damage: an error
    naming the file and the way out, and nothing written."""
    cli("status", "vllm@1.0", "--target", str(tree), expect=0)
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.tree.target import Target

    st = Target(get_engine("vllm"), tree.resolve(), Version("1.0"), "t").state()
    st.dir.mkdir(parents=True, exist_ok=True)
    st.journal_file.write_text("{truncated")

    def files():  # the empty lock file the first command makes to take the lock aside
        return {k: v for k, v in snapshot(tree).items() if not k.endswith("/lock")}

    before = files()
    for command in (
        ["apply", "vllm@1.0", "--store", str(store)],
        ["status", "vllm@1.0"],
        ["revert", "vllm@1.0"],
        ["ensure", "vllm@1.0", "--store", str(store)],
    ):
        doc = cli(*command, "--target", str(tree), expect=3)
        assert doc["error"]["kind"] == "state-damaged" and str(st.journal_file) in doc["error"]["message"]
        assert "--from-release" in doc["error"]["hint"]
    assert files() == before
