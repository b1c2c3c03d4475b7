"""The patchctl CLI killed with SIGKILL at one named write step of its bookkeeping (the steps of
patchctl.tree.bookkeeping.steps: gitignore, journal, file:N, bytecode, state), as a power cut or an
OOM kill would stop it there. The kill is a hook this module installs in the seam
(steps.HOOKS) of the process it starts; patchctl itself reads nothing that could kill it.

  python -m support.crash_at STEP ARGS...     # patchctl ARGS, killed once STEP is reached
  run("file:1", ["apply", "vllm", ...])       # the same, from a test (subprocess.run's keywords)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any


def run(step: str, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """`patchctl ARGS` in a process of its own, killed at `step` (its returncode is then -9).
    PYTHONPATH must reach tests/ (tests/conftest.py sets it), so that the child finds this module."""
    kwargs.setdefault("capture_output", True)
    return subprocess.run([sys.executable, "-m", "support.crash_at", step, *args], **kwargs)


def main() -> None:
    from patchctl.cli.main import main as patchctl
    from patchctl.tree.bookkeeping import steps

    step, args = sys.argv[1], sys.argv[2:]

    def kill(reached: str) -> None:
        if reached == step:
            os.kill(os.getpid(), signal.SIGKILL)

    steps.HOOKS.append(kill)
    sys.argv = ["patchctl", *args]
    patchctl()


if __name__ == "__main__":
    main()
