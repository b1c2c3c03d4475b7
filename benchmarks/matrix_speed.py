"""Full compat matrix (apply/check level) over every version the store covers: cold cache, then
warm, in one run.

    python benchmarks/matrix_speed.py [--workers 4]
    python benchmarks/matrix_speed.py --cache ~/.cache/patchctl    both runs on an existing cache

Reports wall and CPU seconds (user+sys of this process, all worker threads together). With --cache
the "cold" run is only as cold as that cache; the warm run is what a re-run of the matrix costs.
Each run starts as a new process would: the index pages are asked for again, the series parsed again.

Targets: cold <= 2 minutes on 2 cores, warm a few seconds (issue 6); cold <= 5 s on this machine's
link (issue 17). "needed" is the least a sparse read of the same cells can fetch, from what the cold
run cached: for a wheel, its tail from RECORD's local header to the end (the central directory and
RECORD, which vouches for every member) plus each member read (local header, name, compressed
bytes); for an sdist, the whole file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import patchctl.store.reading as store_module
from patchctl.matrix import build as matrix
from patchctl.sources import fetch
from patchctl.store.layered import Store


def needed_bytes(doc: dict, cache: Path) -> int:
    """The lower bound described in the module docstring, for the rows of a cold run."""
    from patchctl.core.engines import get_engine
    from patchctl.sources import zipread
    from patchctl.sources.cache import ArtifactCache, member_key, unframe
    from patchctl.sources.release import CENTRAL_DIRECTORY_FILE

    artifacts = ArtifactCache(cache)
    total = 0
    for engine, data in doc["engines"].items():
        prefix = get_engine(engine).layout_prefix("wheel")
        for row in data["versions"].values():
            folders = artifacts.unverified_of(str(row.get("sha256")))
            whole = artifacts.verified(str(row.get("sha256"))).is_dir()
            if not row.get("bytes_fetched") or not (folders or whole):
                continue
            folder = folders[0] if folders else artifacts.verified(str(row.get("sha256")))
            cd = unframe(artifacts.read_file(folder / CENTRAL_DIRECTORY_FILE))
            if cd is None:  # read whole (an sdist)
                total += row["bytes_fetched"]
                continue
            entries = zipread.parse_central_directory(cd)
            record = zipread.record_name(entries)  # in the tail
            tails = json.loads(artifacts.read_file(artifacts.tails(get_engine(engine).dist)) or b"{}")
            total += tails[row["version"]]
            members = {p.name for p in (folder / "members").iterdir()} if (folder / "members").is_dir() else set()
            for name, entry in entries.items():
                if name == record or not name.startswith(prefix):
                    continue
                if member_key(name[len(prefix) :]) in members:
                    total += 30 + len(name.encode()) + entry.compressed_size
    return total


def one_run(store: Store, workers: int) -> tuple[float, float, int, int, int, dict]:
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
    return seconds, cpu, len(rows), cells, fetched, doc


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
        needed = needed_bytes(cold[5], Path(os.environ["PATCHCTL_CACHE_DIR"])) if not args.cache else None
        warm = one_run(store, args.workers)
    print(
        f"matrix over {', '.join(store.engines())}, {args.workers} workers, {os.cpu_count()} cores"
        + (f", cache {args.cache}" if args.cache else ", fresh cache")
    )
    print(f"{'run':<6} {'wall s':>8} {'CPU s':>8} {'versions':>9} {'cells':>6} {'bytes fetched':>14} {'needed':>14}")
    for name, (seconds, cpu, versions, cells, fetched, _) in (("cold", cold), ("warm", warm)):
        need = f"{needed:,}" if name == "cold" and needed is not None else "-"
        print(f"{name:<6} {seconds:>8.2f} {cpu:>8.2f} {versions:>9} {cells:>6} {fetched:>14,} {need:>14}")
    if needed:
        print(f"cold fetched / needed = {cold[4] / needed:.3f}")
    print(
        f"cold <= 120 s (issue 6): {'met' if cold[0] <= 120 else 'NOT met'}; cold <= 5 s (issue 17): "
        f"{'met' if cold[0] <= 5 else 'NOT met'}; warm/cold = {warm[0] / cold[0]:.2%}"
    )


if __name__ == "__main__":
    main()
