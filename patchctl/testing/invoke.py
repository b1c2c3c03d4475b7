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
