"""Item 1 and 11 of issue 23: whoever can write <tree>/.patchctl/ (the service user owning the venv)
cannot make a root patchctl follow a link out of it, read a FIFO or a device, trust a folder another
user made, or delete anything through a link; and a waiter's --wait survives the holder removing the
folder. Each case fails on the code before the fix (checked with PYTHONPATH at main's checkout)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_cli import Outcome, run_cli
from support import crash_at

# (what is replaced, where the link points in the outside folder)
LINKS = [
    (".patchctl", "."),  # the whole bookkeeping folder
    (".patchctl/vllm", "."),  # the reproduction: rmtree through it deleted outside/blobs
    (".patchctl/vllm/blobs", "blobs"),
    (".patchctl/vllm/state.json", "precious"),
    (".patchctl/vllm/journal.json", "precious"),
    (".patchctl/vllm/lock", "precious"),
    (".patchctl/.gitignore", "precious"),
]
COMMANDS = ["status", "apply", "ensure", "revert"]


def args(command: str, site: Path, store: Path) -> list[str]:
    extra = ["--store", str(store)] if command in ("apply", "ensure") else []
    return [command, "vllm", "--target", str(site), *extra]


def plant_link(site: Path, rel: str, to: Path) -> None:
    link = site / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(to)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("rel,points_to", LINKS, ids=[r for r, _ in LINKS])
def test_a_link_planted_in_the_bookkeeping_is_never_followed(case, site, store, rel, points_to, command):
    c = case("bookkeeping: planted link")
    plant_link(site, rel, c.outside / points_to)
    out = c.record(run_cli(*args(command, site, store)))
    if out.kind == "clean-error":
        assert out.code == 3 and "link" in out.message, out.message


FIFOS = [".patchctl/vllm/state.json", ".patchctl/vllm/journal.json", ".patchctl/vllm/lock"]


@pytest.mark.parametrize("command", ["status", "revert", "apply"])
@pytest.mark.parametrize("rel", FIFOS)
def test_a_fifo_in_place_of_a_bookkeeping_file_is_refused_not_read(case, site, store, rel, command):
    c = case("bookkeeping: FIFO")
    (site / rel).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(site / rel)
    out = c.record(run_cli(*args(command, site, store), timeout=20))
    assert out.kind == "clean-error" and out.code == 3 and "regular file" in out.message, out


def test_a_fifo_in_place_of_a_backup_is_refused_not_read(case, site, store):
    import hashlib

    from support.fixtures import PRISTINE

    assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    c = case("bookkeeping: FIFO")
    blob = site / ".patchctl/vllm/blobs" / hashlib.sha256(PRISTINE["vllm/loader.py"].encode()).hexdigest()
    blob.unlink()
    os.mkfifo(blob)
    out = c.record(run_cli("revert", "vllm", "--target", str(site), timeout=20))
    assert out.kind == "clean-error" and "regular file" in out.message, out


@pytest.mark.parametrize("which", [".patchctl", ".patchctl/vllm", ".patchctl/vllm/blobs"])
@pytest.mark.parametrize("command", ["status", "apply"])
def test_a_folder_another_user_made_is_not_trusted(case, site, store, which, command):
    """The tree is root's; a folder in its bookkeeping owned by uid 65534 (neither root nor the tree's
    owner) is refused, not read."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    for rel in (".patchctl", ".patchctl/vllm", ".patchctl/vllm/blobs"):
        (site / rel).mkdir(exist_ok=True)
    os.chown(site / which, 65534, 65534)
    c = case("bookkeeping: foreign folder")
    out = c.record(run_cli(*args(command, site, store)))
    assert out.kind == "clean-error" and out.code == 3 and "uid 65534" in out.message, out


def test_root_on_a_tree_a_service_user_owns_keeps_working(case, site, store):
    """The normal case: the venv and its bookkeeping belong to the service user; root's ensure, status
    and revert work, and leave every file the user's."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    subprocess.run(["chown", "-R", "65534:65534", str(site)], check=True)
    c = case("bookkeeping: service user's tree")
    assert c.record(run_cli("ensure", "vllm", "--target", str(site), "--store", str(store))).code == 0
    assert (site / "vllm/loader.py").stat().st_uid == 65534
    assert c.record(run_cli("status", "vllm", "--target", str(site))).doc["state"] == "intact"
    assert c.record(run_cli("revert", "vllm", "--target", str(site))).code == 0
    assert {p.stat().st_uid for p in site.rglob("*")} == {65534}


@pytest.mark.parametrize("round_", range(8))
def test_waiters_survive_the_holder_removing_the_folder(case, site, round_):
    """Item 11: 5 parallel `status --wait 30` on a pristine tree; each holder removes the bookkeeping
    folder as it leaves (nothing is applied), and every waiter still gets the lock."""
    c = case("lock: --wait")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "patchctl.cli.main", "status", "vllm", "--target", str(site), "--wait", "30", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(5)
    ]
    results = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in procs]
    for code, out, err in results:
        kind = "ok" if code == 0 else "traceback" if "Traceback" in err else "clean-error"
        c.record(Outcome(kind, code, json.loads(out) if out.strip() else {}, err))
        assert code == 0, out + err
    assert not (site / ".patchctl").exists()


# --- bookkeeping files: one link, a trusted owner (issue 33 item 4) ---------------------------------
#
# O_NOFOLLOW does not see a hard link: `ln /etc/x .patchctl/vllm/lock` made root's patchctl write its
# pid into /etc/x (the lock was opened read-write, truncated and written). Every bookkeeping file is
# made by a rename of a new file, so a real one has one link and its maker's uid; anything else is
# refused by name (exit 3) and nothing is written, in the tree or through the link.


def tree_snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root (folders too, links as links): mtime_ns, size and the bytes' sha256."""
    import hashlib

    out: dict[str, tuple] = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out[p.relative_to(root).as_posix()] = (st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid, data)
    return out


def blob_of(site: Path, text: str) -> str:
    import hashlib

    return f".patchctl/vllm/blobs/{hashlib.sha256(text.encode()).hexdigest()}"


def prepare_bookkeeping(site: Path, store: Path, which: str) -> str:
    """The tree in the state where `which` (state.json, journal.json, lock, blob) is real: applied, or
    an apply killed after its journal (journal.json); the path of that file, relative to site."""
    from support.fixtures import PRISTINE

    if which == "journal.json":
        proc = crash_at.run("file:1", ["apply", "vllm", "--target", str(site), "--store", str(store)], timeout=60)
        assert proc.returncode == -9, proc.stderr
    else:
        assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    rel = blob_of(site, PRISTINE["vllm/loader.py"]) if which == "blob" else f".patchctl/vllm/{which}"
    assert (site / rel).is_file()
    return rel


BOOKKEEPING_FILES = ["state.json", "journal.json", "lock", "blob"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("which", BOOKKEEPING_FILES)
def test_a_hard_link_in_the_bookkeeping_is_refused_and_nothing_is_written(case, site, store, which, command):
    """The file replaced by a hard link to a file outside the tree (as the tree's owner can make one
    to any file of theirs on the same file system): exit 3 naming it, the outside file untouched
    (bytes, mtime, inode), and no byte nor mtime changed anywhere in the tree."""
    rel = prepare_bookkeeping(site, store, which)
    c = case("bookkeeping: hard link")
    outside = c.outside / "precious"
    (site / rel).unlink()
    os.link(outside, site / rel)
    before, outside_before = tree_snapshot(site), outside.stat()
    out = c.record(run_cli(*args(command, site, store)))
    if which == "blob" and command != "revert":
        assert out.code == 0, out  # a backup is opened by revert alone: the others never touch it
    else:
        assert out.kind == "clean-error" and out.code == 3, out
        assert "hard link" in out.message and str(site / rel) in out.message, out.message
    assert outside.read_bytes() == b"precious\n" and outside.stat().st_mtime_ns == outside_before.st_mtime_ns
    assert tree_snapshot(site) == before


@pytest.mark.parametrize("command", ["status", "apply", "ensure"])
def test_a_hard_linked_lock_in_a_fresh_tree_is_never_truncated(case, site, store, command):
    """The issue's reproduction: no bookkeeping yet, the tree's owner makes .patchctl/vllm/ and links
    the lock to a file of the system; root's command must not write the pid into it."""
    c = case("bookkeeping: hard link")
    (site / ".patchctl/vllm").mkdir(parents=True)
    os.link(c.outside / "precious", site / ".patchctl/vllm/lock")
    out = c.record(run_cli(*args(command, site, store)))
    assert out.kind == "clean-error" and out.code == 3 and "hard link" in out.message, out
    assert (c.outside / "precious").read_bytes() == b"precious\n"


@pytest.mark.parametrize("command", ["status", "apply", "ensure", "revert"])
@pytest.mark.parametrize("which", BOOKKEEPING_FILES)
def test_a_bookkeeping_file_another_user_owns_is_not_trusted(case, site, store, which, command):
    """The tree is root's; one file of its bookkeeping belongs to uid 65534 (neither root nor the
    tree's owner): exit 3 naming it and the uid, and nothing written."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    rel = prepare_bookkeeping(site, store, which)
    os.chown(site / rel, 65534, 65534)
    c = case("bookkeeping: foreign file")
    before = tree_snapshot(site)
    out = c.record(run_cli(*args(command, site, store)))
    if which == "blob" and command != "revert":
        assert out.code == 0, out  # a backup is opened by revert alone: the others never touch it
    else:
        assert out.kind == "clean-error" and out.code == 3, out
        assert "uid 65534" in out.message and str(site / rel) in out.message, out.message
    assert tree_snapshot(site) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_the_lock_holder_is_named_though_nothing_is_written_into_the_lock(case, site, store, command):
    """The lock file stays empty; `another patchctl (pid N)` still names the holder (from /proc/locks)."""
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.tree.target import Target

    c = case("lock: held")
    with Target(get_engine("vllm"), site, Version("1.0"), "t").state().locked():
        out = c.record(run_cli(*args(command, site, store), "--wait", "0"))  # status waits 30 s by default
        assert (site / ".patchctl/vllm/lock").stat().st_size == 0
    assert out.code == 3 and "another patchctl" in out.message, out
    if os.path.exists("/proc/locks"):
        assert f"(pid {os.getpid()})" in out.message, out.message
