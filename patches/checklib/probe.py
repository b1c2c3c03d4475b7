"""The probe protocol: a check runs a small script (a "probe") against one release tree in a fresh
interpreter, because an engine imported into the pytest process cannot be swapped for another
tree (the patched and the pristine one).

    python <probe> <tree> [args...]

The probe puts <tree> first on sys.path, does its work and reports with `emit(result)`: one line
`PROBE-RESULT <json object>` on stdout, then exits 0. Whatever else it prints (engine logs,
warnings) is ignored. `run_probe` runs it and hands back that object; a probe that exits non-zero
or reports nothing fails the check with the tails of its output. The checks decide on the
object: a probe reports what the release did (errors included), it asserts nothing.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

MARKER = "PROBE-RESULT "


def emit(result: dict) -> None:
    """In a probe: report the result (the probe's last output)."""
    print(MARKER + json.dumps(result), flush=True)


def run_probe(tree, script, *args, env: dict | None = None, timeout: float = 900) -> dict:
    """Run `script` as `python script tree args...` (cwd: the script's folder) with the check's
    environment updated by `env` (a None value removes the variable); return what it emitted."""
    script = pathlib.Path(script)
    full_env = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = str(value)
    cmd = [sys.executable, str(script), str(tree), *map(str, args)]
    proc = subprocess.run(cmd, env=full_env, cwd=str(script.parent), capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARKER)]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1][len(MARKER) :])
    import pytest

    what = "reported nothing" if proc.returncode == 0 else f"exited {proc.returncode}"
    pytest.fail(
        f"probe {script.name} {' '.join(map(str, args))} on {tree} {what}:\n"
        f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}",
        pytrace=False,
    )


def assert_imported_from(result: dict, key: str, tree) -> None:
    """The module the probe reported under `key` (its __file__) lies inside `tree`: the probe
    exercised the tree under test, not an engine installed elsewhere."""
    where = pathlib.Path(result[key]).resolve()
    assert where.is_relative_to(pathlib.Path(tree).resolve()), f"probe imported {where}, not from {tree}"
