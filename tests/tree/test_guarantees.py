"""The promises of docs/guarantees.md, one regression test per finding of the trustworthy-writes
issue (reproduced on the old code first), on real trees: a fake pip install with a real RECORD, real
processes killed with SIGKILL, real file ownership and bytecode."""

import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import crash_at
from support.builders import install_fake_dist, write_tree
from support.fixtures import PRISTINE, four_release_index, loader_with
from support.invoke import run_json

PATCHED_LOADER = loader_with({10: "ten\n"})
PATCHED_UTILS = PRISTINE["vllm/utils.py"].replace("return 2", "return 3")
cli = run_json


@pytest.fixture
def site(tmp_path):
    """vllm 1.0 as pip leaves it: the files and a dist-info whose RECORD hashes them."""
    root = tmp_path / "site"
    install_fake_dist(root, "vllm", "1.0", PRISTINE)
    return root


def files(root: Path) -> dict:
    """The tree's files, without patchctl's bookkeeping."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and ".patchctl" not in p.parts
    }


def state_dir(root: Path) -> Path:
    return root / ".patchctl" / "vllm"


# 1. ensure re-applied an intact series on every run ------------------------------------------


def test_ensure_on_an_intact_target_writes_nothing_however_often(store, site):
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    applied = files(site)
    for _ in range(3):
        doc = cli("ensure", "vllm", "--target", str(site), "--store", str(store), expect=0)
        assert doc["written"] == [] and doc["note"] == "patches intact: nothing to do"
        again = cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)  # evaluates
        assert again["written"] == [] and {p["outcome"] for p in again["patches"]} == {"already-applied"}
    assert files(site) == applied


def every_path(root: Path) -> dict[str, tuple]:
    """Every path under root, folders and .patchctl/ included: (mtime_ns, size, sha256 of the bytes)."""
    import hashlib

    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out[p.relative_to(root).as_posix()] = (st.st_mtime_ns, st.st_size, digest)
    out["."] = (root.stat().st_mtime_ns, None, None)
    return out


# (the command, the tree's owner: root or a service user with root running patchctl, bytecode present)
INTACT_RUNS = [
    (command, owner, pyc) for command in ("ensure", "status") for owner in ("root", "service") for pyc in (False, True)
]


@pytest.mark.parametrize("command,owner,pyc", INTACT_RUNS, ids=[f"{c}-{o}-{'pyc' if y else 'nopyc'}" for c, o, y in INTACT_RUNS])
def test_ensure_on_an_intact_target_changes_no_byte_and_no_mtime(store, site, command, owner, pyc):
    """Issue 33 item 9: ensure rewrote .patchctl/<engine>/lock with its pid on every run. On an intact
    tree `ensure` and `status` now change nothing at all under it, the bookkeeping included: every
    path's mtime, size and bytes are the same after three runs of each."""
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    if pyc:
        py_compile.compile(str(site / "vllm/loader.py"), doraise=False)  # the server imported the module
    if owner == "service":
        if os.geteuid() != 0:
            pytest.skip("giving the tree to another user needs root (CI runs as root)")
        subprocess.run(["chown", "-R", "65534:65534", str(site)], check=True)
    before = every_path(site)
    assert ".patchctl/vllm/lock" in before
    for _ in range(3):
        if command == "ensure":
            doc = cli("ensure", "vllm", "--target", str(site), "--store", str(store), expect=0)
            assert doc["written"] == [] and doc["note"] == "patches intact: nothing to do"
        else:
            assert cli("status", "vllm", "--target", str(site), expect=0)["state"] == "intact"
    after = every_path(site)
    assert after == before, [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]


def test_a_second_similar_site_is_not_patched_twice(builder, tmp_path):
    """The SGLang finding: a forward apply with fuzz found a second, similar site in the patched file."""
    block = "def check():\n    a = 1\n    b = 2\n    return a\n\n\n"
    pristine = {"vllm/__init__.py": "", "vllm/server_args.py": "# top\n" + block + "# middle\n" + block}
    patched = {
        "vllm/server_args.py": pristine["vllm/server_args.py"].replace(
            "# middle\n" + block, "# middle\n" + block.replace("    return a\n", "    guard()\n    return a\n")
        )
    }
    builder.add("vllm", "guard", variants={"1.0": builder.variant(pristine, patched)})
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", pristine)
    cli("apply", "vllm", "--target", str(site), "--store", str(builder.root), expect=0)
    once = (site / "vllm/server_args.py").read_text()
    for _ in range(3):
        cli("ensure", "vllm", "--target", str(site), "--store", str(builder.root), expect=0)
        cli("apply", "vllm", "--target", str(site), "--store", str(builder.root), expect=0)
    assert (site / "vllm/server_args.py").read_text() == once and once.count("guard()") == 1


# strict by default ------------------------------------------------------------------------------


def test_apply_refuses_fuzz_unless_allowed_and_check_warns(builder, tmp_path):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": PATCHED_LOADER})})
    fuzzy = dict(PRISTINE, **{"vllm/loader.py": loader_with({7: "seven moved\n", 13: "thirteen moved\n"})})
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", fuzzy)
    checked = cli("check", f"vllm@{site}", "--store", str(builder.root), expect=0)
    assert checked["patches"][0]["outcome"] == "fuzz"
    before = files(site)
    doc = cli("apply", "vllm", "--target", str(site), "--store", str(builder.root), expect=1)
    assert doc["patches"][0]["outcome"] == "conflict" and "--allow-fuzz" in doc["patches"][0]["reason"]
    assert files(site) == before
    done = cli("apply", "vllm", "--target", str(site), "--store", str(builder.root), "--allow-fuzz", expect=0)
    assert done["patches"][0]["outcome"] == "fuzz" and "ten\n" in (site / "vllm/loader.py").read_text()


# 3. ensure read the state without the lock and without recovering -----------------------------


def test_ensure_after_a_killed_revert_recovers_first(store, site):
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    applied = files(site)
    proc = crash_at.run("file:1", ["revert", "vllm", "--target", str(site)])
    assert proc.returncode == -9
    assert files(site) != applied  # really half-reverted
    doc = cli("ensure", "vllm", "--target", str(site), "--store", str(store), expect=0)
    assert files(site) == applied and doc["written"] == []


# 4. two dist-info folders after pip install --upgrade --target ---------------------------------


def test_two_dist_infos_the_one_matching_the_files_wins(store, tmp_path):
    site = tmp_path / "site"
    newer = dict(PRISTINE, **{"vllm/utils.py": "def helper():\n    return 10\n"})
    install_fake_dist(site, "vllm", "1.1", newer)
    install_fake_dist(site, "vllm", "1.0", PRISTINE)  # the downgrade pip did over it
    assert sorted(p.name for p in site.glob("*.dist-info")) == ["vllm-1.0.dist-info", "vllm-1.1.dist-info"]
    assert cli("status", "vllm", "--target", str(site), expect=0)["version"] == "1.0"
    (site / "vllm/utils.py").write_text("neither\n")
    doc = cli("status", "vllm", "--target", str(site), expect=2)
    assert "vllm-1.0.dist-info and vllm-1.1.dist-info" in doc["error"]["message"]


# 5. ENGINE@VERSION over the tree's own metadata --------------------------------------------------


def test_the_trees_own_version_wins_over_the_spec(store, site):
    before = files(site)
    doc = cli("ensure", "vllm@2.0", "--target", str(site), "--store", str(store), expect=2)
    assert "holds vllm 1.0, not 2.0" in doc["error"]["message"] and "--as-version" in doc["error"]["hint"]
    assert files(site) == before
    forced = cli("apply", "vllm@2.0", "--target", str(site), "--store", str(store), "--as-version", "1.0", expect=0)
    assert forced["version"] == "1.0"


# 6. temp files of a killed write are swept --------------------------------------------------------


def test_recovery_sweeps_temp_files_of_dead_processes(store, site):
    proc = crash_at.run("file:1", ["apply", "vllm", "--target", str(site), "--store", str(store)])
    assert proc.returncode == -9
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = site / "vllm" / f".utils.py.patchctl-{dead.pid}.tmp"
    stale.write_text("half a file")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = site / "vllm" / f".utils.py.patchctl-{running.pid}.tmp"  # a live writer's: never touched
        live.write_text("in progress")
        cli("status", "vllm", "--target", str(site), expect=0)
        assert not stale.exists() and live.exists()
    finally:
        running.kill()
        running.wait()
    live.unlink()
    assert (site / "vllm/loader.py").read_text() == PRISTINE["vllm/loader.py"]  # and rolled back


# 7. a corrupt or tricky record is never trusted -----------------------------------------------


@pytest.mark.parametrize("content", [b"", b"garbage", b"{}", b"[]", b'{"sha256": "00", "record": {}}'])
def test_a_damaged_record_is_an_error_naming_it(store, site, content):
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    (state_dir(site) / "state.json").write_bytes(content)
    applied = files(site)
    for command in (
        ["status", "vllm"],
        ["revert", "vllm"],
        ["apply", "vllm", "--store", str(store)],
        ["ensure", "vllm", "--store", str(store)],
    ):
        doc = cli(*command, "--target", str(site), expect=3)
        assert doc["error"]["kind"] == "state-damaged" and "state.json" in doc["error"]["message"]
        assert "--from-release" in doc["error"]["hint"]
    assert files(site) == applied


def test_an_edited_record_fails_its_checksum(store, site):
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    path = state_dir(site) / "state.json"
    path.write_text(path.read_text().replace('"vllm/loader.py"', '"/etc/passwd"'))
    doc = cli("status", "vllm", "--target", str(site), expect=3)
    assert "checksum" in doc["error"]["message"]


def test_a_path_outside_the_target_is_refused_even_with_a_valid_checksum(store, site, tmp_path):
    """Was: an absolute path in a journal entry made recovery write engine content outside the target."""
    from patchctl.tree.bookkeeping.upgrade import write_journal

    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    outside = tmp_path / "outside.py"
    for path in (str(outside), "../outside.py", "vllm/../../outside.py"):
        journal = {
            "pid": 1,
            "previous_state": None,
            "entries": [
                {
                    "path": path,
                    "before": "0" * 64,
                    "after": None,
                    "before_mtime_ns": None,
                    "before_bytecode": [],
                    "after_mtime_ns": None,
                    "after_bytecode": [],
                }
            ],
        }
        (state_dir(site) / "journal.json").write_bytes(write_journal(journal))
        doc = cli("status", "vllm", "--target", str(site), expect=3)
        assert "leaves the engine root" in doc["error"]["message"] or "outside" in doc["error"]["message"]
        assert not outside.exists()


def test_revert_from_release_is_the_way_out(tmp_path, builder, fresh_cache):
    with four_release_index(tmp_path, builder) as server:
        site = tmp_path / "site"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        common = ["--target", str(site), "--store", str(builder.root)]
        cli("apply", "vllm", *common, expect=0)
        assert (site / "vllm/loader.py").read_text() == loader_with({10: "ten\n"})
        (state_dir(site) / "state.json").write_text("{truncated")
        doc = cli("revert", "vllm", *common, "--from-release", "--index-url", server.url, expect=0)
        assert doc["restored"] == ["vllm/loader.py"]
        assert files(site) == files_of_pristine_install(tmp_path)
        assert cli("status", "vllm", "--target", str(site), expect=0)["state"] == "not-applied"


def files_of_pristine_install(tmp_path: Path) -> dict:
    clean = tmp_path / "clean"
    install_fake_dist(clean, "vllm", "1.0", PRISTINE)
    return files(clean)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_randomly_damaged_records_and_journals_give_a_patchctl_error(store, site, data):
    """Any damage to state.json or journal.json: a patchctl error (exit 3) or, where the damage left
    a valid document, a working status; never another exception."""
    from patchctl.core.errors import PatchctlError
    from patchctl.tree.bookkeeping import TargetState

    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    which = data.draw(st.sampled_from(["state.json", "journal.json"]))
    path = state_dir(site) / which
    raw = (state_dir(site) / "state.json").read_bytes()
    if which == "journal.json":
        raw = json.dumps({"sha256": "x", "journal": {"entries": [], "pid": 1}}).encode()
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, max(len(raw) - 1, 0)), st.integers(0, 255)), max_size=4))
    damaged = bytearray(raw[:cut] if data.draw(st.booleans()) else raw)
    for pos, value in flips:
        if pos < len(damaged):
            damaged[pos] = value
    path.write_bytes(bytes(damaged))
    target_state = TargetState(site, "vllm")
    try:
        target_state.recover()
        target_state.load()
    except PatchctlError:
        pass
    finally:
        (state_dir(site) / "journal.json").unlink(missing_ok=True)
        (state_dir(site) / "state.json").write_bytes(
            raw if which == "state.json" else (state_dir(site) / "state.json").read_bytes()
        )


# 8. a file the patches created is tracked for life --------------------------------------------


def test_created_files_survive_an_upgrade_in_the_record_and_revert_removes_them(store, site):
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    assert (site / "vllm/added.py").exists()
    # pip install -U to 1.1: its files back, a new dist-info; pip never removes added.py
    (site / "vllm-1.0.dist-info").rename(site / "vllm-1.1.dist-info")
    (site / "vllm-1.1.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 1.1\n")
    write_tree(site, PRISTINE)
    doc = cli("ensure", "vllm@1.1", "--target", str(site), "--store", str(store), expect=0)
    assert doc["state_before"] == "version-changed"
    record = cli("status", "vllm", "--target", str(site), expect=0)
    assert "vllm/added.py" in [f["path"] for f in record["files"]]
    cli("revert", "vllm", "--target", str(site), expect=0)
    assert not (site / "vllm/added.py").exists()


# 9. one state per tree, whoever asks -------------------------------------------------------


def test_another_data_dir_or_path_finds_the_same_record_and_lock(store, site, tmp_path, monkeypatch):
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    monkeypatch.setenv("PATCHCTL_DATA_DIR", str(tmp_path / "another-data-dir"))
    assert cli("status", "vllm", "--target", str(site), expect=0)["state"] == "intact"
    link = tmp_path / "same-tree"
    link.symlink_to(site)
    assert cli("status", "vllm", "--target", str(link), expect=0)["state"] == "intact"
    again = cli("apply", "vllm", "--target", str(link), "--store", str(store), expect=0)
    assert again["written"] == []

    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.tree.target import Target

    with Target(get_engine("vllm"), site, Version("1.0"), "t").state().locked():
        doc = cli("apply", "vllm", "--target", str(link), "--store", str(store), expect=3)
        assert "another patchctl" in doc["error"]["message"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root (CI runs as root)")
def test_a_bind_mount_of_the_tree_sees_the_same_record_and_lock(store, site, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", str(site), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("mount --bind is not allowed in this container")
    try:
        cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
        assert cli("status", "vllm", "--target", str(mnt), expect=0)["state"] == "intact"
        assert cli("apply", "vllm", "--target", str(mnt), "--store", str(store), expect=0)["written"] == []

        from packaging.version import Version

        from patchctl.core.engines import get_engine
        from patchctl.tree.target import Target

        with Target(get_engine("vllm"), site, Version("1.0"), "t").state().locked():
            doc = cli("revert", "vllm", "--target", str(mnt), expect=3)
            assert "another patchctl" in doc["error"]["message"]
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


# 11. ownership, mode, symlinks, bytecode ----------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root (CI runs as root)")
def test_owner_and_mode_are_kept_through_apply_and_revert(store, site):
    for path in (site / "vllm").iterdir():
        os.chown(path, 4321, 4321)
    os.chmod(site / "vllm/loader.py", 0o640)
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    for rel in ("vllm/loader.py", "vllm/utils.py"):
        st_ = (site / rel).stat()
        assert (st_.st_uid, st_.st_gid) == (4321, 4321), rel
    assert (site / "vllm/loader.py").stat().st_mode & 0o777 == 0o640
    cli("revert", "vllm", "--target", str(site), expect=0)
    assert (site / "vllm/loader.py").stat().st_uid == 4321
    assert (site / "vllm/loader.py").stat().st_mode & 0o777 == 0o640


def test_a_symlinked_file_inside_the_root_is_refused(store, site):
    real = site / "vllm/loader_real.py"
    real.write_text(PRISTINE["vllm/loader.py"])
    (site / "vllm/loader.py").unlink()
    (site / "vllm/loader.py").symlink_to("loader_real.py")
    before = files(site)
    doc = cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=2)
    assert "vllm/loader.py is a symlink" in doc["error"]["message"]
    assert files(site) == before and (site / "vllm/loader.py").is_symlink()


def test_revert_puts_back_the_bytecode_that_was_there(store, site):
    """Was: revert deleted the touched modules' .pyc files (and a restored source had a new mtime)."""
    py_compile.compile(str(site / "vllm/utils.py"))
    cache = site / "vllm/__pycache__"
    (pyc,) = cache.glob("utils.*.pyc")
    pristine_pyc, pristine_mtime = pyc.read_bytes(), (site / "vllm/utils.py").stat().st_mtime_ns
    cli("apply", "vllm", "--target", str(site), "--store", str(store), expect=0)
    assert not pyc.exists()  # stale bytecode of the patched module is gone
    py_compile.compile(str(site / "vllm/utils.py"))  # Python caches the patched module's bytecode
    cli("revert", "vllm", "--target", str(site), expect=0)
    assert pyc.read_bytes() == pristine_pyc
    assert (site / "vllm/utils.py").stat().st_mtime_ns == pristine_mtime  # so the .pyc is valid again
    assert [p.name for p in cache.iterdir()] == [pyc.name]
