"""validate's long-context checks and logprob numerics (issue 37 items 1 and 2), against the test
reasoner: it finds a needle as a right model does, and is told to lose it past N tokens, to be slow
in proportion to the prompt, or to move its logprobs."""

from __future__ import annotations

import json

import pytest
from support.invoke import run_json

from patchctl.core.errors import UsageError
from patchctl.validate import golden as golden_mod
from patchctl.validate import haystack, numerics
from patchctl.validate.client import OpenAIClient
from patchctl.validate.report import ServeReport
from patchctl.validate.serverinfo import context_limit, limit_from_error
from patchctl.validate.validation import ServeConfig, run_validate

from .text import validate_text


def config(url: str, **kw) -> ServeConfig:
    return ServeConfig(**{"base_url": url, "answers": False, "throughput": False, **kw})


def test_a_server_that_loses_the_needle_past_2000_tokens_fails_at_each_longer_length(shape_server):
    shape_server.settings["needle_lost_past"] = 2000
    report = run_validate(config(shape_server.base_url))
    lc = report.long_context
    # quick: 1k and 4k, then the server's 8192 (its /v1/models max_model_len) in place of 16k and 64k
    assert (lc.limit, lc.limit_source, lc.counted_by) == (8192, "/v1/models max_model_len", "tokenize")
    by_length = {r.tokens: r for r in lc.lengths}
    assert lc.covered == (1024, 4096, 8192 - 8 - 32)
    assert (by_length[1024].passed, by_length[1024].total) == (3, 3)
    assert (by_length[4096].passed, by_length[4096].total) == (0, 3)
    assert [(d.depth, d.passed) for d in by_length[4096].needles] == [(0.1, False), (0.5, False), (0.9, False)]
    # each needle's prompt is the length asked for, within 2%, in the server's own count
    assert all(
        abs(n.prompt_tokens - r.tokens) <= r.tokens * 0.02 for r in by_length.values() if r.status == "covered" for n in r.needles
    )
    assert not report.ok
    failed = [f for f in report.failures if f.startswith("long context:")]
    assert [f.split(" (")[0] for f in failed] == [
        "long context: 0/3 needles found at 4096 tokens",
        "long context: 0/3 needles found at 8152 tokens",
    ]
    assert "expected " in failed[0] and "got 'the river.'" in failed[0]
    assert {16384, 65536} == {r.tokens for r in lc.lengths if r.status == "skipped"}
    assert "long context: 16384 tokens skipped: over the server's limit (8192 tokens, /v1/models max_model_len)" in report.notes


def test_a_healthy_server_passes_and_the_report_names_what_was_covered(shape_server):
    report = run_validate(config(shape_server.base_url))
    assert report.ok, report.failures
    assert report.long_context.covered == (1024, 4096, 8152)
    text = validate_text(report)
    assert "long context (quick" in text and "limit 8192 tokens" in text and "skipped" in text


def test_lengths_that_do_not_fit_the_budget_are_skipped_and_said(shape_server):
    # A prefill of 0.2 s per 1,000 tokens: the 1k needles take ~0.6 s; 4k's estimate (x4) does not
    # fit in what is left of a 1.5 s budget, nor does anything longer.
    shape_server.settings["prefill_s_per_1k"] = 0.2
    report = run_validate(config(shape_server.base_url, long_context_budget_s=1.5))
    lc = report.long_context
    assert lc.covered == (1024,)
    skipped = {r.tokens: r.reason for r in lc.lengths if r.status == "skipped"}
    assert set(skipped) == {4096, 8152, 16384, 65536}
    assert skipped[4096].startswith("budget (estimated ") and "of 1.5 s left)" in skipped[4096]
    assert skipped[16384].startswith("over the server's limit")
    assert report.ok, report.failures  # a skipped length is a note, not a failure
    assert any(n.startswith("long context: 4096 tokens skipped: budget") for n in report.notes)
    assert lc.spent_s < 1.5 + 1.0


def test_a_limit_the_server_states_only_in_its_error_is_learned(shape_server):
    # llama-cpp-python's way: /v1/models says nothing, a prompt too long is refused with the limit
    shape_server.settings.update(say_max_model_len=False, context_error=True, max_model_len=6000)
    report = run_validate(config(shape_server.base_url))
    lc = report.long_context
    assert (lc.limit, lc.limit_source) == (6000, "its error")
    assert lc.covered == (1024, 4096)
    skipped = {r.tokens: r.reason for r in lc.lengths if r.status == "skipped"}
    assert skipped == {
        16384: "over the server's limit (6000 tokens, from its error)",
        65536: "over the server's limit (6000 tokens, from its error)",
    }
    assert report.ok, report.failures


def test_max_context_overrides_what_the_server_says(shape_server):
    report = run_validate(config(shape_server.base_url, max_context=3000))
    assert (report.long_context.limit, report.long_context.limit_source) == (3000, "--max-context")
    assert report.long_context.covered == (1024, 3000 - 40)


def test_long_context_off_sends_no_long_prompt(shape_server):
    report = run_validate(config(shape_server.base_url, long_context="off"))
    assert report.long_context is None
    assert not any("secret word" in str(body.get("prompt", "")) for body in shape_server.requests)


def test_an_unknown_mode_is_bad_input(shape_server):
    with pytest.raises(UsageError, match="long context 'fast'"):
        run_validate(config(shape_server.base_url, long_context="fast"))


def test_the_long_greedy_run_is_recorded_in_the_golden_file_and_compared_with_its_logprobs(shape_server, tmp_path):
    path = tmp_path / "golden.json"
    recorded = run_validate(config(shape_server.base_url, golden_path=path, record_golden=True))
    assert recorded.long_context.long_greedy.status == "recorded"
    saved = json.loads(path.read_text())
    long = saved["long"]
    assert long["max_tokens"] == 64 and len(long["logprobs"]) == len(long["tokens"]) == 64
    assert 8192 - 64 - 32 - 200 <= long["prompt_tokens"] <= 8192 - 64 - 32  # the longest that fits, near 8192
    assert all(e["logprobs"] == [-0.1] * len(e["tokens"]) for e in saved["entries"])

    same = run_validate(config(shape_server.base_url, golden_path=path))
    g = same.long_context.long_greedy
    assert (g.status, g.diff.matched, g.diff.numerics.status, g.diff.numerics.compared) == ("compared", True, "compared", 64)
    assert g.diff.numerics.max_abs == 0.0 and same.ok, same.failures

    # The same greedy text, the logprobs moved by 0.3 everywhere: past the 0.05 mean limit.
    shape_server.settings["logprob"] = -0.4
    drifted = run_validate(config(shape_server.base_url, golden_path=path))
    assert not drifted.ok
    assert all(d.matched for d in drifted.golden.diffs)  # today's check (text) passes
    moved = [f for f in drifted.failures if "logprobs moved" in f]
    assert len(moved) == len(golden_mod.DEFAULT_PROMPTS) + 1, drifted.failures
    assert any(
        f.startswith("long context: the long document's logprobs moved from the golden: mean |Δlogprob| 0.3000") for f in moved
    )
    assert drifted.long_context.long_greedy.diff.numerics.max_abs == pytest.approx(0.3)

    # A shifted token in the long continuation is a divergence, named by its position.
    shape_server.settings.update(logprob=-0.1, shift_at=40)
    shifted = run_validate(config(shape_server.base_url, golden_path=path))
    (div,) = [f for f in shifted.failures if f.startswith("long context: the long document's greedy")]
    assert "diverges from the golden at token 40" in div and "DRIFT" in div
    assert shifted.long_context.long_greedy.diff.numerics.compared == 40  # the shared prefix only


def test_an_old_golden_file_without_logprobs_still_loads_and_compares_text_only(shape_server, tmp_path):
    path = tmp_path / "golden.json"
    run_validate(config(shape_server.base_url, golden_path=path, record_golden=True, long_context="off"))
    old = json.loads(path.read_text())
    for e in old["entries"]:
        del e["logprobs"]  # as files written before issue 37 are
    path.write_text(json.dumps(old))
    report = run_validate(config(shape_server.base_url, golden_path=path))
    assert report.ok, report.failures
    assert all(d.matched and d.numerics.status == "text only" for d in report.golden.diffs)
    assert any(
        n.startswith("golden: 4/4 prompt(s) compared on text only: the known-good run has no logprobs") for n in report.notes
    )
    assert "long greedy continuation skipped: " in " ".join(report.notes)  # no long document in an old file
    assert ServeReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_the_report_round_trips_and_the_json_document_names_it(shape_server, tmp_path):
    path = tmp_path / "golden.json"
    args = ("validate", "vllm", "--url", shape_server.base_url, "--no-throughput", "--no-answers", "--golden", str(path))
    run_json(*args, "--record-golden", expect=0)
    doc = run_json(*args, expect=0)
    lc = doc["report"]["long_context"]
    assert lc["mode"] == "quick" and lc["long_greedy"]["status"] == "compared"
    assert [r["tokens"] for r in lc["lengths"] if r["status"] == "covered"] == [1024, 4096, 8152]
    assert ServeReport.from_json(doc["report"]).to_json() == doc["report"]
    off = run_json(*args, "--long-context", "off", expect=0)
    assert off["report"]["long_context"] is None


def test_numerics_compare_over_the_shared_prefix_only():
    same = numerics.compare(["a", "b"], [-0.1, -0.2], ["a", "b"], [-0.1, -0.2])
    assert (same.passed, same.compared, same.mean_abs, same.max_abs) == (True, 2, 0.0, 0.0)
    # the third token diverges: its logprobs are of different tokens, so only the gap there is said
    diverged = numerics.compare(["a", "b", "c"], [-0.1, -0.2, -0.3], ["a", "b", "x"], [-0.1, -0.25, -2.3])
    assert diverged.compared == 2 and diverged.max_abs == pytest.approx(0.05) and diverged.max_at == 1
    assert diverged.gap_at_divergence == pytest.approx(2.0) and diverged.passed
    spike = numerics.compare(["a", "b"], [-0.1, -0.2], ["a", "b"], [-0.1, -0.9])
    assert not spike.passed and "max |Δlogprob| 0.7000 at token 1 > 0.5" in spike.reason
    assert numerics.compare(["a"], None, ["a"], [-1.0]).status == "text only"


def test_the_context_limit_is_read_where_each_engine_says_it():
    from checklib.testserver import TestServer, json_reply, route

    models = route("GET", "/v1/models", lambda _r, _m: json_reply({"data": [{"id": "m"}]}))
    props = route("GET", "/props", lambda _r, _m: json_reply({"default_generation_settings": {"n_ctx": 4096}}))
    with TestServer([models, props]) as server:
        assert context_limit(OpenAIClient(server.root)) == (4096, "/props n_ctx")
        assert context_limit(OpenAIClient(server.root), 1000) == (1000, "--max-context")
    assert limit_from_error("This model's maximum context length is 2048 tokens. However, you requested 9000") == 2048
    assert limit_from_error("request (9000 tokens) exceeds the available context size (4096 tokens), try increasing it") == 4096
    assert limit_from_error("The input (9000 tokens) is longer than the model's context length (32768 tokens).") == 32768
    assert limit_from_error("engine core died") is None


def test_documents_and_needles_are_the_same_on_every_run():
    a, b = haystack.document(7, 5000), haystack.document(7, 5000)
    assert a == b and len(a) <= 5000 and a.endswith(".") and haystack.document(8, 5000) != a
    n = haystack.needle_prompt(a, 0.5, seed=3)
    assert n == haystack.needle_prompt(a, 0.5, seed=3)
    assert n.prompt.endswith(f"The secret word of the {n.key} is") and n.prompt.count(n.value) == 1
    assert n.value not in a  # the filler never says it: only the needle can
    first = haystack.needle_prompt(a, 0.0, seed=3).prompt
    assert first.startswith(f"The secret word of the {n.key} is {n.value}.")


def test_a_length_slower_than_its_estimate_stops_at_the_budget(shape_server):
    # 1k's needles are quick, the server's prefill then turns 50 times slower per token than 1k's
    # showed: 4k's first needle overruns the budget, and the rest of 4k and every longer length stop.
    shape_server.settings["prefill_s_per_1k"] = 0.01
    seen = []

    def slower(msg: str) -> None:
        seen.append(msg)
        if "4096 tokens" in msg:
            shape_server.settings["prefill_s_per_1k"] = 0.5

    report = run_validate(config(shape_server.base_url, long_context_budget_s=1.5), progress=slower)
    by_length = {r.tokens: r for r in report.long_context.lengths}
    assert (by_length[4096].status, by_length[4096].total) == ("covered", 1)
    assert by_length[8152].status == "skipped" and by_length[8152].reason.startswith("budget (1.5 s spent at 4096 tokens")
    assert report.long_context.spent_s < 1.5 + 2.5
