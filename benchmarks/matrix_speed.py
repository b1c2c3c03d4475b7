"""Full compat matrix (apply/check level) over every version the store covers: cold cache, then
warm, in one run.

    python benchmarks/matrix_speed.py [--workers 4]
    python benchmarks/matrix_speed.py --cache ~/.cache/patchctl    both runs on an existing cache

Reports wall and CPU seconds (user+sys of this process, all worker threads together). With --cache
the "cold" run is only as cold as that cache; the warm run is what a re-run of the matrix costs.
Each run starts as a new process would: the index pages are asked for again, the series parsed again.

Target (issue 6): cold <= 2 minutes on 2 cores, warm a few seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time

from patchctl import store as store_module
from patchctl.matrix import build as matrix
from patchctl.sources import fetch
from patchctl.store import Store


def one_run(store: Store, workers: int) -> tuple[float, float, int, int, int]:
    # A new process would start without the in-memory index pages and parsed series too.
    fetch._index.cache_clear()
    if hasattr(store_module, "clear_series_cache"):
        store_module.clear_series_cache()
    start, cpu_start = time.perf_counter(), time.process_time()
    doc = matrix.build(store, fetch.SourceContext(), workers=workers, nightly=False)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    rows = [r for e in doc["engines"].values() for r in e["versions"].values()]
    cells = sum(len(r["patches"]) for r in rows)
    fetched = sum(r.get("bytes_fetched") or 0 for r in rows)
    return seconds, cpu, len(rows), cells, fetched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--cache", help="use this download cache instead of a fresh temporary one")
    args = parser.parse_args()
    store = Store.open()
    with contextlib.ExitStack() as stack:
        cache = args.cache or stack.enter_context(tempfile.TemporaryDirectory())
        os.environ["PATCHCTL_CACHE_DIR"] = os.path.expanduser(cache)
        cold = one_run(store, args.workers)
        warm = one_run(store, args.workers)
    print(f"matrix over {', '.join(store.engines())}, {args.workers} workers, {os.cpu_count()} cores"
          + (f", cache {args.cache}" if args.cache else ", fresh cache"))
    print(f"{'run':<6} {'wall s':>8} {'CPU s':>8} {'versions':>9} {'cells':>6} {'bytes fetched':>14}")
    for name, (seconds, cpu, versions, cells, fetched) in (("cold", cold), ("warm", warm)):
        print(f"{name:<6} {seconds:>8.2f} {cpu:>8.2f} {versions:>9} {cells:>6} {fetched:>14,}")
    print(f"cold target <= 120 s: {'met' if cold[0] <= 120 else 'NOT met'}; warm/cold = {warm[0] / cold[0]:.2%}")


if __name__ == "__main__":
    main()
