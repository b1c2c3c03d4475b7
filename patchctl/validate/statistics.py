"""Statistics before verdicts: whether two runs' per-request samples differ, and by how much.

The interval is the Mann-Whitney (Hodges-Lehmann) 95% confidence interval of the shift between the
two samples, the difference in medians when the two distributions differ by a shift (Bauer 1972;
what R's wilcox.test(conf.int=TRUE) gives): the order statistics of all pairwise differences at
the rank test's critical value. It is chosen over a bootstrap because it is exact for small samples
(a level's default is 16 requests, where a bootstrap of the median is lumpy and undercovers), needs
no random numbers (the same samples give the same verdict), and assumes nothing about the shape of
the distribution, only that both runs measure the same thing. stdlib only: patchctl's install is
small, and numpy is not in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import NormalDist
from typing import NamedTuple

CONFIDENCE = 0.95
# Per metric and level, what a baseline and a report keep: enough for the interval to be as narrow as
# the samples allow (it narrows as 1/sqrt(n); 256 pins a median to about +-0.15 sigma), few enough that a
# baseline stays a few kB per level and the n*m pairwise differences (65,536) take milliseconds.
MAX_SAMPLES = 256
# Up to this many pairs the rank statistic's exact distribution is used, past it the normal
# approximation (already within a rank of exact at 20 x 20; the exact one costs n * n * m steps).
EXACT_PAIRS = 2500
DIGITS = 6  # significant digits kept per sample: far below any timing's noise


def thin(values: Iterable[float], k: int = MAX_SAMPLES) -> tuple[float, ...]:
    """The values sorted, at most k of them: past k, the order statistics at evenly spaced ranks
    (the smallest and largest kept), so the kept sample has the same quantiles as the whole."""
    xs = sorted(float(v) for v in values if v is not None and math.isfinite(v))
    if len(xs) > k:
        xs = [xs[round(i * (len(xs) - 1) / (k - 1))] for i in range(k)]
    return tuple(float(f"{x:.{DIGITS}g}") for x in xs)


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _rank_counts(n: int, m: int) -> list[int]:
    """How many of the C(n+m, n) orderings give each value 0..n*m of the Mann-Whitney U: the
    coefficients of the Gaussian binomial [n+m choose n], built as prod_i (1 - q^(m+i)) / (1 - q^i),
    each partial product itself a polynomial (integers throughout: no rounding)."""
    poly = [1]
    for i in range(1, n + 1):
        grown = poly + [0] * m
        for j in range(len(grown) - 1, m + i - 1, -1):  # times (1 - q^(m+i))
            grown[j] -= grown[j - m - i]
        for j in range(i, len(grown)):  # over (1 - q^i): exact, the result is a polynomial
            grown[j] += grown[j - i]
        poly = grown[: i * m + 1]
    return poly


def critical_rank(n: int, m: int, confidence: float = CONFIDENCE) -> int:
    """k such that [D_(k), D_(nm+1-k)] of the n*m sorted pairwise differences covers the shift with at
    least `confidence`; 0 when the samples are too small for any interval at that confidence (3 and 3
    at 95%: the most extreme of the 20 orderings already has probability 1/20 > 2.5%)."""
    alpha = (1 - confidence) / 2
    if n * m <= EXACT_PAIRS:
        counts = _rank_counts(min(n, m), max(n, m))
        total = sum(counts)
        k, below = 0, 0
        # the largest k with P(U <= k - 1) <= alpha
        while k < len(counts) and below + counts[k] <= alpha * total:
            below += counts[k]
            k += 1
        return k
    z = NormalDist().inv_cdf(1 - alpha)
    return max(0, math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12)))


class Shift(NamedTuple):
    """How `current` differs from `baseline`, in their unit: the difference of the sample medians,
    and the 95% interval of the shift (None when there are too few samples for one)."""

    n_baseline: int
    n_current: int
    median_baseline: float
    median_current: float
    low: float | None
    high: float | None

    @property
    def difference(self) -> float:
        return self.median_current - self.median_baseline

    def relative(self, value: float | None) -> float | None:
        """A difference as a fraction of the baseline's median."""
        if value is None or not self.median_baseline:
            return None
        return value / abs(self.median_baseline)

    @property
    def significant(self) -> bool:
        """The interval excludes no change."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def shift(baseline: Sequence[float], current: Sequence[float], confidence: float = CONFIDENCE) -> Shift | None:
    """The shift from `baseline` to `current` with its interval; None when either has no sample."""
    xs, ys = [float(v) for v in baseline], [float(v) for v in current]
    if not xs or not ys:
        return None
    k = critical_rank(len(xs), len(ys), confidence)
    low = high = None
    if k >= 1:
        diffs = sorted(y - x for y in ys for x in xs)
        low, high = diffs[k - 1], diffs[len(diffs) - k]
    return Shift(len(xs), len(ys), _median(xs), _median(ys), low, high)
