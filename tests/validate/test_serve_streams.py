"""What validate measures against streams of known timings on the one test server: chunked and
close-delimited streams timed chunk by chunk, a buffered stream reported as not measured (and a fast
honest one never flagged), reasoning that runs out of max_tokens counted and warned about, and a
server that reports no usage."""

import json

import pytest
from click.testing import CliRunner

from patchctl.cli.main import main
from patchctl.validate.client import OpenAIClient
from patchctl.validate.metrics import BUFFERED, STREAMED
from patchctl.validate.report import ServeReport
from patchctl.validate.validation import ServeConfig, run_validate

from .text import validate_text

TTFT_S = 0.3  # the prefill the server waits before its first token...
ITL_S = 0.02  # ...and between tokens after it: TTFT 320 ms, TPOT/ITL 20 ms, decode 50 tok/s


def near(measured: float, truth: float) -> bool:
    """Sleeps only ever run late, and this machine is shared: never below the truth, and not far above."""
    return 0.9 * truth <= measured <= 1.6 * truth


def known(server, framing: str, **settings) -> None:
    server.settings.update(reasoning=False, ttft_s=TTFT_S, delay_s=ITL_S, framing=framing, **settings)


def config(server, tmp_path, **kw) -> ServeConfig:
    base = dict(
        base_url=server.base_url,
        answers=False,
        concurrency=(1,),
        requests_per_level=2,
        max_tokens=16,
        baseline_dir=tmp_path / "b",
        warmup_requests=0,
    )
    return ServeConfig(**{**base, **kw})


@pytest.mark.parametrize("framing", ["chunked", "close"])
def test_chunked_and_close_delimited_streams_are_timed_as_they_arrive(shape_server, tmp_path, framing):
    known(shape_server, framing)
    record = OpenAIClient(shape_server.base_url).timed_request("chat", "hello", 16)
    assert record.ok, record.error
    assert len(record.chunk_times) == 16 and record.reads == 16  # one read per token: none held back
    assert near(record.ttft, TTFT_S + ITL_S)
    assert near(sorted(record.itls)[8], ITL_S)
    assert near(1 / record.decode_tok_s, ITL_S) and not record.buffered

    report = run_validate(config(shape_server, tmp_path))
    lv = report.throughput.levels[0]
    assert lv.stream == STREAMED and lv.latency_not_measured is None and lv.buffered_requests == 0
    assert near(lv.ttft_ms.p50, (TTFT_S + ITL_S) * 1000)
    assert near(lv.tpot_ms.p50, ITL_S * 1000)
    assert near(lv.itl_ms.p50, ITL_S * 1000)
    assert near(1 / lv.decode_tok_s.p50, ITL_S)
    assert near(lv.e2e_ms.p50, (TTFT_S + 16 * ITL_S) * 1000)
    assert lv.request_throughput == pytest.approx(2 / lv.duration_s)
    # The single-request block leads with TTFT and the decode rate, and so does the text's first line.
    single = report.to_json()["throughput"]["single_request"]
    assert list(single)[2:4] == ["ttft_ms", "decode_tok_s"]
    first = validate_text(report).splitlines()[0]
    assert first.startswith("single request: TTFT ") and ", decode " in first and "tok/s over E2E" in first
    assert not [w for w in report.warnings if "buffered" in w]


def test_a_buffered_stream_is_not_measured_and_says_why(shape_server, tmp_path):
    known(shape_server, "buffered")
    report = run_validate(config(shape_server, tmp_path))
    lv = report.throughput.levels[0]
    assert lv.stream == BUFFERED and lv.buffered_requests == 2
    assert lv.ttft_ms is None and lv.tpot_ms is None and lv.itl_ms is None and lv.decode_tok_s is None
    assert lv.e2e_ms.p50 > TTFT_S * 1000 and lv.output_tok_s > 0  # what was measured honestly stays
    (warning,) = [w for w in report.warnings if "buffered" in w]
    assert "c=1" in warning and "proxy" in warning and "chunked encoding" in warning
    text = validate_text(report)
    assert "not measured: the stream arrived buffered" in text.splitlines()[0]
    assert " 0.0 " not in text  # never a 0 ms TPOT
    doc = report.to_json()["throughput"]
    assert doc["single_request"]["ttft_ms"] is None and doc["single_request"]["decode_tok_s"] is None
    assert ServeReport.from_json(report.to_json()).throughput.levels[0].stream == BUFFERED


def test_a_fast_honest_stream_is_never_flagged(shape_server, tmp_path):
    shape_server.settings.update(reasoning=False, delay_s=0.002)  # ITL 2 ms
    report = run_validate(config(shape_server, tmp_path, concurrency=(1, 4), requests_per_level=4, max_tokens=64))
    for lv in report.throughput.levels:
        assert lv.stream == STREAMED and lv.buffered_requests == 0, lv
        assert lv.itl_ms.p50 > 1.0 and lv.decode_tok_s.p50 > 0
    assert not [w for w in report.warnings if "buffered" in w]


def test_reasoning_that_runs_out_of_max_tokens_is_counted_and_warned(shape_server):
    # The case: answers start after 200 reasoning tokens; every request has max_tokens 128.
    shape_server.settings.update(think_tokens=200)
    result = CliRunner().invoke(
        main,
        ["validate", "sglang", "--url", shape_server.base_url, "--no-answers", "--concurrency", "1", "--requests", "4", "--json"],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (lv,) = doc["report"]["throughput"]["levels"]
    assert lv["ended_in_reasoning"] == 4 and lv["reasoning_requests"] == 4
    assert (lv["reasoning_tokens"], lv["content_tokens"]) == (4 * 128, 0)
    (warning,) = [w for w in doc["warnings"] if "inside their reasoning" in w]
    assert "4/4 requests" in warning and "max_tokens (128)" in warning and "--max-tokens" in warning

    shape_server.settings.update(think_tokens=0)  # thinking that fits: answers follow, nothing to warn
    doc = json.loads(
        CliRunner()
        .invoke(
            main,
            [
                "validate",
                "sglang",
                "--url",
                shape_server.base_url,
                "--no-answers",
                "--concurrency",
                "1",
                "--requests",
                "2",
                "--json",
            ],
        )
        .stdout
    )
    (lv,) = doc["report"]["throughput"]["levels"]
    assert lv["ended_in_reasoning"] == 0 and (lv["reasoning_tokens"], lv["content_tokens"]) == (2 * 4, 2 * 50)
    assert not [w for w in doc["warnings"] if "reasoning" in w]


def test_without_usage_the_level_says_tokens_came_from_chunks_and_warns(shape_server, tmp_path):
    shape_server.settings["usage"] = False
    report = run_validate(config(shape_server, tmp_path, concurrency=(1, 2)))
    assert [lv.token_count_method for lv in report.throughput.levels] == ["chunks", "chunks"]
    warned = [w for w in report.warnings if "counted from chunks" in w]
    assert [w.split(":")[0] for w in warned] == ["c=1", "c=2"]

    shape_server.settings["usage"] = True
    report = run_validate(config(shape_server, tmp_path))
    assert report.throughput.levels[0].token_count_method == "usage"
    assert not [w for w in report.warnings if "counted from chunks" in w]


def test_every_level_says_how_its_tokens_were_counted_in_json_and_text(shape_server):
    """Issue 25, item 7: the JSON's every level and its single-request block, and the text's table and
    first line, say chunks when the server sent no usage (and usage when it did), with a warning."""
    for usage, method, words in (
        (False, "chunks", "tokens by chunks (no server usage)"),
        (True, "usage", "tokens by server usage"),
    ):
        shape_server.settings.update(usage=usage, reasoning=False)
        args = [
            "vllm",
            "--url",
            shape_server.base_url,
            "--no-answers",
            "--concurrency",
            "1,2",
            "--requests",
            "2",
            "--max-tokens",
            "8",
        ]
        doc = json.loads(CliRunner().invoke(main, ["validate", *args, "--json"]).stdout)
        tp = doc["report"]["throughput"]
        assert [lv["token_count_method"] for lv in tp["levels"]] == [method, method]
        assert tp["single_request"]["token_count_method"] == method
        assert bool([w for w in doc["warnings"] if "counted from chunks" in w]) == (not usage)
        text = CliRunner().invoke(main, ["validate", *args]).stdout
        assert words in text.splitlines()[0]
        rows = [ln.split() for ln in text.splitlines() if ln.split()[:1] in (["1"], ["2"])]
        assert [r[-1] for r in rows] == [method, method], text
