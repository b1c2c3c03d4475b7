"""Streaming chat (--backend sglang-oai-chat) against a reasoning model (reasoning_content deltas)."""

import pytest

from checklib.sglang.bench_fixtures import assert_sane, run_bench


def test_patched_times_reasoning_deltas(patched_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(patched_tree, reasoning_server, tmp_path, backend="sglang-oai-chat", stream=True)
    assert_sane(proc, metrics, timing=True)


@pytest.mark.pristine_fails
def test_pristine_ignores_reasoning_deltas(pristine_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(pristine_tree, reasoning_server, tmp_path, backend="sglang-oai-chat", stream=True)
    assert proc.returncode == 0 and metrics is not None, proc.stderr[-2000:]
    assert metrics["mean_ttft_ms"] == 0 or metrics["total_output_tokens_retokenized"] == 0, metrics
