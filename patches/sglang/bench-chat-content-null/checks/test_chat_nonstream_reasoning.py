"""Non-streaming chat (--backend sglang-oai-chat --disable-stream) against a reasoning model."""

import pytest

from checklib.sglang.bench_fixtures import assert_sane, run_bench


def test_patched_counts_reasoning_content(patched_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(patched_tree, reasoning_server, tmp_path, backend="sglang-oai-chat", stream=False)
    # TTFT is the whole latency for a non-streamed chat reply (upstream's definition): no TPOT/ITL claim
    assert_sane(proc, metrics, timing=False)


@pytest.mark.pristine_fails
def test_pristine_crashes_on_content_null(pristine_tree, reasoning_server, tmp_path):
    proc, metrics = run_bench(pristine_tree, reasoning_server, tmp_path, backend="sglang-oai-chat", stream=False)
    assert proc.returncode != 0 or metrics is None or metrics["total_output_tokens_retokenized"] == 0
