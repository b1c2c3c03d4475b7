"""Run a patchctl command in-process and read its --json document."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner


def run_json(*args: str, expect: int | None = None) -> dict:
    """`patchctl ARGS --json`; with expect, the exit code must be that (the output is in the message)."""
    from patchctl.cli.main import main

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
    from patchctl.cli.main import main
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

    proc = subprocess.run(
        [sys.executable, "-c", _HEAVY_PROBE, json.dumps(list(argv)), json.dumps(list(watched))], capture_output=True, text=True
    )
    for line in proc.stderr.splitlines():
        if line.startswith("HEAVY "):
            result: dict = json.loads(line[6:])
            return result, proc.stdout, proc.stderr
    raise AssertionError(f"no report from patchctl {' '.join(argv)}:\n{proc.stderr}")


def heavy_imports(argv: tuple[str, ...] | list[str], watched: tuple[str, ...]) -> dict:
    """heavy_imports_run's report alone."""
    return heavy_imports_run(argv, watched)[0]


def as_nobody(*args: str, home: Path, warm: bool = True) -> tuple[int, dict]:
    """`patchctl ARGS --json` as uid/gid 65534 (nobody), in a forked child of this process. Not
    `runuser -u nobody python`: this interpreter lives under /root (0700), which nobody cannot reach;
    the fork keeps the interpreter and every module this run imported (warmed by the same command
    as root first), and setuid makes the kernel answer EACCES as it does for a service user."""
    import os

    from patchctl.cli.main import main

    if warm:
        run_json(*args)  # as root: every module the command imports is loaded before the switch
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.environ.update(
                PATCHCTL_DATA_DIR=str(home / "data"),
                PATCHCTL_CONFIG=str(home / "config.yaml"),
                PATCHCTL_CACHE_DIR=str(home / "cache"),
                HOME=str(home),
            )
            result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=True)
            os.write(write, json.dumps({"code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, raw
    got = json.loads(raw)
    return got["code"], json.loads(got["stdout"])
