"""Statistics before verdicts (issue 37 item 3): synthetic samples whose answer is known."""

from __future__ import annotations

import math
import random

import pytest

from patchctl.validate import baseline as bl
from patchctl.validate.statistics import MAX_SAMPLES, critical_rank, shift, thin

TRIALS = 400


def _sample(rng: random.Random, n: int, median: float, spread: float = 0.04) -> list[float]:
    """Per-request tok/s as servers give them: log-normal around `median`, a few % wide."""
    return [median * math.exp(rng.gauss(0, spread)) for _ in range(n)]


@pytest.mark.parametrize(("n", "k"), [(4, 1), (5, 3), (8, 14), (10, 24), (20, 128)])
def test_the_critical_rank_is_the_published_tables(n, k):
    # Two-sided 5% critical values of the Mann-Whitney U for equal samples, plus one.
    assert critical_rank(n, n) == k


def test_three_and_three_are_too_few_for_a_95_percent_interval():
    assert critical_rank(3, 3) == 0
    sh = shift([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert sh is not None and sh.low is None and not sh.significant


def test_the_normal_approximation_meets_the_exact_distribution_where_they_hand_over():
    # 50 x 50 is the last exact size; 51 x 51 the first approximated one: the two agree to a rank.
    exact = critical_rank(50, 50)
    assert abs(exact - (math.floor(1250 - 1.959964 * math.sqrt(2500 * 101 / 12)))) <= 1
    assert 0 < critical_rank(51, 51) - exact < 60


@pytest.mark.parametrize("n", [16, 64])
def test_identical_distributions_are_not_significant_in_95_percent_of_trials(n):
    rng = random.Random(20260537 + n)
    significant = 0
    for _ in range(TRIALS):
        sh = shift(_sample(rng, n, 100.0), _sample(rng, n, 100.0))
        assert sh is not None
        significant += sh.significant
    assert significant <= 0.05 * TRIALS, f"{significant}/{TRIALS} false alarms"


@pytest.mark.parametrize("n", [16, 64])
def test_the_interval_covers_the_true_shift_in_95_percent_of_trials(n):
    rng = random.Random(37 + n)
    covered = 0
    for _ in range(TRIALS):
        base, now = _sample(rng, n, 100.0), _sample(rng, n, 90.0)
        sh = shift(base, now)
        assert sh is not None and sh.low is not None and sh.high is not None
        covered += sh.low <= -10.0 <= sh.high
    assert covered >= 0.95 * TRIALS - 2 * math.sqrt(TRIALS * 0.05 * 0.95), f"covered {covered}/{TRIALS}"


def test_a_20_percent_shift_is_significant_every_time():
    rng = random.Random(5)
    for _ in range(TRIALS // 4):
        sh = shift(_sample(rng, 16, 100.0), _sample(rng, 16, 80.0))
        assert sh is not None and sh.significant and sh.high is not None and sh.high < 0
        low, high = sh.relative(sh.low), sh.relative(sh.high)
        assert low is not None and high is not None and low < -0.12 and high > -0.28


def test_thinning_keeps_the_extremes_and_the_quantiles_within_its_bound():
    values = [float(i) for i in range(10_000)]
    kept = thin(reversed(values))
    assert len(kept) == MAX_SAMPLES and kept[0] == 0.0 and kept[-1] == 9999.0
    assert list(kept) == sorted(kept)
    assert abs(kept[MAX_SAMPLES // 2] - 5000) < 10000 / MAX_SAMPLES
    assert thin([3.0, float("nan"), 1.0]) == (1.0, 3.0)


def _baseline(levels, samples):
    return bl.Baseline(bl.Deployment("m", "1", "p"), "now", levels, None, samples)


def test_a_change_past_the_threshold_that_is_noise_is_no_regression():
    # One level whose throughput figure happens to read 8% low, while its requests are drawn from the
    # same distribution as the baseline's: noise, not a regression (main called it one).
    rng = random.Random(1)
    then, now = _sample(rng, 16, 100.0, spread=0.3), _sample(rng, 16, 100.0, spread=0.3)
    base = _baseline({8: {"output_tok_s": 1000.0}}, {8: {"request_tok_s": tuple(then)}})
    (check,) = bl.compare({8: {"output_tok_s": 920.0}}, base, 0.05, ("output_tok_s",), {8: {"request_tok_s": now}})
    assert not check.regressed and check.evidence == bl.SAMPLED and not check.significant
    text = check.describe(0.05)
    assert "no significant change (±" in text and "% at 95%) ok" in text, text
    bound = max(abs(check.ci_low), abs(check.ci_high))
    assert f"±{bound:.1%}" in text and bound > 0.05


def test_a_significant_drop_past_the_threshold_regresses_and_names_its_interval():
    rng = random.Random(2)
    then, now = _sample(rng, 32, 100.0), _sample(rng, 32, 80.0)
    base = _baseline({1: {"decode_tok_s_p50": 100.0}}, {1: {"decode_tok_s": tuple(then)}})
    (check,) = bl.compare({1: {"decode_tok_s_p50": 80.0}}, base, current_samples={1: {"decode_tok_s": now}})
    assert check.regressed and check.significant and check.samples == (32, 32)
    text = check.describe(0.05)
    assert "95% interval -" in text and "significant and beyond the 5% threshold REGRESSED" in text


def test_a_significant_change_within_the_threshold_is_said_but_passes():
    rng = random.Random(3)
    then, now = _sample(rng, 256, 100.0, 0.01), _sample(rng, 256, 97.0, 0.01)
    base = _baseline({1: {"ttft_ms_p50": 100.0}}, {1: {"ttft_ms": tuple(then)}})
    (check,) = bl.compare({1: {"ttft_ms_p50": 97.0}}, base, 0.05, ("ttft_ms_p50",), {1: {"ttft_ms": now}})
    # Lower TTFT is better: significantly better, never a regression.
    assert check.significant and not check.regressed and "significantly better ok" in check.describe(0.05)
    (worse,) = bl.compare({1: {"ttft_ms_p50": 103.0}}, base, 0.05, ("ttft_ms_p50",), {1: {"ttft_ms": [x * 1.06 for x in now]}})
    assert worse.significant and not worse.regressed and "significant but within the 5% threshold ok" in worse.describe(0.05)


def test_a_baseline_without_samples_is_held_to_the_threshold_alone_and_says_so():
    base = _baseline({1: {"output_tok_s": 100.0, "ttft_ms_p99": 10.0}}, None)
    now = {1: {"output_tok_s": 90.0, "ttft_ms_p99": 20.0}}
    checks = bl.compare(now, base, 0.05, ("output_tok_s", "ttft_ms_p99"), {1: {"request_tok_s": [1.0]}})
    assert [c.regressed for c in checks] == [True, True]
    assert checks[0].evidence == bl.NO_BASELINE_SAMPLES and checks[0].describe(0.05).endswith(
        "REGRESSED; no samples in the baseline: threshold only"
    )
    assert checks[1].evidence == bl.NO_SAMPLE_METRIC


def test_the_baseline_keeps_its_samples_and_provenance(tmp_path):
    store = bl.BaselineStore(tmp_path)
    dep = bl.Deployment("m", "1", "p")
    store.save(dep, {1: {"output_tok_s": 1.0}}, None, {1: {"request_tok_s": (1.0, 2.0)}}, {"gpu_name": "X"})
    loaded = store.load(dep)
    assert loaded is not None and loaded.samples == {1: {"request_tok_s": (1.0, 2.0)}}
    assert loaded.provenance == {"gpu_name": "X"}
