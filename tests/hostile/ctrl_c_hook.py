"""Run the patchctl CLI with a Ctrl-C delivered at one exact, otherwise rare moment (CTRL_C_HOOK, a JSON
object: `mode`, and `marker`, a file written when the moment comes). Each mode names a place where a
SIGINT at a random moment used to land now and then; here it lands there every time, so that a test
of it is deterministic. The moments are reached through the standard library alone (threading, the
profiler, os), so the hook runs the same against any version of patchctl.

- import-lock: the main thread imports a module while check's worker thread (`open-upstream`) runs,
  and the SIGINT arrives inside importlib's weakref callback, just after it took the import lock
  (issue 36's hang: the main thread in Thread.join, the worker in `_get_module_lock`).
- finalizer: the SIGINT arrives inside a finalizer (`__del__`) while the worker runs (a Ctrl-C
  Python prints as "Exception ignored" and drops: the command went on to exit 0).
- slow-output: stdout takes the --json document 256 bytes at a time, 5 ms apart; the marker is
  written at the first write, and the test sends the SIGINT then (half a document on stdout).
- start-up-lock: before patchctl is imported (as in the interpreter's start-up), the SIGINT arrives
  inside importlib's weakref callback just after it took the import lock: Python drops it with the
  lock held, and the program starts with it taken.
- stuck-unwind: check's worker sleeps before its work, and the main thread's way out of its
  Thread.join takes a minute and ignores further SIGINTs (as a `finally` that waits on a stuck
  thread or disk would); the marker is written when the join begins.
- stuck-output: stdout's first write of the document never returns (a pipe nobody reads from),
  and ignores SIGINTs while it waits; the marker is written then.
- temp-dir: once check's worker runs (it sleeps before its work), the main thread keeps a
  tempfile.TemporaryDirectory open (as the image source does), named in the marker.
- pause-publish: the worker thread stops just before renaming a finished `.part` file into the
  cache (the marker written), until the process ends; the test sends the SIGINT then.
"""

import _imp
import io
import json
import os
import signal
import sys
import threading
import time

SPEC = json.loads(os.environ["CTRL_C_HOOK"])
MODE = SPEC["mode"]
_fired = [False]


def _mark(what: str) -> None:
    with open(SPEC["marker"], "w") as f:
        f.write(what + "\n")


def _profile(frame, event, arg):
    # c_return of `_imp.acquire_lock()` in importlib's `_get_module_lock.<locals>.cb`: the import lock
    # is held, and the `try` that gives it back has not begun.
    if event == "c_return" and arg is _imp.acquire_lock and frame.f_code.co_name == "cb" and not _fired[0]:
        _fired[0] = True
        sys.setprofile(None)
        _mark("import-lock")
        signal.raise_signal(signal.SIGINT)


class _Finalized:
    def __del__(self):
        _mark("finalizer")
        signal.raise_signal(signal.SIGINT)
        _fired[0] = True  # a few bytecodes more: the interrupt is checked for here, inside __del__


_start = threading.Thread.start


def _started(self):
    _start(self)
    if self.name != "open-upstream" or _fired[0]:
        return
    if MODE == "import-lock":
        folder = os.path.dirname(SPEC["marker"])
        with open(os.path.join(folder, "ctrl_c_probe_module.py"), "w") as f:
            f.write("VALUE = 1\n")
        sys.path.insert(0, folder)
        sys.setprofile(_profile)
        import ctrl_c_probe_module  # noqa: F401  (its module lock's callback runs on this thread)

        sys.setprofile(None)
    elif MODE == "finalizer":
        _Finalized()  # dropped at once: __del__ runs here, on the main thread


threading.Thread.start = _started


class _SlowStdout(io.RawIOBase):
    def writable(self):
        return True

    def write(self, data):
        if not _fired[0]:
            _fired[0] = True
            _mark("slow-output")
        n = os.write(1, bytes(data[:256]))
        time.sleep(0.005)
        return n


class _StuckStdout(io.RawIOBase):
    def writable(self):
        return True

    def write(self, data):
        _mark("stuck-output")
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                time.sleep(0.05)
            except KeyboardInterrupt:
                pass
        return len(data)


if MODE == "stuck-output":
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_StuckStdout(), buffer_size=256), encoding="utf-8", write_through=True)

if MODE == "slow-output":
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_SlowStdout(), buffer_size=256), encoding="utf-8", write_through=True)

_replace = os.replace


def _paused_replace(src, dst, *args, **kwargs):
    if str(src).endswith(".part") and threading.current_thread().name == "open-upstream":
        _mark("pause-publish")
        time.sleep(60)
    return _replace(src, dst, *args, **kwargs)


if MODE == "pause-publish":
    os.replace = _paused_replace

if MODE == "stuck-unwind":
    _run, _join = threading.Thread.run, threading.Thread.join

    def _slow_run(self):
        if self.name == "open-upstream":
            time.sleep(30)
        _run(self)

    def _stuck_join(self, *args, **kwargs):
        if self.name != "open-upstream":
            return _join(self, *args, **kwargs)
        _mark("stuck-unwind")
        try:
            return _join(self, *args, **kwargs)
        except KeyboardInterrupt:
            end = time.monotonic() + 60
            while time.monotonic() < end:
                try:
                    time.sleep(0.05)
                except KeyboardInterrupt:
                    pass
            raise

    threading.Thread.run, threading.Thread.join = _slow_run, _stuck_join

if MODE == "temp-dir":
    import tempfile

    _run_temp, _start_temp = threading.Thread.run, threading.Thread.start
    _kept = []

    def _slow_run_temp(self):
        if self.name == "open-upstream":
            time.sleep(30)
        _run_temp(self)

    def _start_keeping(self):
        _start_temp(self)
        if self.name == "open-upstream":
            _kept.append(tempfile.TemporaryDirectory(prefix="ctrl-c-kept-", dir=os.path.dirname(SPEC["marker"])))
            _mark(_kept[0].name)

    threading.Thread.run, threading.Thread.start = _slow_run_temp, _start_keeping

if MODE == "start-up-lock":
    _probe = os.path.dirname(SPEC["marker"])
    with open(os.path.join(_probe, "ctrl_c_start_up_probe.py"), "w") as _f:
        _f.write("VALUE = 1\n")
    sys.path.insert(0, _probe)
    sys.setprofile(_profile)
    import ctrl_c_start_up_probe  # noqa: F401, E402

    sys.setprofile(None)

if __name__ == "__main__":
    from patchctl.cli.main import main

    sys.argv = ["patchctl", *sys.argv[1:]]
    main()
