"""The named steps of a bookkeeping write, and the seam tests hook into them.

Each write step calls `reached(name)` once it is done: "gitignore" (a fresh tree's .gitignore),
"journal" (the journal written), "file:N" (the N-th file replaced), "bytecode" (a .pyc put back),
"state" (the record saved). Production code installs no hook, so `reached` does nothing; test
support (tests/support/crash_at.py) appends one that kills the process with SIGKILL at a chosen
step, to prove that every step leaves a tree the next command recovers. Nothing read from the
environment can make patchctl kill itself.
"""

from __future__ import annotations

from collections.abc import Callable

HOOKS: list[Callable[[str], None]] = []


def reached(step: str) -> None:
    for hook in HOOKS:
        hook(step)
