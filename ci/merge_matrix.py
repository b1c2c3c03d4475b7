#!/usr/bin/env python3
"""Merge a fresh check-only matrix into the committed compat_matrix.yaml without losing evidence.

  ci/merge_matrix.py compat_matrix.yaml fresh.yaml [--smoke-dir smoke] -o compat_matrix.yaml \\
      --markdown compat_matrix.md --html compat_matrix.html --run-log run-log.json --smoke-todo smoke-todo.json

For every fresh row whose artifact sha256 equals the committed row's, each cell whose outcome,
variant and `checked` fingerprint (the variant's bytes and the patch's checks) are unchanged keeps
the committed `evidence` and `smoke` (a fresh cell that carries its own `smoke` wins); a refreshed
variant or a changed check is smoke-tested again. Rows of new or changed artifacts take the fresh result and are listed in
--smoke-todo (`[{engine, version}]`, each engine's nightly first), so the workflow runs the CPU
smoke only for them. The --smoke-dir files (`patchctl matrix --version V --smoke` runs) add their
cells' smoke evidence to the rows the fresh run wrote, where outcome, variant and fingerprint agree.
Rows only in the committed file are kept. Per-run noise (`seconds`,
`bytes_fetched`) goes to --run-log, never into the committed YAML: merging the same inputs twice
gives byte-identical files.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

NOISE = ("seconds", "bytes_fetched")
KEPT = ("evidence", "smoke")
SAME = ("outcome", "variant", "checked")  # what the kept evidence was made with


def merge(committed: dict | None, fresh: dict, part: bool = False) -> tuple[dict, list[dict], list[dict]]:
    """(merged document, smoke to-do list, run log entries). part: a smoke run of a few rows (the
    --smoke-dir files), whose nightly note counts only where it carries the nightly row."""
    from patchctl.matrix import build as matrix

    merged = copy.deepcopy(committed) if committed else {"schema": matrix.SCHEMA, "engines": {}}
    todo, log = [], []
    for engine, data in fresh["engines"].items():
        target = merged["engines"].setdefault(engine, {"patches": [], "evidence": {}, "versions": {}})
        target["patches"] = list(data["patches"])
        target["evidence"] = copy.deepcopy(data.get("evidence", {}))
        # A part made with --no-nightly (a smoke run of a few releases) says "skipped: disabled": that
        # must not replace what the full run found.
        if "nightly" in data and (not part or "nightly" in data["versions"]):
            target["nightly"] = data["nightly"]
        for version, row in data["versions"].items():
            row = copy.deepcopy(row)
            log.append({"engine": engine, "version": version, **{k: row.pop(k) for k in NOISE if k in row}})
            old = target["versions"].get(version)
            if part and old is not None and not row.get("error"):
                # A smoke part adds evidence to the row the full run wrote (its artifact stays: the
                # smoke's trees come from the release's sdist whatever artifact the check read).
                for patch, cell in (row.get("patches") or {}).items():
                    into = (old.get("patches") or {}).get(patch)
                    if "smoke" in cell and into and all(into.get(k) == cell.get(k) for k in SAME):
                        into.update({key: cell[key] for key in KEPT if key in cell})
                continue
            same_artifact = bool(old and row.get("sha256") and old.get("sha256") == row.get("sha256"))
            stale = not same_artifact or bool(row.get("error"))
            for patch, cell in (row.get("patches") or {}).items():
                old_cell = ((old or {}).get("patches") or {}).get(patch) if same_artifact else None
                if "smoke" in cell:
                    continue  # a fresh smoke result
                if old_cell and all(old_cell.get(k) == cell.get(k) for k in SAME):
                    for key in KEPT:
                        if key in old_cell:
                            cell[key] = old_cell[key]
                else:
                    stale = True
            if stale and not row.get("error"):
                todo.append({"engine": engine, "version": version})
            target["versions"][version] = row
        for row in target["versions"].values():
            for key in NOISE:
                row.pop(key, None)
        target["versions"] = dict(sorted(target["versions"].items(), key=lambda kv: matrix._version_key(kv[0])))
    todo.sort(key=lambda j: (j["engine"], j["version"] != "nightly"))
    return merged, todo, log


def main(argv: list[str] | None = None) -> int:
    from patchctl.errors import PatchctlError
    from patchctl.matrix import build as matrix
    from patchctl.matrix.html_page import render_html

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("committed", type=Path, help="the committed compat_matrix.yaml (may not exist yet)")
    parser.add_argument("fresh", type=Path, nargs="+", help="fresh run(s), merged in order")
    parser.add_argument("--smoke-dir", type=Path, help="also merge every *.yaml in DIR (smoke runs), in name order")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--html", type=Path)
    parser.add_argument("--run-log", type=Path, help="JSON: the per-run timings left out of the YAML")
    parser.add_argument("--smoke-todo", type=Path, help="JSON: the rows whose smoke must run again")
    args = parser.parse_args(argv)
    try:
        committed = matrix.load(args.committed) if args.committed.is_file() else None
        doc, todo, log = committed, [], []
        extra = sorted(args.smoke_dir.glob("*.yaml")) if args.smoke_dir and args.smoke_dir.is_dir() else []
        for path in [*args.fresh, *extra]:
            doc, more, entries = merge(doc, matrix.load(path), part=path in extra)
            todo += [j for j in more if j not in todo]
            log += entries
    except PatchctlError as exc:
        print(f"merge_matrix: {exc.message}", file=sys.stderr)
        return 2
    args.output.write_text(matrix.dump(doc))
    if args.markdown:
        args.markdown.write_text(matrix.markdown(doc))
    if args.html:
        args.html.write_text(render_html(doc, previous=committed), encoding="utf-8")
    if args.run_log:
        args.run_log.write_text(json.dumps(log, indent=1) + "\n")
    if args.smoke_todo:
        args.smoke_todo.write_text(json.dumps(todo, indent=1) + "\n")
    failed = matrix.nightly_failed(doc)
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a") as out:
            out.write(f"nightly_failed={','.join(failed)}\nsmoke_todo={len(todo)}\n")
    print(f"wrote {args.output}; smoke to run again for {len(todo)} row(s)"
          + (f"; nightly FAILED for {', '.join(failed)}" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
