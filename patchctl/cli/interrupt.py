"""Ctrl-C, safe at any moment: exit 130 with no traceback, no "Exception ignored" line, no hang, no half
JSON document and no temporary file left in the download cache; or the command's own exit code when
its work was done, its document written whole (issue 36).

Python raises KeyboardInterrupt wherever the main thread happens to be. Four places cannot take it,
and the handler here keeps it out of them:

- patchctl's own start-up (main.py's imports): nothing has begun, so it exits 130 at once.
- importlib's own code. Interrupted between taking the import lock and the `try` that gives it back,
  the lock stays held and the next import in any other thread waits forever: `check` hung in
  Thread.join while its worker waited in `_get_module_lock`. While a frame of the import system is
  on the main thread's stack the interrupt is held, and delivered again every RETRY seconds until
  the import is done (an import takes milliseconds).
- a finalizer or weakref callback (importlib's own among them): Python prints "Exception ignored"
  and drops the interrupt, and the command went on to exit 0. The unraisable hook delivers it again.
- the --json document being written: half a document. Held until it is whole; it is the command's
  last act, so the command then exits with its own code.

Once raised, KeyboardInterrupt unwinds the command in the main thread (a tree's rollback, its lock),
and main.py ends the process with `stop()`: the cache's temporary files removed (sources/scratch.py),
worker threads abandoned rather than waited for. GRACE bounds the unwinding itself (a thread pool
waiting for its workers, a rollback on a hung disk): after it the process ends the same way.

Only `patchctl` itself (Registry.main without args) gets this; a program or test that imports the CLI
keeps Python's own KeyboardInterrupt. Imports only built-in modules: it runs before anything else.
"""

from __future__ import annotations

import _signal
import _thread
import os
import sys
import time  # built in, loaded with the interpreter

TYPE_CHECKING = False  # not typing's: importing typing costs ~5 ms, a window before the handler
if TYPE_CHECKING:
    from types import FrameType

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED (not imported: this runs before any other import)
RETRY = 0.002  # seconds between deliveries of an interrupt held while an import runs
GRACE = 5.0  # seconds the unwinding after a Ctrl-C may take before the process ends regardless

# What a SIGINT does now: exit at once (start-up, exiting), raise KeyboardInterrupt where it is safe
# (running), or Python's own KeyboardInterrupt (library: the CLI imported by a program or a test).
STARTING, RUNNING, EXITING, LIBRARY = "starting", "running", "exiting", "library"
_state = LIBRARY
_held = False  # an interrupt waits for the import system to be done
_writing_output = 0  # the --json document is being written
_previous_unraisable = sys.unraisablehook
_watchdog = False


def install() -> None:
    """First thing in the program: a SIGINT from here on exits 130 at once, until `imported()`. A
    handler someone else set (a test runner's, SIG_IGN) is left alone, and so is a thread other than
    the main one (no handler can be set there)."""
    global _state
    early = getattr(sys.modules.get("patchctl"), "_interrupted_early", None)  # set by patchctl/__init__.py
    if _signal.getsignal(_signal.SIGINT) not in (_signal.default_int_handler, early):
        return
    try:
        _signal.signal(_signal.SIGINT, _on_sigint)
    except ValueError:
        return
    _state = STARTING
    # A launcher may start the interpreter with SIGINT blocked (`env --block-signal=INT patchctl`),
    # which keeps a Ctrl-C during the interpreter's own start-up pending instead of fatal: delivered
    # here, now that a handler takes it.
    if _signal.SIGINT in _signal.pthread_sigmask(_signal.SIG_BLOCK, ()):
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, (_signal.SIGINT,))


def imported() -> None:
    """main.py's imports are done. Imported by a program's own script (the console script, `python -m
    patchctl.cli`), a Ctrl-C still exits 130 at once until `running()` (the script calls main() next);
    imported by anything else (a program or test that uses the CLI), Python's own KeyboardInterrupt."""
    global _state
    if _state != STARTING:
        return
    frame = sys._getframe(1)  # main.py's own frame, `__main__` under `python -m patchctl.cli.main`
    if frame.f_globals.get("__name__") != "__main__":
        frame = frame.f_back  # type: ignore[assignment]
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None or frame.f_globals.get("__name__") != "__main__":
            _state = LIBRARY


def running() -> None:
    """The program itself runs a command: the safe KeyboardInterrupt of this module."""
    global _state
    if _signal.getsignal(_signal.SIGINT) is _on_sigint:
        _state = RUNNING
        sys.unraisablehook = _unraisable
        # SIGALRM carries a held interrupt's next delivery; patchctl sets no alarm of its own.
        if _signal.getsignal(_signal.SIGALRM) is _signal.SIG_DFL:
            _signal.signal(_signal.SIGALRM, _on_alarm)


def exiting() -> None:
    """The command is done and the process is ending: a SIGINT from here on exits 130 at once (no
    traceback from the interpreter's shutdown)."""
    global _state, _held
    if _state == RUNNING:
        _state = EXITING
        if _held:  # the work is done: no alarm may outlive the handler the interpreter's exit removes
            _held = False
            _signal.setitimer(_signal.ITIMER_REAL, 0)


def library() -> None:
    """The CLI invoked from a program or test (CliRunner): Python's own handler, as it had."""
    global _state
    if _signal.getsignal(_signal.SIGINT) is _on_sigint:
        try:
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        except ValueError:  # not the main thread: leave it be
            return
    _state = LIBRARY


class _Output:
    """`with output():` around writing the --json document: a Ctrl-C is held until it is whole."""

    def __enter__(self) -> None:
        global _writing_output
        _writing_output += 1

    def __exit__(self, *exc: object) -> None:
        global _writing_output
        _writing_output -= 1
        exiting()  # the command's last act: what follows is the process ending


def output() -> _Output:
    return _Output()


def stop(code: int = EXIT_INTERRUPTED, *, at_exit: bool = False) -> None:
    """End the process now: what was written so far flushed, the cache's temporary files removed,
    no worker thread waited for, nothing more printed. at_exit: the command has unwound, so run what
    an exit runs too (the atexit functions: temporary folders still open, a TemporaryDirectory an
    image source keeps, are removed as a normal exit removes them); not the interpreter's wait for
    threads, which is what os._exit skips."""
    _start_watchdog()  # a flush into a pipe nobody reads from, an atexit function stuck: GRACE at most
    _abandon_scratch()
    if at_exit:
        import atexit  # built in

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken pipe, or a write this interrupted: nobody left to tell
            pass
    os._exit(code)


def _abandon_scratch() -> None:
    # Imported only by a run that writes the download cache: none, nothing to remove.
    scratch = sys.modules.get("patchctl.sources.scratch")
    if scratch is not None:
        try:
            scratch.abandon()
        except Exception:  # the process ends either way; a later run sweeps what is left
            pass


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _held
    if _state in (STARTING, EXITING):
        stop()
    if _state == LIBRARY:
        _signal.default_int_handler(signum, frame)
    if _writing_output:
        # The document is being written, the command's last act: it exits with its own code. Within
        # GRACE, though: a pipe nobody reads from would hold the write, and the Ctrl-C, forever.
        _start_watchdog()
        return
    if _inside_import(frame):
        _held = True
        _signal.setitimer(_signal.ITIMER_REAL, RETRY)
        return
    _held = False
    _start_watchdog()
    raise KeyboardInterrupt


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _held:
        _on_sigint(_signal.SIGINT, frame)


def _inside_import(frame: FrameType | None) -> bool:
    """Whether the main thread is inside the import system (its frozen frames): anywhere from finding
    a module to running its body, and its weakref callbacks."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _unraisable(unraisable: object) -> None:
    """A KeyboardInterrupt raised where Python cannot raise it (a finalizer, a weakref callback) is
    delivered again, quietly, rather than printed and dropped."""
    global _held
    if _state == RUNNING and isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        _held = True
        _signal.setitimer(_signal.ITIMER_REAL, RETRY)
        return
    _previous_unraisable(unraisable)  # type: ignore[arg-type]


def _start_watchdog() -> None:
    global _watchdog
    if _watchdog:
        return
    _watchdog = True
    _thread.start_new_thread(_end_after_grace, ())


def _end_after_grace() -> None:
    time.sleep(GRACE)
    _abandon_scratch()
    os._exit(EXIT_INTERRUPTED)
