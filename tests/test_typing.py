"""mypy over the whole patchctl package, as pyproject.toml's [tool.mypy] defines it (files = ["patchctl"],
disallow_untyped_defs, no per-module overrides): run from the repository root with no arguments, exactly
as CI runs it. The one exception is generated code: patchctl/core/schemas/compiled/ carries
`# mypy: ignore-errors` in its own files."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "patchctl"
GENERATED = PACKAGE / "core" / "schemas" / "compiled"


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed (pip install mypy): the package is not checked"
)
def test_mypy_reports_no_errors() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mypy exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    # Every module of the package was checked, not a listed subset of it.
    checked = re.search(r"in (\d+) source files?", proc.stdout)
    assert checked is not None, proc.stdout
    assert int(checked.group(1)) == len(list(PACKAGE.rglob("*.py"))), proc.stdout


def test_config_checks_the_whole_package() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert mypy["files"] == ["patchctl"]
    assert mypy["disallow_untyped_defs"] is True
    assert mypy["warn_unused_ignores"] is True
    # An override is how a module drops out of the check (follow_imports = "silent", untyped defs allowed).
    assert "overrides" not in mypy


def test_only_generated_code_switches_mypy_off() -> None:
    off = sorted(
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*.py")
        if re.search(r"^# mypy: ignore-errors", p.read_text(encoding="utf-8"), re.MULTILINE) and GENERATED not in p.parents
    )
    assert off == []
