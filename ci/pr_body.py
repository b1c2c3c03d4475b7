#!/usr/bin/env python3
"""The pull-request body for the nightly's bot branch: what changed since the previous matrix.

  ci/pr_body.py PREVIOUS.yaml CURRENT.yaml [--issues issues.json] > pr-body.md

New releases, newly failing and newly upstreamed cells, the first bad version per patch, and (with
--issues, the output of `ci/regression_issues.py --dry-run`) the variants a rebase refreshed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def body(previous: dict | None, current: dict, issues: list[dict] | None = None) -> str:
    from patchctl.matrix import build as matrix

    changes = matrix.changes_since(previous, current)
    out = ["Nightly compatibility matrix update (`compat_matrix.yaml`, `compat_matrix.md`, `compat_matrix.html`).", ""]
    out += [f"### New releases ({len(changes['new_releases'])})", ""]
    out += [f"- {i['engine']} {i['version']}" for i in changes["new_releases"]] or ["none"]
    for key, heading in (("newly_failing", "Newly failing"), ("newly_upstreamed", "Newly upstreamed")):
        out += ["", f"### {heading} ({len(changes[key])})", ""]
        lines = []
        for i in changes[key]:
            what = f"- {i['engine']} {i['version']}" + (f" `{i['patch']}`" if i.get("patch") else "")
            lines.append(what + (f": error: {i['error']}" if i.get("error") else f": {i['before'] or 'new'} → {i['after']}"))
        out += lines or ["none"]
    out += ["", "### First bad version per patch", ""]
    rows = [f"| {e} | `{p}` | {v} |" for e, patches in sorted(changes["first_bad"].items()) for p, v in sorted(patches.items())]
    out += ["| engine | patch | first bad |", "|---|---|---|", *rows] if rows else ["no patch conflicts in any version"]
    failed = matrix.nightly_failed(current)
    if failed:
        out += ["", "### Nightly FAILED", ""]
        out += [f"- {e}: {current['engines'][e].get('nightly')}" for e in failed]
    refreshed = [r for i in issues or [] for r in i.get("refreshed", [])]
    if refreshed:
        out += ["", "### Refreshed variants in this PR", ""]
        out += [f"- {r['engine']} `{r['patch']}` → `{r['variant']}` (rebased onto {r['version']})" for r in refreshed]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from patchctl.core.errors import PatchctlError
    from patchctl.matrix import build as matrix

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("previous", type=Path, help="the matrix before this run (may not exist)")
    parser.add_argument("current", type=Path)
    parser.add_argument("--issues", type=Path, help="JSON from ci/regression_issues.py --dry-run")
    args = parser.parse_args(argv)
    try:
        previous = matrix.load(args.previous) if args.previous.is_file() else None
        current = matrix.load(args.current)
    except PatchctlError as exc:
        print(f"pr_body: {exc.message}", file=sys.stderr)
        return 2
    issues = json.loads(args.issues.read_text()) if args.issues else None
    sys.stdout.write(body(previous, current, issues))
    return 0


if __name__ == "__main__":
    sys.exit(main())
