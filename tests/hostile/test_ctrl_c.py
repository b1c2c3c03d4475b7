"""Ctrl-C at the moments where it went wrong (issue 36, item 4), each reached deterministically by
ctrl_c_hook.py rather than by luck: a hang, a dropped interrupt, half a JSON document, a part file
left in the cache. test_ctrl_c_random.py sends hundreds of SIGINTs at random moments."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ctrl_c_cli import LIMIT, default_sigint, interrupt, launch, leftovers, make_index_files, package_dir, wait_for
from support.index_server import IndexServer


@pytest.fixture
def index(tmp_path):
    """(server, store): two vllm wheels on a local index, and a store with one patch."""
    wheels = make_index_files(tmp_path, blobs=8)
    with IndexServer(tmp_path / "files") as server:
        for wheel in wheels:
            server.add("vllm", wheel)
        yield server, tmp_path / "store"


def _check(server, store, *extra: str) -> list[str]:
    return ["check", "vllm@1.0", "--store", str(store), "--index-url", server.url, *extra, "--json"]


def _finish(proc: subprocess.Popen) -> tuple[int | None, str, str]:
    try:
        out, err = proc.communicate(timeout=LIMIT + 20)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints where every thread waits
        out, err = proc.communicate()
        return None, out, err


def test_ctrl_c_inside_the_import_system_neither_hangs_nor_is_dropped(index, tmp_path):
    """Was: a SIGINT that landed in importlib's weakref callback just after it took the import lock
    was printed as "Exception ignored" and dropped with the lock still held; the main thread went on
    to Thread.join, and check's worker waited forever for the lock (the issue's 10-minute hang). Now
    the interrupt is held while the import system runs, then raised: exit 130."""
    server, store = index
    marker = tmp_path / "marker"
    proc = launch(_check(server, store), cache=tmp_path / "cache", hook={"mode": "import-lock", "marker": str(marker)})
    code, out, err = _finish(proc)
    assert marker.exists(), f"the hook's moment never came:\n{err[-3000:]}"
    assert code == 130, f"exit {code}:\n{err[-3000:]}"
    assert "Exception ignored" not in err and "Traceback" not in err, err[-3000:]
    assert out == ""  # interrupted: no document


def test_ctrl_c_in_a_finalizer_is_not_dropped(index, tmp_path):
    """Was: a SIGINT that landed in a finalizer (`__del__`, a weakref callback) became "Exception
    ignored" and the command went on to finish with exit 0. Now it is raised again outside it."""
    server, store = index
    marker = tmp_path / "marker"
    proc = launch(_check(server, store), cache=tmp_path / "cache", hook={"mode": "finalizer", "marker": str(marker)})
    code, out, err = _finish(proc)
    assert marker.exists(), f"the hook's moment never came:\n{err[-3000:]}"
    assert code == 130, f"exit {code}, stdout {out[:200]!r}:\n{err[-3000:]}"
    assert "Exception ignored" not in err and "Traceback" not in err, err[-3000:]


def test_ctrl_c_while_the_document_is_written_leaves_it_whole(index, tmp_path):
    """Was: a SIGINT while `--json` wrote its document cut it short (exit 130, half a document on
    stdout). Now the document, the command's last act, is written whole and the command exits with its
    own code: stdout holds one document, or none when the interrupt came before it."""
    server, store = index
    marker = tmp_path / "marker"
    proc = launch(_check(server, store), cache=tmp_path / "cache", hook={"mode": "slow-output", "marker": str(marker)})
    wait_for(marker, proc)
    run = interrupt(proc)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    doc = json.loads(run.stdout)  # one whole document
    assert run.code == doc["exit_code"] == 0, (run.code, run.stderr[-2000:])


def test_a_worker_abandoned_by_ctrl_c_leaves_no_part_file(index, tmp_path):
    """Was: a Ctrl-C while check's worker thread wrote a part file into the cache (here: copying a
    `file:` wheel in) ended the process around it, and `.adopt.<pid>.part` stayed in the cache for
    good. Now the exit removes every part file still open, and does not wait for the worker."""
    server, store = index
    wheel = next((tmp_path / "files").glob("vllm-1.0-*.whl"))
    cache, marker = tmp_path / "cache", tmp_path / "marker"
    args = ["check", f"vllm@file:{wheel}", "--store", str(store), "--json"]
    proc = launch(args, cache=cache, hook={"mode": "pause-publish", "marker": str(marker)})
    wait_for(marker, proc)
    assert leftovers(cache), "the hook paused before the part file was written"
    run = interrupt(proc)
    assert run.code == 130, (run.code, run.stderr[-3000:])
    assert run.after_signal < 5, f"{run.after_signal:.1f} s: it waited for the paused worker"
    assert leftovers(cache) == []


def test_part_files_a_killed_run_left_are_swept_safely(index, tmp_path):
    """Was: a part file a killed download left stayed after the next successful download of the same
    artifact. Now that download removes the temporary files of dead processes in its folder: only
    regular files of this user, named after a pid not running here and untouched for a minute; never
    a link (nor what it names), a live process's file or a fresh one."""
    server, store = index
    wheel = next((tmp_path / "files").glob("vllm-1.0-*.whl"))
    cache = tmp_path / "cache"
    folder = cache / "verified" / hashlib.sha256(wheel.read_bytes()).hexdigest()
    folder.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    old = time.time() - 3600
    stale = [f".artifact.{dead.pid}.part", f".artifact.verified.patchctl-{dead.pid}.tmp"]
    kept = [f".artifact.{dead.pid}.part.keep", f".names.json.{os.getpid()}.part", f".RECORD.{dead.pid}.part"]
    for name in stale + kept:
        (folder / name).write_bytes(b"partial")
        os.utime(folder / name, (old, old))
    os.utime(folder / kept[2], None)  # fresh: maybe a live process of another pid namespace
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    (folder / f".link.{dead.pid}.part").symlink_to(outside)
    os.utime(folder / f".link.{dead.pid}.part", (old, old), follow_symlinks=False)

    proc = subprocess.run(
        [sys.executable, "-m", "patchctl.cli", *_check(server, store, "--verify")],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATCHCTL_CACHE_DIR=str(cache)),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert left == sorted([*kept, f".link.{dead.pid}.part"])
    assert outside.read_bytes() == b"precious"


def test_ctrl_c_during_the_interpreters_start_up_under_a_blocking_launcher(index, tmp_path):
    """The interpreter's own start-up (site's .pth files) comes before any patchctl code: a SIGINT
    there is Python's "Fatal Python error: init_import_site". A launcher can start patchctl with SIGINT
    blocked (`env --block-signal=INT patchctl ...`): the signal stays pending, and patchctl unblocks it
    once its handler is in place. Was: never unblocked, the Ctrl-C was lost and the command ran on to
    exit 0."""
    server, store = index
    env = dict(os.environ, PATCHCTL_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "patchctl.cli", *_check(server, store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=lambda: (default_sigint(), signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})),
    )
    proc.send_signal(signal.SIGINT)  # the interpreter is starting: nothing of patchctl's has run
    code, out, err = _finish(proc)
    assert (code, out, err) == (130, "", "")


def test_ctrl_c_that_python_dropped_in_its_start_up_is_not_a_hang(index, tmp_path):
    """A SIGINT in the interpreter's start-up (before any patchctl code) that lands in importlib's lock
    callback is dropped by Python with the import lock still taken: Python prints "Exception ignored",
    and was: the command went on until check's worker thread waited for the lock forever (a hang in
    Thread.join). Now patchctl's first line finds the lock taken and ends as the Ctrl-C it was."""
    server, store = index
    marker = tmp_path / "marker"
    proc = launch(_check(server, store), cache=tmp_path / "cache", hook={"mode": "start-up-lock", "marker": str(marker)})
    code, out, err = _finish(proc)
    assert marker.exists(), f"the hook's moment never came:\n{err[-3000:]}"
    assert code == 130, f"exit {code}:\n{err[-3000:]}"
    assert out == "" and package_dir() not in err, err[-3000:]  # Python's own "Exception ignored" alone


def test_ctrl_c_ends_the_process_even_when_its_unwinding_is_stuck(index, tmp_path):
    """Was: a Ctrl-C unwound the command, and a `finally` that waited (a thread pool's shutdown
    waiting for its workers, a stuck disk) kept the process alive as long as it waited. Now the
    unwinding has a grace of its own (interrupt.GRACE, 5 s): after it the process ends with 130,
    the cache's part files removed."""
    server, store = index
    marker = tmp_path / "marker"
    proc = launch(_check(server, store), cache=tmp_path / "cache", hook={"mode": "stuck-unwind", "marker": str(marker)})
    wait_for(marker, proc)
    run = interrupt(proc)
    assert run.code == 130, (run.code, run.stderr[-3000:])
    assert 4 < run.after_signal < LIMIT, run.after_signal  # the grace, then the end
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


def test_a_document_held_by_a_stuck_pipe_does_not_hold_ctrl_c_forever(index, tmp_path):
    """The document's write holds a Ctrl-C until it is whole (above); a write that never ends (stdout a
    pipe nobody reads from) must not hold it forever: GRACE after the signal the process ends, 130.
    (A guard on that hold: main raised KeyboardInterrupt into such a write.)"""
    server, store = index
    marker = tmp_path / "marker"
    proc = launch(_check(server, store), cache=tmp_path / "cache", hook={"mode": "stuck-output", "marker": str(marker)})
    wait_for(marker, proc)
    run = interrupt(proc)
    assert run.code == 130 and run.after_signal < LIMIT, (run.code, run.after_signal, run.stderr[-3000:])
    assert "Traceback" not in run.stderr, run.stderr[-3000:]


def test_an_interrupted_exit_still_removes_temporary_folders(index, tmp_path):
    """An interrupted run ends with os._exit (no wait for its threads), but still runs what an exit
    runs: a TemporaryDirectory the command keeps open (the image source's) is removed, as it was when
    the run ended with sys.exit. (A guard on the new exit: main removed it too.)"""
    server, store = index
    marker = tmp_path / "marker"
    proc = launch(_check(server, store), cache=tmp_path / "cache", hook={"mode": "temp-dir", "marker": str(marker)})
    wait_for(marker, proc)
    kept = Path(marker.read_text().strip())
    assert kept.is_dir()
    run = interrupt(proc)
    assert run.code == 130, (run.code, run.stderr[-3000:])
    assert not kept.exists()


@pytest.mark.parametrize("imports", ["import patchctl", "import patchctl.tree", "from patchctl.core import errors"])
def test_a_script_importing_patchctl_keeps_python_s_own_ctrl_c(imports):
    """The first-line handler is the CLI's (patchctl/__init__.py): a user's script that imports
    patchctl's modules gets KeyboardInterrupt as always, not a silent exit 130 (it did, from `import
    patchctl` in any `__main__`)."""
    code = f"{imports}\nimport _signal\nprint(_signal.getsignal(_signal.SIGINT) is _signal.default_int_handler)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "True", done.stdout + done.stderr
