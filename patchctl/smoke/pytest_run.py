"""The smoke runner's check tiers: a patch's pytest checks against the patched tree of a release,
in the patch's smoke environment. (The serve tier lives in patchctl.validate.)"""

from __future__ import annotations

import os
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import patchctl
from patchctl.core.engines import get_engine
from patchctl.core.errors import EnvironmentProblem
from patchctl.core.interpreter import has_gpu, run_bounded
from patchctl.store.series import Patch

TIER_MARKERS = {"cpu": "not gpu", "gpu": "gpu"}
# Proving an upstreamed version: the patched-side checks must pass on the pristine tree.
UPSTREAM_PROOF = " and not pristine_fails"
PYTEST_OUTPUT_LIMIT = 64 << 20  # -q output; a failing check with a long diff is some KB


class CheckResult(NamedTuple):
    patch: str
    tier: str
    status: str  # passed | failed | skipped | not-run | error
    passed: int
    failed: int
    skipped: int
    seconds: float
    reason: str  # why skipped / not run / failed, in words
    evidence: str  # what a pass proves for this patch, from its metadata
    failures: tuple[str, ...] = ()


def evidence_of(patch: Patch, tier: str) -> str:
    proven = patch.evidence.get("proven") or []
    level = {"cpu": "applies + CPU checks", "gpu": "applies + GPU checks", "serve": "served"}[tier]
    return level + (f" ({'; '.join(map(str, proven))})" if proven else "")


def run_checks(
    patch: Patch,
    tier: str,
    python: str,
    *,
    engine: str,
    version: str,
    patched: Path,
    pristine: Path,
    timeout: float = 1800,
    upstream_proof: bool = False,
    extra_env: dict[str, str] | None = None,
) -> CheckResult:
    checks = patch.directory / "checks"
    evidence = evidence_of(patch, tier)
    if not checks.is_dir() or not any(checks.glob("test_*.py")):
        return CheckResult(patch.name, tier, "not-run", 0, 0, 0, 0.0, "the patch ships no checks", evidence)
    if tier == "gpu" and not has_gpu(python):
        return CheckResult(patch.name, tier, "not-run", 0, 0, 0, 0.0, "not run: no GPU", evidence)
    with tempfile.TemporaryDirectory(prefix="patchctl-smoke-") as tmp:
        junit = Path(tmp) / "junit.xml"
        env = dict(os.environ)
        env.update(
            {
                "PATCHCTL_PATCHED_TREE": str(patched),
                "PATCHCTL_PRISTINE_TREE": str(pristine),
                "PATCHCTL_ENGINE_VERSION": version,
                "PATCHCTL_ENGINE": engine,
                "PYTHONPATH": os.pathsep.join(
                    [
                        str(Path(patchctl.__file__).resolve().parent.parent),
                        *_checklib_path(patch.directory.parent.parent, Path(tmp)),
                    ]
                ),
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        env.update({k: v.format(tmp=tmp) for k, v in get_engine(engine).smoke_env.items()})
        env.update(extra_env or {})
        cmd = [
            python,
            "-m",
            "pytest",
            "-q",
            "-p",
            "patchctl.smoke.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-m",
            TIER_MARKERS[tier] + (UPSTREAM_PROOF if upstream_proof else ""),
            f"--junitxml={junit}",
            "--rootdir",
            str(checks),
            str(checks),
        ]
        start = time.monotonic()
        try:
            # Its own process group, killed whole at the deadline (a check's server or worker with it)
            # and after pytest exits; its output capped (the junit file carries the results).
            ran = run_bounded(
                cmd, timeout=timeout, limit=PYTEST_OUTPUT_LIMIT, env=env, cwd=checks, what=f"pytest of {patch.name}'s checks"
            )
        except EnvironmentProblem as exc:
            took = time.monotonic() - start
            reason = f"timed out after {timeout:.0f} s" if "did not finish" in str(exc) else str(exc)
            return CheckResult(patch.name, tier, "error", 0, 0, 0, took, reason, evidence)
        seconds = time.monotonic() - start
        if not junit.is_file():
            tail = (ran.stdout + ran.stderr).decode(errors="replace").strip()[-1500:]
            return CheckResult(patch.name, tier, "error", 0, 0, 0, seconds, f"pytest did not run: {tail}", evidence)
        passed, failed, skipped, failures, skip_reasons = _parse_junit(junit)
    proof = "upstreamed: behaves as patched on the pristine release; " if upstream_proof else ""
    if failed:
        status, reason = "failed", proof + f"{failed} check(s) failed"
    elif passed:
        status, reason = "passed", proof + f"{passed} passed" + (f", {skipped} skipped" if skipped else "")
    elif skipped:
        status, reason = "skipped", "; ".join(sorted(set(skip_reasons)))[:500]
    else:
        status, reason = "not-run", f"no {tier} checks selected"
    return CheckResult(patch.name, tier, status, passed, failed, skipped, round(seconds, 2), reason, evidence, tuple(failures))


def _checklib_path(store_root: Path, tmp: Path) -> list[str]:
    """The PYTHONPATH entry that makes the store's shared check helpers (`<store>/checklib`)
    importable as `checklib`, for the checks and every process they start. Not the store root
    itself: it also holds folders named after engines (vllm/, sglang/), which Python would import
    as namespace packages wherever the engine is absent (an SGLang env asking for vLLM)."""
    checklib = store_root / "checklib"
    if not checklib.is_dir():  # a user's store: its checks share the bundled helpers
        from patchctl.core.bundled import bundled_store

        bundled = bundled_store()
        if bundled is not None and (bundled / "checklib").is_dir():
            checklib = bundled / "checklib"
    if not checklib.is_dir():
        return []
    root = tmp / "pythonpath"
    root.mkdir()
    try:
        (root / "checklib").symlink_to(checklib.resolve(), target_is_directory=True)
    except OSError:  # no symlinks here: the store root, engine folders and all
        return [str(store_root)]
    return [str(root)]


def _parse_junit(path: Path) -> tuple[int, int, int, list[str], list[str]]:
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    failures: list[str] = []
    skip_reasons: list[str] = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skip = case.find("skipped")
        if problem is not None:
            failed += 1
            failures.append(f"{name}: {_gist((problem.get('message') or '').strip())}")
        elif skip is not None:
            skipped += 1
            skip_reasons.append((skip.get("message") or "").strip())
        else:
            passed += 1
    return passed, failed, skipped, failures, skip_reasons


def _gist(message: str, head: int = 300, tail: int = 900) -> str:
    """A failure's message, bounded: its start (what failed) and its end (a probe's stderr ends with
    the traceback's last lines, which say why; the start is often an import-time warning)."""
    if len(message) <= head + tail + 40:
        return message
    return f"{message[:head]} [... {len(message) - head - tail} characters ...] {message[-tail:]}"
