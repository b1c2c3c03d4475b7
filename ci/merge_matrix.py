#!/usr/bin/env python3
"""Merge a fresh check-only matrix into the committed compat_matrix.yaml without losing evidence
(the command line of patchctl/matrix/merge.py, which says what is kept and why).

  ci/merge_matrix.py compat_matrix.yaml fresh.yaml [--smoke-dir smoke] -o compat_matrix.yaml \\
      --markdown compat_matrix.md --html compat_matrix.html --run-log run-log.json --smoke-todo smoke-todo.json

What is kept and why is patchctl/matrix/merge.py's. --smoke-todo gets the rows whose smoke must run
again (`[{engine, version}]`, each engine's nightly first), so the workflow runs the CPU smoke only
for them; --run-log the per-run noise (`seconds`, `bytes_fetched`) that never goes into the committed
YAML: merging the same inputs twice gives byte-identical files. Every file is written atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from patchctl.core.atomic import write_atomic
    from patchctl.core.errors import PatchctlError
    from patchctl.matrix import build as matrix
    from patchctl.matrix.html_page import render_html
    from patchctl.matrix.merge import merge_files

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
        extra = sorted(args.smoke_dir.glob("*.yaml")) if args.smoke_dir and args.smoke_dir.is_dir() else []
        doc, todo, log = merge_files(committed, args.fresh, extra)
    except PatchctlError as exc:
        print(f"merge_matrix: {exc.message}", file=sys.stderr)
        return 2
    write_atomic(args.output, matrix.dump(doc).encode())
    if args.markdown:
        write_atomic(args.markdown, matrix.markdown(doc).encode())
    if args.html:
        write_atomic(args.html, render_html(doc, previous=committed).encode("utf-8"))
    if args.run_log:
        write_atomic(args.run_log, (json.dumps(log, indent=1) + "\n").encode())
    if args.smoke_todo:
        write_atomic(args.smoke_todo, (json.dumps(todo, indent=1) + "\n").encode())
    failed = matrix.nightly_failed(doc)
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a") as out:
            out.write(f"nightly_failed={','.join(failed)}\nsmoke_todo={len(todo)}\n")
    print(
        f"wrote {args.output}; smoke to run again for {len(todo)} row(s)"
        + (f"; nightly FAILED for {', '.join(failed)}" if failed else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
