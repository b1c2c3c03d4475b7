"""A patch's own checks, rerun against the pristine release: for a check marked `pristine_fails`
that requires them to fail there, each for the bug it targets.

A check marked `pristine_fails` asserts that the unpatched release misbehaves; the runner
deselects those checks when it proves an upstreamed version (patchctl/smoke/pytest_run.py). Most
call the release code on the `pristine_tree` fixture directly (through a probe, checklib.probe).
Checks that import the engine into the pytest process (the GGUF loaders) cannot import a second
tree there: their `pristine_fails` check reruns the folder in a fresh pytest process with the
pristine tree as `patched_tree`, the `pristine_fails` checks deselected (as the runner does), and
looks at the outcomes.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET


def run_checks_on_pristine(
    checks_dir: pathlib.Path, pristine_tree: pathlib.Path, out_dir: pathlib.Path, timeout: int = 600
) -> dict[str, tuple[str, str]]:
    """Run this checks folder's tests (less those marked pristine_fails) against the pristine tree
    in a fresh pytest process.

    Returns {test name: (outcome, message)} with outcome "passed", "failed", "error", "skipped".
    """
    import checklib
    import patchctl

    env = dict(os.environ)
    env["PATCHCTL_PATCHED_TREE"] = str(pristine_tree)
    # patchctl (its fixture plugin) and checklib, from where this process imported them
    roots = (pathlib.Path(patchctl.__file__).resolve().parent.parent, pathlib.Path(checklib.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(str(p) for p in (*roots, env.get("PYTHONPATH")) if p))
    xml = out_dir / "pristine.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "patchctl.smoke.pytest_plugin",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not pristine_fails",
            # own basetemp: concurrent pytest runs of one user prune each other's default temp dirs
            f"--basetemp={out_dir / 'basetemp'}",
            f"--junitxml={xml}",
            str(checks_dir),
        ],
        cwd=str(checks_dir),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if not xml.exists():
        raise RuntimeError(f"pristine run produced no report:\n{proc.stdout}\n{proc.stderr}")
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        results[name] = (outcome, message)
    return results
