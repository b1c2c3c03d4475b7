"""Native /generate without streaming (--backend sglang --disable-stream): TPOT and ITL."""

import pytest

from checklib.sglang.bench_fixtures import assert_sane, run_bench


def test_patched_reports_positive_tpot_and_itl(patched_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(patched_tree, reasoning_server, tmp_path, backend="sglang", stream=False)
    assert_sane(proc, metrics, timing=True)
    # amortized: TTFT, TPOT and ITL all equal latency / n per request
    assert abs(metrics["mean_tpot_ms"] - metrics["mean_itl_ms"]) < 1e-6 * max(1.0, metrics["mean_itl_ms"]) + 1e-9


@pytest.mark.pristine_fails
def test_pristine_reports_negative_tpot_or_zero_itl(pristine_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(pristine_tree, reasoning_server, tmp_path, backend="sglang", stream=False)
    assert proc.returncode == 0 and metrics is not None, proc.stderr[-2000:]
    assert metrics["mean_tpot_ms"] <= 0 or metrics["mean_itl_ms"] == 0, metrics
