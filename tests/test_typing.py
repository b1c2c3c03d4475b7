"""mypy over the typed core, as pyproject.toml's [tool.mypy] defines it (the checked set is listed there,
with disallow_untyped_defs): run from the repository root with no arguments, exactly as CI runs it."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (pip install mypy): the typed core is not checked")
def test_mypy_reports_no_errors() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mypy exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
