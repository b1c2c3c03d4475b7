"""What the statistics of a baseline comparison cost, per (level, figure): validate's Mann-Whitney /
Hodges-Lehmann interval of the shift (patchctl/validate/statistics.py) against a seeded bootstrap of
the difference in medians (the other usual choice: 2000 resamples), and the floor: the two medians
alone, the least any comparison does. Also how often each calls two samples of one distribution
different (should be <= 5%) and finds a 10% shift, over the same seeded trials.

    python benchmarks/validate_statistics.py [--trials 200]

A validate run compares 2 figures at each of its levels (3 by default): the total is 6 of these.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patchctl.validate.statistics import shift  # noqa: E402

RESAMPLES = 2000


def sample(rng: random.Random, n: int, median: float) -> list[float]:
    return [median * math.exp(rng.gauss(0, 0.04)) for _ in range(n)]


def bootstrap(a: list[float], b: list[float], rng: random.Random) -> tuple[float, float]:
    diffs = sorted(st.median(rng.choices(b, k=len(b))) - st.median(rng.choices(a, k=len(a))) for _ in range(RESAMPLES))
    return diffs[int(0.025 * RESAMPLES)], diffs[int(0.975 * RESAMPLES) - 1]


def mann_whitney(a: list[float], b: list[float], _rng: random.Random) -> tuple[float, float]:
    sh = shift(a, b)
    assert sh is not None and sh.low is not None and sh.high is not None
    return sh.low, sh.high


def floor(a: list[float], b: list[float], _rng: random.Random) -> tuple[float, float]:
    d = st.median(b) - st.median(a)
    return d, d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    args = ap.parse_args()
    methods = {"floor (medians)": floor, "Mann-Whitney/HL": mann_whitney, f"bootstrap x{RESAMPLES}": bootstrap}
    print(f"{'n per run':>9}  {'method':<18} {'ms per compare':>14}  {'false alarms':>12}  {'10% found':>9}")
    for n in (16, 64, 256):
        for name, fn in methods.items():
            rng = random.Random(n)
            false_alarms = found = 0
            spent = 0.0
            for _ in range(args.trials):
                same = (sample(rng, n, 100.0), sample(rng, n, 100.0))
                moved = (sample(rng, n, 100.0), sample(rng, n, 90.0))
                t0 = time.perf_counter()
                lo, hi = fn(*same, rng)
                spent += time.perf_counter() - t0
                false_alarms += lo > 0 or hi < 0
                lo, hi = fn(*moved, rng)
                found += hi < 0
            ms = spent / args.trials * 1000
            print(
                f"{n:>9}  {name:<18} {ms:>14.2f}  {false_alarms / args.trials:>12.1%}  {found / args.trials:>9.1%}"
                + ("  (no interval: always 'changes')" if fn is floor else "")
            )


if __name__ == "__main__":
    main()
