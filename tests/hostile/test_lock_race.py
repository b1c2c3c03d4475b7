"""Issue 34 item 3b: a holder that leaves nothing applied removes the bookkeeping on its way out, and
must never remove what the next holder made. On the old code the holder listed .patchctl/, found only
its .gitignore and then removed the folder by name with everything in it: a concurrent `apply` that
had taken a new lock meanwhile lost its lock, blobs, journal or record (seen under load: exit 3, its
blobs deleted).

Deterministic, no timing: the holder (`status` on a pristine tree, or `revert` on an applied one) is
paused by pause_hook.py right after one step of its removal; the concurrent `apply` runs in that gap,
either to its end or up to its journal (paused there in turn until the holder has left). Every case
must end with both commands exit 0 and the tree intact by `status`, its record and .gitignore there.
On the old code the point after the listing fails every time; the others pass there too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_cli import Outcome, run_cli

PAUSE_HOOK = Path(__file__).with_name("pause_hook.py")

# name -> the hook's spec (call, path, absent) for a tree at `site`
POINTS = {
    "lock-unlinked": lambda s: {"call": "unlink", "path": f"{s}/.patchctl/vllm/lock"},
    "engine-folder-removed": lambda s: {"call": "rmdir", "path": f"{s}/.patchctl/vllm"},
    "listed-without-engine-folder": lambda s: {"call": "listdir", "path": f"{s}/.patchctl", "absent": f"{s}/.patchctl/vllm"},
    "gitignore-unlinked": lambda s: {"call": "unlink", "path": f"{s}/.patchctl/.gitignore"},
}
HOLDERS = ("status", "revert")
APPLY = ("to-the-end", "up-to-its-journal")
CASES = [(h, p, a) for h in HOLDERS for p in POINTS for a in APPLY]


def start(args: list[str], spec: dict, tmp: Path, tag: str) -> tuple[subprocess.Popen, Path, Path]:
    marker, go = tmp / f"{tag}.paused", tmp / f"{tag}.go"
    env = dict(os.environ, HOSTILE_PAUSE=json.dumps(dict(spec, marker=str(marker), go=str(go))))
    proc = subprocess.Popen(
        [sys.executable, str(PAUSE_HOOK), *args, "--json"], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    return proc, marker, go


def wait_paused(proc: subprocess.Popen, marker: Path) -> None:
    deadline = time.monotonic() + 60
    while not marker.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"finished (exit {proc.returncode}) without reaching the pause point: {out}{err[-2000:]}")
        assert time.monotonic() < deadline, "never reached the pause point in 60 s"
        time.sleep(0.02)


def finish(proc: subprocess.Popen, go: Path) -> Outcome:
    go.touch()
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Outcome("hang", None, {}, "")
    doc = json.loads(out) if out.strip() else {}
    kind = (
        "traceback"
        if "Traceback" in err or proc.returncode not in (0, 1, 2, 3)
        else "ok"
        if proc.returncode == 0
        else "clean-error"
    )
    return Outcome(kind, proc.returncode, doc, err)


@pytest.mark.parametrize("holder,point,apply_runs", CASES, ids=[f"{h}-{p}-{a}" for h, p, a in CASES])
def test_the_holder_never_removes_what_the_next_holder_made(case, site, store, tmp_path, holder, point, apply_runs):
    site = Path(os.path.realpath(site))  # as /proc/self/fd names it
    c = case("lock: cleanup race")
    if holder == "revert":
        assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    h, h_marker, h_go = start([holder, "vllm", "--target", str(site)], POINTS[point](site), tmp_path, "holder")
    try:
        wait_paused(h, h_marker)
        apply_args = ["apply", "vllm", "--target", str(site), "--store", str(store)]
        if apply_runs == "to-the-end":
            applied = c.record(run_cli(*apply_args, timeout=60))
            held = c.record(finish(h, h_go))
        else:
            journal = {"call": "replace", "path": f"{site}/.patchctl/vllm/journal.json"}
            a, a_marker, a_go = start(apply_args, journal, tmp_path, "apply")
            try:
                wait_paused(a, a_marker)
                held = c.record(finish(h, h_go))  # the holder leaves while apply is mid-write
            finally:
                applied = c.record(finish(a, a_go))
    finally:
        if h.poll() is None:
            h.kill()
            h.communicate()
    assert held.code == 0, held
    assert applied.code == 0, (applied.message, applied.stderr[-2000:])
    status = c.record(run_cli("status", "vllm", "--target", str(site)))
    assert status.doc.get("state") == "intact", status.doc.get("message")
    assert {p["name"] for p in status.doc["applied"]} == {"loader", "utils"}
    assert (site / ".patchctl/.gitignore").is_file(), "the .gitignore of the next holder's folder is gone"
    assert not (site / ".patchctl/vllm/journal.json").exists()


def has_open(pid: int, path: Path) -> bool:
    """The process `pid` holds the file at `path` open (patchctl waits for a lock with LOCK_NB and
    short sleeps, so /proc/locks shows no waiter: an open descriptor of the lock file shows it)."""
    want = os.stat(path)
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            return True
    return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see a process wait for a lock")
@pytest.mark.parametrize("holder", HOLDERS)
@pytest.mark.parametrize("third", ["apply", "status", "revert"])
def test_a_waiter_blocked_on_the_removed_lock_takes_the_new_one(case, site, store, tmp_path, holder, third):
    """The waiter side, without timing: the holder is paused while it holds the lock (its first look
    into the engine's folder); an `apply --wait 30` is started and seen holding that very lock file
    open (waiting for its flock); the holder goes on, removes the lock and the folders and leaves.
    The waiter's flock then succeeds on a file no longer linked: it must lock the file at the path
    instead. Paused in turn at its journal, it must exclude a third command (exit 3, "another
    patchctl"): a waiter that kept the unlinked lock would let it in, mid-write."""
    site = Path(os.path.realpath(site))
    c = case("lock: waiter on a removed lock")
    if holder == "revert":
        assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    spec = {"call": "listdir", "path": f"{site}/.patchctl/vllm"}
    h, h_marker, h_go = start([holder, "vllm", "--target", str(site)], spec, tmp_path, "holder")
    w = None
    try:
        wait_paused(h, h_marker)
        journal = {"call": "replace", "path": f"{site}/.patchctl/vllm/journal.json"}
        w, w_marker, w_go = start(
            ["apply", "vllm", "--target", str(site), "--store", str(store), "--wait", "30"], journal, tmp_path, "waiter"
        )
        deadline = time.monotonic() + 30
        while not has_open(w.pid, site / ".patchctl/vllm/lock"):
            assert w.poll() is None and time.monotonic() < deadline, "the waiter never waited for the lock"
            time.sleep(0.02)
        held = c.record(finish(h, h_go))
        wait_paused(w, w_marker)  # the waiter holds the lock, mid-write
        third_args = [third, "vllm", "--target", str(site), "--wait", "0"]
        if third == "apply":
            third_args += ["--store", str(store)]
        excluded = c.record(run_cli(*third_args))
        waited = c.record(finish(w, w_go))
    finally:
        for proc in (h, w):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert held.code == 0, held
    assert excluded.code == 3 and "another patchctl" in excluded.message, excluded
    assert waited.code == 0, (waited.message, waited.stderr[-2000:])
    status = c.record(run_cli("status", "vllm", "--target", str(site)))
    assert status.doc.get("state") == "intact", status.doc.get("message")


@pytest.mark.parametrize("holder", HOLDERS)
def test_a_waiter_whose_lock_is_removed_as_it_opens_it_takes_the_new_one(case, site, store, tmp_path, holder):
    """The cleanup race one step earlier (CI, 2026-12-04: `status --wait 30` exit 3, "lock has 0 hard
    links"): a waiter opens the lock, and before it checks the file the holder removes it and leaves.
    The file it holds open then has no link at all: that is the holder's cleanup, not a planted hard
    link, and the waiter must open the lock that is there now (exit 0), not refuse the tree."""
    site = Path(os.path.realpath(site))
    c = case("lock: waiter on a removed lock")
    if holder == "revert":
        assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    spec = {"call": "listdir", "path": f"{site}/.patchctl/vllm"}
    h, h_marker, h_go = start([holder, "vllm", "--target", str(site)], spec, tmp_path, "holder")
    w = None
    try:
        wait_paused(h, h_marker)
        opened = {"call": "open", "path": f"{site}/.patchctl/vllm/lock"}
        w, w_marker, w_go = start(["status", "vllm", "--target", str(site), "--wait", "30"], opened, tmp_path, "waiter")
        wait_paused(w, w_marker)  # the waiter holds the lock file open, unchecked
        held = c.record(finish(h, h_go))  # the holder removes it and leaves
        assert not (site / ".patchctl/vllm/lock").exists()
        waited = c.record(finish(w, w_go))
    finally:
        for proc in (h, w):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert held.code == 0, held
    assert waited.code == 0, (waited.message, waited.stderr[-2000:])
    assert waited.doc.get("state") == "not-applied", waited.doc
