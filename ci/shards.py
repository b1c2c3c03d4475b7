#!/usr/bin/env python3
"""List the (engine, version) jobs of `patchctl matrix` and split them into shards for CI fan-out.

Prints a JSON document {count, shards, jobs}; with GITHUB_OUTPUT set (inside Actions) it also
writes `count`, `shards` (a JSON list for `fromJSON` in a matrix strategy) and `jobs` there.

The split must be the one `patchctl matrix --shard I/N` makes, so it is computed from the same
job list (`patchctl.matrix.build.versions_for`, in the same order) and the same rule (job n goes to
shard n % N + 1); tests/test_ci_scripts.py checks the two agree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from patchctl.core.errors import PatchctlError
from patchctl.matrix import build as matrix
from patchctl.sources.fetch import SourceContext
from patchctl.store.layered import Store


def shard_count(jobs: int, per_shard: int, max_shards: int) -> int:
    # At least one shard, so the fan-out job always has an entry and the merge always has input.
    return max(1, min(max_shards, math.ceil(jobs / max(per_shard, 1))))


def plan(store: Store, ctx, engines: list[str] | None, per_shard: int, max_shards: int) -> dict:
    engines = engines or store.engines()
    jobs = [(e, v) for e in engines for v in matrix.versions_for(e, store, ctx)]
    count = shard_count(len(jobs), per_shard, max_shards)
    return {
        "count": count,
        "shards": list(range(1, count + 1)),
        "jobs": [{"engine": e, "version": str(v), "shard": n % count + 1} for n, (e, v) in enumerate(jobs)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="patch store (default: patchctl's: $PATCHCTL_STORE or ./patches)")
    parser.add_argument("--engine", action="append", dest="engines", help="only this engine (repeatable)")
    parser.add_argument("--index-url", help="package index (default: pip's configuration, as patchctl does)")
    parser.add_argument("--per-shard", type=int, default=8, help="about this many versions per shard")
    parser.add_argument("--max-shards", type=int, default=8)
    args = parser.parse_args(argv)
    try:
        doc = plan(Store.open(args.store), SourceContext(index_url=args.index_url), args.engines, args.per_shard, args.max_shards)
    except PatchctlError as exc:
        print(f"shards: {exc.message}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(doc, indent=2))
    github_output = os.environ.get("GITHUB_OUTPUT")
    if github_output:
        with open(github_output, "a", encoding="utf-8") as out:
            out.write(f"count={doc['count']}\n")
            out.write(f"shards={json.dumps(doc['shards'])}\n")
            out.write(f"jobs={len(doc['jobs'])}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
