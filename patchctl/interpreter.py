"""The one way patchctl asks another Python interpreter something: run a small script there and read
one JSON value from the last line of its output. Engines are never imported in-process (vLLM takes
>10 s and wants CUDA); the installed engine, companion packages and the GPU are all probed this way.
"""
from __future__ import annotations

import json
import subprocess
from typing import Any

from patchctl.errors import EnvironmentProblem
from patchctl.yamlio import load_json


def probe(python: str, script: str, *args: str, timeout: float = 60) -> Any:
    """Run `python -c script args...`; the script prints one JSON value as its last line."""
    try:
        proc = subprocess.run([python, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"cannot run the Python interpreter {python}: {exc}") from None
    if proc.returncode != 0:
        raise EnvironmentProblem(f"{python} failed to answer a probe: {proc.stderr.strip()[-300:]}")
    lines = proc.stdout.strip().splitlines()
    try:
        return load_json(lines[-1])  # a venv's sitecustomize may print anything: bounded
    except (IndexError, json.JSONDecodeError):
        raise EnvironmentProblem(f"{python} gave no answer to a probe: {proc.stdout.strip()[-300:]!r}") from None


_DIST_VERSIONS = """
import importlib.metadata as m, json, sys
out = {}
for n in sys.argv[1:]:
    try: out[n] = m.version(n)
    except m.PackageNotFoundError: out[n] = None
print(json.dumps(out))
"""

_HAS_GPU = """
import json
try:
    import torch
    print(json.dumps(bool(torch.cuda.is_available())))
except Exception:
    print(json.dumps(False))
"""


def dist_versions(python: str, names: list[str]) -> dict[str, str | None]:
    """Installed version of each distribution (None where absent)."""
    return dict(probe(python, _DIST_VERSIONS, *names))


def has_gpu(python: str) -> bool:
    return bool(probe(python, _HAS_GPU, timeout=300))
