"""benchmarks/validate_vs_peers.py's server pace: llama.cpp's per-request timings read from its log,
and the figures of runs made at different paces brought to one (what the llama.cpp comparison in
test_serve_llama.py asserts on)."""

from __future__ import annotations

import pytest

from .test_serve_peers import bench_module

bench = bench_module()


def request_lines(prefill_ms: float, prompt_tokens: int, decode_ms: float, runs: int, total_ms: float) -> str:
    """One request's lines as llama-cpp-python 0.3's server writes them (its verbose default)."""
    return (
        'INFO:     127.0.0.1:39896 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        "Llama.generate: 10 prefix-match hit, remaining 24 prompt tokens to eval\n"
        "llama_perf_context_print:        load time =       0.30 ms\n"
        f"llama_perf_context_print: prompt eval time =     {prefill_ms:.2f} ms /    {prompt_tokens} tokens "
        "(    8.53 ms per token,   117.23 tokens per second)\n"
        f"llama_perf_context_print:        eval time =     {decode_ms:.2f} ms /    {runs} runs   "
        "(   37.31 ms per token,    26.80 tokens per second)\n"
        f"llama_perf_context_print:       total time =    {total_ms:.2f} ms /    31 tokens\n"
        "llama_perf_context_print:    graphs reused =         30\n"
    )


def test_pace_reads_the_last_n_requests_and_leaves_out_readings_that_are_not_a_prefill():
    log = (
        request_lines(400.0, 26, 300.0, 7, 800.0)  # a warm-up, before the run's n
        + request_lines(0.05, 30, 217.0, 7, 525.0)  # llama.cpp's counter reading 0 for a real prefill
        + request_lines(0.00, 1, 310.0, 31, 330.0)  # a prefix-cache hit: one token evaluated
        + request_lines(204.0, 24, 310.0, 31, 600.0)
        + request_lines(220.0, 24, 341.0, 31, 640.0)
    )
    pace = bench.pace_of(log, 4)
    assert pace == {
        "server_prefill_ms": pytest.approx(212.0),
        "server_decode_ms": pytest.approx(10.5),
        "server_total_ms": pytest.approx(525.0 + 330.0 + 600.0 + 640.0),
    }
    assert bench.pace_of(log, 6) is None  # fewer requests in the log than the run sent


def test_runs_at_different_paces_come_to_one():
    # Two clients that add the same 12 ms to TTFT and 1 ms a token, measured while the server ran at
    # different paces: as measured they differ by far more than 5%, at one pace not at all.
    def run(prefill: float, decode: float, client_ms: float = 12.0) -> dict[str, float]:
        tokens, requests = 32.0, 16
        total_ms = prefill + decode * (tokens - 1)
        wall_s = requests * (total_ms + 15.0) / 1000
        return {
            "ttft": prefill + client_ms,
            "tpot": decode + 1.0,
            "itl": decode + 1.0,
            "tok_s": tokens * requests / wall_s,
            "tokens": tokens,
            "run_tokens": tokens * requests,
            "server_prefill_ms": prefill,
            "server_decode_ms": decode,
            "server_total_ms": requests * total_ms,
        }

    runs = {"validate": [run(300.0, 36.0), run(200.0, 27.0)], "bench_serving": [run(210.0, 28.0), run(290.0, 35.0)]}
    tools = {tool: {key: [r[key] for r in rs] for key in rs[0]} for tool, rs in runs.items()}
    assert tools["validate"]["ttft"][0] / tools["bench_serving"]["ttft"][0] - 1 > 0.3
    at_pace = bench.paced(tools)
    for figure in ("ttft", "tpot", "itl", "tok_s"):
        values = at_pace["validate"][figure] + at_pace["bench_serving"][figure]
        assert max(values) == pytest.approx(min(values), rel=1e-9), (figure, values)
    # The common pace is the median of every run's: TTFT = its prefill (250) + the clients' 12 ms.
    assert at_pace["validate"]["ttft"][0] == pytest.approx(262.0)


def test_a_difference_that_is_the_clients_stays():
    """A client that adds 30 ms more to TTFT than the other keeps those 30 ms at one pace: the pacing
    takes out the server's drift, not a slow client (so the llama.cpp comparison can fail)."""

    def run(prefill: float, client_ms: float) -> dict[str, float]:
        return {
            "ttft": prefill + client_ms,
            "tpot": 31.0,
            "itl": 31.0,
            "tok_s": 25.0,
            "tokens": 32.0,
            "run_tokens": 512.0,
            "server_prefill_ms": prefill,
            "server_decode_ms": 30.0,
            "server_total_ms": 16 * (prefill + 30.0 * 31),
        }

    tools = {
        tool: {key: [r[key] for r in rs] for key in rs[0]}
        for tool, rs in {
            "validate": [run(200.0, 42.0), run(300.0, 42.0)],
            "bench_serving": [run(300.0, 12.0), run(200.0, 12.0)],
        }.items()
    }
    at_pace = bench.paced(tools)
    assert [round(v - w, 6) for v, w in zip(at_pace["validate"]["ttft"], at_pace["bench_serving"]["ttft"], strict=True)] == [
        30.0,
        30.0,
    ]
