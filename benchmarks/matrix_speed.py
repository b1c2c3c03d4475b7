"""Full compat matrix (apply/check level) over every version the store covers: cold cache, then
warm, in one run.

    python benchmarks/matrix_speed.py [--workers 4]

Target (issue 6): cold <= 2 minutes on 2 cores, warm a few seconds.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from patchctl.matrix import build as matrix
from patchctl.sources import fetch
from patchctl.store import Store


def one_run(store: Store, workers: int) -> tuple[float, int, int, int]:
    fetch._index.cache_clear()  # a new process would start without the in-memory index pages too
    start = time.perf_counter()
    doc = matrix.build(store, fetch.SourceContext(), workers=workers, nightly=False)
    seconds = time.perf_counter() - start
    rows = [r for e in doc["engines"].values() for r in e["versions"].values()]
    cells = sum(len(r["patches"]) for r in rows)
    fetched = sum(r.get("bytes_fetched") or 0 for r in rows)
    return seconds, len(rows), cells, fetched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    store = Store.open()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PATCHCTL_CACHE_DIR"] = cache
        cold = one_run(store, args.workers)
        warm = one_run(store, args.workers)
    print(f"matrix over {', '.join(store.engines())}, {args.workers} workers, {os.cpu_count()} cores")
    print(f"{'run':<6} {'wall s':>8} {'versions':>9} {'cells':>6} {'bytes fetched':>14}")
    for name, (seconds, versions, cells, fetched) in (("cold", cold), ("warm", warm)):
        print(f"{name:<6} {seconds:>8.1f} {versions:>9} {cells:>6} {fetched:>14,}")
    print(f"cold target <= 120 s: {'met' if cold[0] <= 120 else 'NOT met'}; warm/cold = {warm[0] / cold[0]:.2%}")


if __name__ == "__main__":
    main()
