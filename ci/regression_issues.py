#!/usr/bin/env python3
"""Turn `patchctl matrix diff --json` output into one GitHub issue per regressed patch.

A regression is a patch that applied (any satisfied outcome) on a version in the committed matrix
and now conflicts there. All regressed versions of one (engine, patch) go into one issue, titled
with the first bad version, so a nightly that sees the same break again does not file it twice:
an open issue with the same title is left alone.

  ci/regression_issues.py diff.json --dry-run      # print the issues as JSON, touch nothing
  ci/regression_issues.py diff.json                # create them with `gh issue create`
  ci/regression_issues.py diff.json --rebase-commands rebase/    # the fix to try, one command a line
  ci/regression_issues.py diff.json --rebase-dir rebase --dry-run   # or --rebase FILE, repeatable

For each patch that stops applying it proposes the fix: `patchctl rebase ENGINE --onto FIRST_BAD
--workdir DIR --json` (the workflow runs it and saves the document as DIR.json). Given those
documents (--rebase), a patch the rebase refreshed gets no issue: its new variant goes into the
bot's pull request (the issue entry says `fix: refreshed` and lists it under `refreshed`); a
conflict gets one issue per patch with the first bad release, each conflicting hunk with its
upstream context (the document's conflict.files[].conflicts[].text) and the commands to resolve it.

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


def workdir_for(base: str, engine: str, version: str) -> str:
    return f"{base.rstrip('/')}/{engine}-{version}"


def rebase_commands(diff: dict, base: str = "rebase") -> list[str]:
    """One `patchctl rebase` per regressed (engine, first bad version): the fix to try."""
    seen: list[str] = []
    for issue in issues_for(diff):
        # --store patches: the workflow runs in the checkout, and rebase writes the bundled set only when named.
        command = (
            f"patchctl rebase {issue['engine']} --onto {issue['first_bad_version']} "
            f"--workdir {workdir_for(base, issue['engine'], issue['first_bad_version'])} --store patches --json"
        )
        if command not in seen:
            seen.append(command)
    return seen


def load_rebase(text: str) -> dict:
    doc = json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise ValueError("not a `patchctl rebase --json` document (no 'items' list)")
    return doc


def _rebase_item(rebases: list[dict], engine: str, version: str, patch: str) -> tuple[dict | None, dict | None]:
    for doc in rebases:
        if doc.get("engine") == engine and str(doc.get("new")) == version:
            for item in doc["items"]:
                if item.get("name") == patch:
                    return doc, item
    return None, None


def _conflict_lines(engine: str, patch: str, version: str, doc: dict, item: dict) -> list[str]:
    conflict = item.get("conflict") or {}
    workdir = doc.get("workdir") or "WORKDIR"
    lines = [
        f"`patchctl rebase {engine} --onto {version}` from {doc.get('old')} could not replay it: "
        f"{item.get('reason', '')}".rstrip(),
        "",
    ]
    for cfile in conflict.get("files") or []:
        for region in cfile.get("conflicts") or []:
            lines += [
                f"Conflict in `{cfile['path']}` at line {region.get('line')}, with the upstream lines around it:",
                "",
                "```diff",
                region.get("text", ""),
                "```",
                "",
            ]
    lines += [
        "Resolve it:",
        "",
        "```bash",
        f"patchctl rebase {engine} --onto {version} --workdir {workdir}",
        f"# edit {conflict.get('worktree') or workdir + '/conflicts/' + patch}: remove the conflict markers",
        f"patchctl resolve {engine} {workdir} --patch {patch} --onto {version}",
        f"patchctl check {engine}@{version}",
        "```",
    ]
    return lines


def issues_for(diff: dict, url: str | None = None, rebases: list[dict] | None = None) -> list[dict]:
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
        ]
        doc, item = _rebase_item(rebases or [], engine, first_bad, patch)
        extra: dict = {"fix": None}
        if item and item.get("classification") == "conflict":
            lines += _conflict_lines(engine, patch, first_bad, doc, item)
            extra = {
                "fix": "conflict",
                "conflicts": [
                    {"path": f["path"], "line": c.get("line"), "text": c.get("text", "")}
                    for f in (item.get("conflict") or {}).get("files") or []
                    for c in f.get("conflicts") or []
                ],
            }
        elif item and item.get("classification") in ("refreshed", "unchanged", "upstreamed", "obsolete"):
            lines += [
                f"`patchctl rebase {engine} --onto {first_bad}` classified it `{item['classification']}`: "
                f"{item.get('reason', '')}; the nightly pull request carries the result."
            ]
            extra = {"fix": item["classification"]}
            if item["classification"] == "refreshed":
                extra["refreshed"] = [
                    {"engine": engine, "patch": patch, "version": first_bad, "variant": item.get("new_variant")}
                ]
        else:
            lines += [
                "Try the fix (writes refreshed variants; stops at a conflict with the markers in WORKDIR):",
                "",
                "```bash",
                f"patchctl rebase {engine} --onto {first_bad} --workdir rebase/{engine}-{first_bad} --json",
                f"patchctl check {engine}@{first_bad}",
                "```",
            ]
        if url:
            lines += ["", f"Found by {url}"]
        issues.append(
            {
                "title": title,
                "body": "\n".join(lines) + "\n",
                "engine": engine,
                "patch": patch,
                "first_bad_version": first_bad,
                "versions": [i["version"] for i in items],
                **extra,
            }
        )
    return issues


def gh(args: list[str], *, input_text: str | None = None) -> str:
    result = subprocess.run(["gh", *args], input=input_text, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"gh {' '.join(args[:2])} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def open_titles(repo_args: list[str]) -> set[str]:
    out = gh(
        [
            "issue",
            "list",
            *repo_args,
            "--state",
            "open",
            "--search",
            f"{TITLE_PREFIX} in:title",
            "--limit",
            "500",
            "--json",
            "title",
        ]
    )
    return {entry["title"] for entry in json.loads(out or "[]")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("diff", type=Path, help="output of `patchctl matrix diff --json` ('-' for stdin)")
    parser.add_argument("--dry-run", action="store_true", help="print the issues as JSON; call nothing")
    parser.add_argument("--repo", help="OWNER/NAME (default: gh's, from GH_REPO or the checkout)")
    parser.add_argument("--label", action="append", default=[], help="label to add (must exist in the repo)")
    parser.add_argument(
        "--rebase",
        type=Path,
        action="append",
        default=[],
        help="a `patchctl rebase --json` document for a regressed version (repeatable)",
    )
    parser.add_argument("--rebase-dir", type=Path, help="every *.json in DIR is a --rebase document")
    parser.add_argument(
        "--rebase-commands",
        metavar="DIR",
        help="print the `patchctl rebase` to run per regression (workdirs under DIR), then exit",
    )
    args = parser.parse_args(argv)
    text = sys.stdin.read() if str(args.diff) == "-" else args.diff.read_text()
    try:
        diff = load_diff(text)
        if args.rebase_commands:
            print("\n".join(rebase_commands(diff, args.rebase_commands)))
            return 0
        paths = [*args.rebase, *(sorted(args.rebase_dir.glob("*.json")) if args.rebase_dir and args.rebase_dir.is_dir() else [])]
        rebases = [load_rebase(p.read_text()) for p in paths if p.stat().st_size]
        issues = issues_for(diff, run_url(), rebases)
    except (ValueError, KeyError, OSError) as exc:
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
        if issue.get("fix") in ("refreshed", "unchanged", "upstreamed", "obsolete"):
            print(f"fixed by the rebase ({issue['fix']}), in the pull request: {issue['title']}")
            continue
        if issue["title"] in existing:
            print(f"already open: {issue['title']}")
            continue
        label_args = [a for label in args.label for a in ("--label", label)]
        url = gh(
            ["issue", "create", *repo_args, "--title", issue["title"], "--body-file", "-", *label_args], input_text=issue["body"]
        ).strip()
        print(f"opened: {issue['title']} {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
