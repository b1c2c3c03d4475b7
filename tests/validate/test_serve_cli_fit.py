"""`patchctl validate` fitted to how servers are measured in the field, through the real entry point
against the shape server: answers that stay in reasoning_content, the throughput prompt and the
single-request figure, enough requests and their spread, baselines compared on shared levels only."""

import json
import re

from click.testing import CliRunner

from patchctl.cli.main import main
from patchctl.validate.throughput import COUNTING_PROMPT, ESSAY_PROMPT

COUNTING = "Count from 1 to 50, writing each number on a new line."


def validate(*args: str):
    return CliRunner().invoke(main, ["validate", *args])


def validate_json(*args: str, expect: int) -> dict:
    result = validate(*args, "--json")
    assert result.exit_code == expect, result.output
    return json.loads(result.stdout)


def throughput_posts(server) -> list[dict]:
    """The timed requests (streamed, max_tokens above the warm-up's 8)."""
    return [r for r in server.requests if r.get("stream") and r["max_tokens"] > 8]


# --- 1. an answer that stays in reasoning_content ------------------------------------------------


def test_an_answer_only_in_reasoning_content_says_so_and_what_to_raise(shape_server):
    # A model that thinks for 400 tokens: no answers prompt's own max_tokens (32..320) reaches content.
    shape_server.settings["think_tokens"] = 400
    doc = validate_json("vllm", "--url", shape_server.base_url, "--no-throughput", expect=1)
    answers = doc["report"]["answers"]
    assert [a["passed"] for a in answers] == [False] * 4
    for a in answers:
        assert a["reason"].startswith("the answer is only in reasoning_content (")
        assert "--reasoning-budget" in a["reason"] and f"cut off at max_tokens {a['max_tokens']}" in a["reason"]
        assert a["reasoning_chars"] > 0 and a["finish_reason"] == "length"
        # Its thinking never got to the answer: nothing claims it did.
        assert a["reasoning_passed"] is False and "reasoning reached" not in a["reason"]
    assert not any("empty content" in f for f in doc["report"]["failures"])

    # The text says it too, in the failures a person reads.
    text = validate("vllm", "--url", shape_server.base_url, "--no-throughput")
    assert text.exit_code == 1 and "answers/fact: the answer is only in reasoning_content" in text.stdout


def test_when_the_reasoning_reached_the_right_answer_it_is_said(shape_server):
    shape_server.settings.update(think_tokens=400, reasoning_has_answer=True)
    doc = validate_json("vllm", "--url", shape_server.base_url, "--no-throughput", expect=1)
    for a in doc["report"]["answers"]:
        assert a["reasoning_passed"] is True, a
        assert a["reason"].endswith("the reasoning reached the right answer, the reply did not")
    # The budget the reason names is the way out: with room to answer, every check passes.
    doc = validate_json("vllm", "--url", shape_server.base_url, "--no-throughput", "--reasoning-budget", "500", expect=0)
    assert [(a["passed"], a["finish_reason"]) for a in doc["report"]["answers"]] == [(True, "stop")] * 4
    assert [a["max_tokens"] for a in doc["report"]["answers"]] == [532, 532, 820, 628]


def test_a_wrong_reply_whose_reasoning_was_right_says_so(shape_server):
    # The thinking states the right answer, the reply is a wrong one.
    shape_server.settings.update(reasoning_has_answer=True, wrong=True)
    doc = validate_json("vllm", "--url", shape_server.base_url, "--no-throughput", expect=1)
    fact = doc["report"]["answers"][0]
    assert fact["reason"] == "does not name Paris; the reasoning reached the right answer, the reply did not"
    assert (fact["passed"], fact["reasoning_passed"]) == (False, True)
    # Without reasoning there is nothing to say about it.
    shape_server.settings.update(wrong=False, reasoning=False)
    doc = validate_json("vllm", "--url", shape_server.base_url, "--no-throughput", expect=0)
    assert all(a["reasoning_passed"] is None and a["reasoning_chars"] == 0 for a in doc["report"]["answers"])


# --- 2. the throughput prompt and the single-request figure ---------------------------------------


def test_the_default_prompt_is_the_fields_counting_prompt_at_temperature_0(shape_server):
    assert COUNTING_PROMPT == COUNTING
    doc = validate_json(
        "vllm", "--url", shape_server.base_url, "--no-answers", "--concurrency", "1,2", "--requests", "2", expect=0
    )
    posts = throughput_posts(shape_server)
    assert len(posts) == 4
    # Each request's prompt is the counting prompt behind a tag of its own: no two share a prefix.
    contents = [p["messages"][0]["content"] for p in posts]
    assert all(re.fullmatch(r"\[[0-9a-f]{6}-\d+\] " + re.escape(COUNTING), c) for c in contents), contents
    assert len({c.split("]")[0] for c in contents}) == 4
    assert all(len(p["messages"]) == 1 and p["temperature"] == 0 for p in posts)
    tp = doc["report"]["throughput"]
    assert (tp["prompt"], tp["temperature"], len(tp["prompt_sha256"]), tp["prompts"]) == ("counting", 0, 16, "unique")
    # The single-request figure: the concurrency-1 level's tok/s and TTFT, in its own key.
    one, two = tp["levels"]
    single = tp["single_request"]
    # Led by TTFT and the decode rate (issue 25); output tok/s over E2E follows.
    assert single == {
        "concurrency": 1,
        "requests": 2,
        "ttft_ms": one["ttft_ms"],
        "decode_tok_s": one["decode_tok_s"],
        "tpot_ms": one["tpot_ms"],
        "itl_ms": one["itl_ms"],
        "e2e_ms": one["e2e_ms"],
        "output_tok_s": one["output_tok_s"],
        "stream": "streamed",
        "latency_not_measured": None,
        "token_count_method": "usage",
    }
    assert list(single)[2:4] == ["ttft_ms", "decode_tok_s"]
    assert single["output_tok_s"] > 0 and single["ttft_ms"]["p50"] > 0 and single["decode_tok_s"]["p50"] > 0
    # Counting at temperature 0: every request decodes the same tokens (4 thinking + 50 lines).
    assert one["output_tokens"] == two["output_tokens"] == 2 * 54


def test_the_single_request_figure_comes_first_in_the_text(shape_server):
    result = validate("vllm", "--url", shape_server.base_url, "--concurrency", "1,2", "--requests", "2")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("single request: "))
    assert first == 0  # the report's first line, before the header, coherence and throughput tables
    assert lines[first].startswith("single request: TTFT ") and ", decode " in lines[first]
    assert "output tok/s over E2E" in lines[first] and "concurrency 1, 2 requests, counting prompt" in lines[first]
    assert "tokens by server usage" in lines[first]  # how its tokens were counted (issue 25, item 7)
    assert result.stdout.index("coherence: answers") > result.stdout.index("single request: ")

    no_single = validate("vllm", "--url", shape_server.base_url, "--no-answers", "--concurrency", "2", "--requests", "2")
    assert "single request: not measured (--concurrency has no 1)" in no_single.stdout
    doc = validate_json("vllm", "--url", shape_server.base_url, "--no-answers", "--concurrency", "2", "--requests", "2", expect=0)
    assert doc["report"]["throughput"]["single_request"] is None


def test_prompt_essay_and_a_prompt_file(shape_server, tmp_path):
    quick = ("--url", shape_server.base_url, "--no-answers", "--concurrency", "1", "--requests", "1")
    doc = validate_json("vllm", *quick, "--prompt", "essay", expect=0)
    assert doc["report"]["throughput"]["prompt"] == "essay"
    assert throughput_posts(shape_server)[-1]["messages"][0]["content"].endswith("] " + ESSAY_PROMPT)

    mine = tmp_path / "prompt.txt"
    mine.write_text("Summarise the plot of Hamlet.\nIn three sentences.")
    doc = validate_json("vllm", *quick, "--prompt", str(mine), expect=0)
    assert doc["report"]["throughput"]["prompt"] == str(mine)
    assert throughput_posts(shape_server)[-1]["messages"][0]["content"].endswith("] " + mine.read_text())


def test_shared_prompt_sends_the_same_text_and_says_so(shape_server, tmp_path):
    """--shared-prompt: every throughput request the same untagged text (the prefix-cache hit path),
    said in the JSON, the text and the baseline's workload (a baseline of unique prompts then warns)."""
    common = (
        "--url",
        shape_server.base_url,
        "--no-answers",
        "--concurrency",
        "1",
        "--requests",
        "3",
        "--baseline-dir",
        str(tmp_path / "b"),
    )
    validate_json("vllm", *common, "--update-baseline", expect=0)  # a baseline of unique prompts
    before = len(throughput_posts(shape_server))
    doc = validate_json("vllm", *common, "--shared-prompt", expect=0)
    posts = throughput_posts(shape_server)[before:]
    assert [p["messages"][0]["content"] for p in posts] == [COUNTING] * 3
    tp = doc["report"]["throughput"]
    assert tp["prompts"] == "shared"
    assert "prompts unique -> shared" in "; ".join(doc["report"]["baseline"]["workload_changes"])
    text = validate("vllm", *common, "--shared-prompt")
    assert "counting prompt, shared by every request" in text.stdout


def test_a_prompt_that_is_no_file_is_a_usage_error_before_any_request(shape_server, tmp_path):
    for bad, why in ((tmp_path / "nope.txt", "no such file"), (tmp_path, "no such file")):
        doc = validate_json("vllm", "--url", shape_server.base_url, "--prompt", str(bad), expect=2)
        assert doc["error"]["kind"] == "usage" and why in doc["error"]["message"]
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    doc = validate_json("vllm", "--url", shape_server.base_url, "--prompt", str(empty), expect=2)
    assert "the file is empty" in doc["error"]["message"]
    assert "./count" in validate("vllm", "--url", shape_server.base_url, "--prompt", "count").stderr
    assert shape_server.requests == []


# --- 3. enough requests, and their spread -------------------------------------------------------


def test_default_requests_give_a_median_and_its_spread(shape_server):
    shape_server.settings["delay_s"] = 0.0005
    doc = validate_json(
        "vllm", "--url", shape_server.base_url, "--no-answers", "--concurrency", "1,2,9", "--max-tokens", "12", expect=0
    )
    levels = doc["report"]["throughput"]["levels"]
    # At least 16 per level; two waves (2 x concurrency) where that is more.
    assert [lv["requests"] for lv in levels] == [16, 16, 18]
    for lv in levels:
        spread = lv["request_tok_s"]
        assert spread["n"] == lv["requests"]
        assert spread["p10"] <= spread["p25"] <= spread["p50"] <= spread["p75"] <= spread["p90"]
        assert spread["iqr_pct"] >= 0 and spread["median_ci_pct"] >= 0
    text = validate("vllm", "--url", shape_server.base_url, "--no-answers", "--concurrency", "1", "--max-tokens", "12")
    assert "spread" in text.stdout and "%" in text.stdout


def test_a_spread_wider_than_the_threshold_warns_that_the_comparison_means_nothing(shape_server, tmp_path):
    # Every other request is about twice as slow: 16 requests do not pin the median down to 5%
    # (it lands anywhere between the two speeds), though well within 99%.
    shape_server.settings["delay_cycle"] = [0.001, 0.003]
    args = (
        "vllm",
        "--url",
        shape_server.base_url,
        "--no-answers",
        "--concurrency",
        "1",
        "--max-tokens",
        "12",
        "--baseline-dir",
        str(tmp_path / "b"),
    )
    recorded = validate_json(*args, "--update-baseline", expect=0)
    assert recorded["report"]["baseline"]["status"] == "recorded"
    assert any("c=1: median per-request tok/s known only to" in w and "too noisy" in w for w in recorded["warnings"]), recorded[
        "warnings"
    ]

    doc = validate_json(*args, "--threshold", "0.99", expect=0)
    spread = doc["report"]["throughput"]["levels"][0]["request_tok_s"]
    assert spread["median_ci_pct"] > 5
    assert not any(w.startswith("c=1: median") for w in doc["warnings"])  # inside a 99% threshold

    # At 5% (the default) the same numbers cannot tell a regression from noise. Whether this run's
    # tok/s is within 5% of the baseline's is up to the noise: exit 0 or 1.
    result = validate(*args, "--json")
    assert result.exit_code in (0, 1), result.output
    doc = json.loads(result.stdout)
    (warning,) = [w for w in doc["warnings"] if w.startswith("c=1: median")]
    assert "wider than the 5% threshold" in warning and "not meaningful at this level" in warning
    assert "more requests narrow it (--requests " in warning
    # The baseline's own noise is said too: it was recorded from the same uneven server.
    assert any("the baseline's own median" in w for w in doc["warnings"])
    assert doc["warnings"] == doc["report"]["warnings"]
    # On stderr in the text output.
    text = validate(*args)
    assert "warning: c=1: median per-request tok/s known only to" in text.stderr


def test_a_steady_level_has_no_spread_warning(shape_server, tmp_path):
    args = (
        "vllm",
        "--url",
        shape_server.base_url,
        "--no-answers",
        "--concurrency",
        "1",
        "--max-tokens",
        "12",
        "--baseline-dir",
        str(tmp_path / "b"),
        "--threshold",
        "0.5",
    )
    validate_json(*args, "--update-baseline", expect=0)
    doc = validate_json(*args, expect=0)
    assert doc["report"]["baseline"]["status"] == "compared" and doc["warnings"] == []


def test_a_single_request_against_a_baseline_warns_that_its_noise_is_unknown(shape_server, tmp_path):
    args = (
        "vllm",
        "--url",
        shape_server.base_url,
        "--no-answers",
        "--concurrency",
        "1",
        "--requests",
        "1",
        "--baseline-dir",
        str(tmp_path / "b"),
        "--threshold",
        "0.99",
    )
    validate_json(*args, "--update-baseline", expect=0)
    doc = validate_json(*args, expect=0)
    assert any("c=1: 1 request, so its noise is unknown" in w and "--requests 16" in w for w in doc["warnings"])


# --- 4. a baseline is compared on the levels both runs measured --------------------------------


def test_a_baseline_is_compared_only_on_levels_measured_in_both_runs(shape_server, tmp_path):
    shape_server.settings["delay_s"] = 0.001  # not 0: the decode rate (compared too) needs a TPOT
    common = (
        "vllm",
        "--url",
        shape_server.base_url,
        "--no-answers",
        "--requests",
        "2",
        "--max-tokens",
        "12",
        "--baseline-dir",
        str(tmp_path / "b"),
        "--threshold",
        "0.99",
    )
    validate_json(*common, "--concurrency", "1,8,32", "--update-baseline", expect=0)

    doc = validate_json(*common, "--concurrency", "1", expect=0)
    b = doc["report"]["baseline"]
    assert b["status"] == "compared"
    assert [(c["concurrency"], c["metric"]) for c in b["checks"]] == [(1, "output_tok_s"), (1, "decode_tok_s_p50")]
    assert all(c["current"] is not None for c in b["checks"])
    assert b["not_compared"] == [
        {"concurrency": 8, "reason": "only in the baseline"},
        {"concurrency": 32, "reason": "only in the baseline"},
    ]
    assert "baseline: c=8, c=32 not compared: measured only in the baseline" in doc["report"]["notes"]
    assert not doc["report"]["failures"]

    # A level only this run measured is not compared either, and said so.
    doc = validate_json(*common, "--concurrency", "1,4", expect=0)
    assert doc["report"]["baseline"]["not_compared"] == [
        {"concurrency": 4, "reason": "only in this run"},
        {"concurrency": 8, "reason": "only in the baseline"},
        {"concurrency": 32, "reason": "only in the baseline"},
    ]
    assert any(n.startswith("baseline: c=4 not compared: measured only in this run") for n in doc["report"]["notes"])

    # Nothing in common: nothing compared, nothing failed, and the note says so.
    doc = validate_json(*common, "--concurrency", "2", expect=0)
    assert doc["report"]["baseline"]["checks"] == []
    assert any("nothing compared" in n for n in doc["report"]["notes"])
    text = validate(*common, "--concurrency", "1")
    assert text.exit_code == 0 and "c=8, c=32 not compared" in text.stdout and "not measured now" not in text.stdout


def test_a_baseline_measured_with_another_prompt_is_said_to_be_unlike(shape_server, tmp_path):
    shape_server.settings["delay_s"] = 0
    common = (
        "vllm",
        "--url",
        shape_server.base_url,
        "--no-answers",
        "--concurrency",
        "1",
        "--requests",
        "2",
        "--baseline-dir",
        str(tmp_path / "b"),
        "--threshold",
        "0.99",
    )
    validate_json(*common, "--prompt", "essay", "--max-tokens", "12", "--update-baseline", expect=0)
    stored = json.loads(next((tmp_path / "b").glob("*.json")).read_text())
    assert stored["workload"]["prompt"] == "essay" and stored["workload"]["max_tokens"] == 12
    doc = validate_json(*common, "--max-tokens", "12", expect=0)
    assert doc["report"]["baseline"]["workload_changes"] == ["prompt essay -> counting"]
    assert any("was measured differently (prompt essay -> counting)" in w for w in doc["warnings"])
    same = validate_json(*common, "--prompt", "essay", "--max-tokens", "12", expect=0)
    assert same["report"]["baseline"]["workload_changes"] == []
