"""Run a patchctl command in-process and read its --json document."""
from __future__ import annotations

import json

from click.testing import CliRunner


def run_json(*args: str, expect: int | None = None) -> dict:
    """`patchctl ARGS --json`; with expect, the exit code must be that (the output is in the message)."""
    from patchctl.cli import main

    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    if expect is not None:
        assert result.exit_code == expect, result.output
    return json.loads(result.stdout)


_HEAVY_PROBE = r"""
import json, sys
watched = json.loads(sys.argv[2])
sys.argv = ["patchctl"] + json.loads(sys.argv[1])
code = None
try:
    from patchctl.cli import main
    main()
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
heavy = sorted(m for m in watched if m in sys.modules)
sys.stderr.write("\nHEAVY " + json.dumps({"exit": code, "heavy": heavy}) + "\n")
"""


def heavy_imports_run(argv: tuple[str, ...] | list[str], watched: tuple[str, ...]) -> tuple[dict, str, str]:
    """Run `patchctl ARGV` in a fresh interpreter: ({"exit": CODE, "heavy": [the `watched` modules it
    imported]}, its stdout, its stderr). The start-up import tests' one probe."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _HEAVY_PROBE, json.dumps(list(argv)), json.dumps(list(watched))],
                          capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        if line.startswith("HEAVY "):
            result: dict = json.loads(line[6:])
            return result, proc.stdout, proc.stderr
    raise AssertionError(f"no report from patchctl {' '.join(argv)}:\n{proc.stderr}")


def heavy_imports(argv: tuple[str, ...] | list[str], watched: tuple[str, ...]) -> dict:
    """heavy_imports_run's report alone."""
    return heavy_imports_run(argv, watched)[0]
