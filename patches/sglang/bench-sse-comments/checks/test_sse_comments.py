"""Streamed replies with SSE keep-alive comments (": ping - ...") between their events, as
sse-starlette servers (llama.cpp's Python server) send them: chat (--backend sglang-oai-chat)
and native /generate (--backend sglang)."""

import pytest

from checklib.sglang.bench_fixtures import NUM_PROMPTS, assert_sane, run_bench


@pytest.mark.parametrize("backend", ["sglang-oai-chat", "sglang"])
def test_patched_skips_keepalive_comments(patched_tree, pinging_server, tmp_path, backend):
    proc, metrics = run_bench(patched_tree, pinging_server, tmp_path, backend=backend, stream=True)
    assert_sane(proc, metrics, timing=True)


@pytest.mark.pristine_fails
def test_pristine_fails_on_keepalive_comments(pristine_tree, pinging_server, reasoning_server, tmp_path):
    # The native backend: the pristine release streams it right without comments (the control),
    # so what fails with them is the comment line alone.
    for name in ("plain", "pinged"):
        (tmp_path / name).mkdir()
    proc, metrics = run_bench(pristine_tree, reasoning_server, tmp_path / "plain", backend="sglang", stream=True)
    assert_sane(proc, metrics, timing=True)
    proc, metrics = run_bench(pristine_tree, pinging_server, tmp_path / "pinged", backend="sglang", stream=True)
    assert proc.returncode != 0 or metrics is None or metrics["completed"] < NUM_PROMPTS, metrics
