#!/usr/bin/env python3
"""Turn `patchctl matrix diff --json` output into one GitHub issue per regressed patch.

A regression is a patch that applied (any satisfied outcome) on a version in the committed matrix
and now conflicts there. All regressed versions of one (engine, patch) go into one issue, titled
with the first bad version, so a nightly that sees the same break again does not file it twice:
an open issue with the same title is left alone.

  ci/regression_issues.py diff.json --dry-run      # print the issues as JSON, touch nothing
  ci/regression_issues.py diff.json                # create them with `gh issue create`

`gh` reads GH_TOKEN (the workflow passes GITHUB_TOKEN) and GH_REPO/--repo.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from packaging.version import InvalidVersion, Version

TITLE_PREFIX = "matrix regression:"


def _version_key(text: str):
    try:
        return (0, Version(text), text)
    except InvalidVersion:
        return (1, Version("0"), text)


def load_diff(text: str) -> dict:
    """Accept the whole `--json` document (diff under "diff") or the bare diff."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("expected a JSON object from `patchctl matrix diff --json`")
    if doc.get("error"):
        raise ValueError(f"patchctl matrix diff failed: {doc['error']}")
    diff = doc.get("diff", doc)
    if not isinstance(diff, dict) or not isinstance(diff.get("regressions", []), list):
        raise ValueError("no 'regressions' list in the diff document")
    return diff


def run_url() -> str | None:
    server, repo, run_id = (os.environ.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    if server and repo and run_id:
        return f"{server}/{repo}/actions/runs/{run_id}"
    return None


def issues_for(diff: dict, url: str | None = None) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for item in diff.get("regressions", []):
        groups.setdefault((item["engine"], item["patch"]), []).append(item)
    issues = []
    for (engine, patch), items in sorted(groups.items()):
        items.sort(key=lambda i: _version_key(i["version"]))
        first_bad = min((i.get("first_bad_version") or i["version"] for i in items), key=_version_key)
        title = f"{TITLE_PREFIX} {engine} patch `{patch}` conflicts from {engine} {first_bad}"
        lines = [
            f"The nightly compatibility matrix found that patch `{patch}` no longer applies to {engine}.",
            "",
            f"**First bad version: {engine} {first_bad}**",
            "",
            "| version | before | now |",
            "|---|---|---|",
            *(f"| {i['version']} | {i['before']} | {i['after']} |" for i in items),
            "",
            "Reproduce and see the conflicting hunk with the upstream lines around it:",
            "",
            "```bash",
            f"patchctl check {engine}@{first_bad}",
            "```",
            "",
            f"Then add a variant `patches/{engine}/{patch}/{first_bad}.patch` (rebased on {first_bad}), "
            f"run `patchctl pin`, and check again.",
        ]
        if url:
            lines += ["", f"Found by {url}"]
        issues.append({"title": title, "body": "\n".join(lines) + "\n", "engine": engine, "patch": patch,
                       "first_bad_version": first_bad, "versions": [i["version"] for i in items]})
    return issues


def gh(args: list[str], *, input_text: str | None = None) -> str:
    result = subprocess.run(["gh", *args], input=input_text, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"gh {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def open_titles(repo_args: list[str]) -> set[str]:
    out = gh(["issue", "list", *repo_args, "--state", "open", "--search", f"{TITLE_PREFIX} in:title",
              "--limit", "500", "--json", "title"])
    return {entry["title"] for entry in json.loads(out or "[]")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("diff", type=Path, help="output of `patchctl matrix diff --json` ('-' for stdin)")
    parser.add_argument("--dry-run", action="store_true", help="print the issues as JSON; call nothing")
    parser.add_argument("--repo", help="OWNER/NAME (default: gh's, from GH_REPO or the checkout)")
    parser.add_argument("--label", action="append", default=[], help="label to add (must exist in the repo)")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if str(args.diff) == "-" else args.diff.read_text()
    try:
        issues = issues_for(load_diff(text), run_url())
    except (ValueError, KeyError) as exc:
        print(f"regression_issues: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(issues, indent=2))
        return 0
    if not issues:
        print("no regressions: no issues to open")
        return 0
    repo_args = ["--repo", args.repo] if args.repo else []
    existing = open_titles(repo_args)
    for issue in issues:
        if issue["title"] in existing:
            print(f"already open: {issue['title']}")
            continue
        label_args = [a for label in args.label for a in ("--label", label)]
        url = gh(["issue", "create", *repo_args, "--title", issue["title"], "--body-file", "-", *label_args],
                 input_text=issue["body"]).strip()
        print(f"opened: {issue['title']} {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
