"""patchctl: versioned downstream patches for LLM inference engines."""

# The program's first line: the console script and `python -m patchctl.cli` import this package
# before anything else of patchctl's. From here a Ctrl-C exits 130 with nothing printed, until the
# CLI's own handler takes over (patchctl/cli/interrupt.py); only built-in modules are imported. A
# program or test that imports patchctl keeps its own Ctrl-C.
import _signal
import os
import sys

__version__ = "0.1.0"


def _interrupted_early(signum: int, frame: object) -> None:
    os._exit(130)  # core.errors.EXIT_INTERRUPTED: nothing else is imported yet


def _imported_by_the_program() -> bool:
    """Imported by a `__main__` script for the CLI (the console script's `from patchctl.cli.main import
    main`) or while `python -m` locates its module (sys.argv[0] is "-m" until runpy has found it). A
    script importing patchctl's other modules (`import patchctl.tree`) keeps Python's Ctrl-C: what the
    outermost import asked for is read from importlib's own frame (`_find_and_load(name, ...)`)."""
    if getattr(sys, "argv", [])[:1] == ["-m"]:
        return True
    frame = sys._getframe(1).f_back
    asked = None
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
        name = frame.f_locals.get("name") if frame.f_code.co_name == "_find_and_load" else None
        asked = name if isinstance(name, str) else asked
        frame = frame.f_back
    cli = isinstance(asked, str) and (asked == "patchctl.cli" or asked.startswith("patchctl.cli."))
    return cli and frame is not None and frame.f_globals.get("__name__") == "__main__"


if _imported_by_the_program():
    import _imp

    # A Ctrl-C during the interpreter's own start-up that landed in importlib's lock callback was
    # dropped by Python ("Exception ignored in: <function _get_module_lock.<locals>.cb>") with the
    # import lock still taken: nothing holds it legitimately here, and the first import on another
    # thread would wait for it forever (a hang in Thread.join). It was a Ctrl-C: end as one.
    if _imp.lock_held():
        os._exit(130)
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        try:
            _signal.signal(_signal.SIGINT, _interrupted_early)
        except ValueError:  # not the main thread: no handler can be set there
            pass
