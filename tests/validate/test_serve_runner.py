"""The whole serve tier against the reasoning-shape server (real HTTP on 127.0.0.1)."""

import json
from dataclasses import replace

from patchctl.validate.outputs import write_outputs
from patchctl.validate.report import ServeReport
from patchctl.validate.validation import ServeConfig, run_validate

from .text import validate_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def config(server, tmp_path, **kw):
    base = dict(
        base_url=server.base_url,
        concurrency=(1, 4),
        requests_per_level=4,
        max_tokens=24,
        baseline_dir=tmp_path / "baselines",
        patch_set="p1",
    )
    base.update(kw)
    return ServeConfig(**base)


def test_reasoning_model_streams_are_measured_and_answers_checked(shape_server, tmp_path):
    report = run_validate(config(shape_server, tmp_path))
    assert report.ok, report.failures
    assert [a.passed for a in report.answers] == [True] * 4
    assert all(a.reasoning_chars > 0 for a in report.answers)
    assert report.deployment.engine_version == "0.0.0+shape"
    for lv in report.throughput.levels:
        assert lv.failed == 0
        assert lv.token_count_method == "usage"
        # 4 reasoning chunks + 20 content chunks, and the server said 24.
        assert lv.output_tokens == 4 * 24
        assert lv.reasoning_requests == 4
        assert lv.ttft_ms.p50 > 0 and lv.tpot_ms.p50 > 0 and lv.itl_ms.p50 > 0
    # The client asked for usage in the stream.
    streamed = [r for r in shape_server.requests if r.get("stream")]
    assert streamed and all(r["stream_options"] == {"include_usage": True} for r in streamed)
    assert report.baseline.status == "missing"


def test_without_usage_tokens_are_counted_from_chunks_and_said(shape_server, tmp_path):
    shape_server.settings["usage"] = False
    report = run_validate(config(shape_server, tmp_path, answers=False))
    lv = report.throughput.levels[0]
    assert lv.token_count_method == "chunks"
    assert lv.output_tokens == 4 * 24  # role-only and finish chunks are not tokens
    assert any("counted by chunks" in n for n in report.notes)


def test_completions_api_streams_too(shape_server, tmp_path):
    report = run_validate(config(shape_server, tmp_path, answers=False, throughput_api="completions"))
    assert report.ok, report.failures
    assert [lv.output_tokens for lv in report.throughput.levels] == [4 * 24, 4 * 24]


def test_non_streaming_reports_only_what_it_can_measure(shape_server, tmp_path):
    report = run_validate(config(shape_server, tmp_path, answers=False, stream=False))
    lv = report.throughput.levels[0]
    assert lv.ttft_ms is None and lv.tpot_ms is None and lv.itl_ms is None
    assert lv.e2e_ms.p50 > 0 and lv.output_tok_s > 0
    assert "-" in validate_text(report)  # shown as not measured, never as 0 or negative

    shape_server.settings["usage"] = False
    report = run_validate(config(shape_server, tmp_path, answers=False, stream=False))
    assert report.throughput.levels[0].output_tok_s is None


def test_wrong_answers_and_golden_drift_fail_with_reasons(shape_server, tmp_path):
    golden = tmp_path / "golden.json"
    rec = run_validate(config(shape_server, tmp_path, answers=False, throughput=False, golden_path=golden, record_golden=True))
    assert rec.golden.mode == "recorded" and golden.exists()

    shape_server.settings.update(wrong=True, shift_at=3)
    report = run_validate(config(shape_server, tmp_path, throughput=False, golden_path=golden))
    assert not report.ok
    failures = "\n".join(report.failures)
    for name in ("fact", "arithmetic", "counting", "code"):
        assert f"answers/{name}" in failures
    assert "diverges at token 3" in failures
    assert len(report.golden.diverged) == len(report.golden.diffs) == 4
    assert ServeReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_missing_golden_file_fails(shape_server, tmp_path):
    report = run_validate(config(shape_server, tmp_path, answers=False, throughput=False, golden_path=tmp_path / "nope.json"))
    assert report.golden.mode == "missing" and not report.ok


def test_golden_from_another_model_is_refused(shape_server, tmp_path):
    from patchctl.validate.golden import GoldenEntry, GoldenRecord

    other = GoldenRecord("other-model", "1.0", "completions", 4, (GoldenEntry("p", "t", None),))
    path = other.save(tmp_path / "g.json")
    report = run_validate(config(shape_server, tmp_path, answers=False, throughput=False, golden_path=path))
    assert report.golden.mode == "wrong-model"
    assert any("recorded from model 'other-model'" in f for f in report.failures)


def test_reasoning_only_reply_is_not_an_answer(shape_server, tmp_path):
    # A thinking budget too small to reach the answer: content stays null.
    from patchctl.validate.answers import AnswerCheck, check_fact, run_answers
    from patchctl.validate.client import OpenAIClient

    checks = [AnswerCheck("fact", "capital of France?", 3, check_fact)]
    (res,) = run_answers(OpenAIClient(shape_server.base_url), checks)
    assert not res.passed and res.reason.startswith("the answer is only in reasoning_content (12 chars, cut off")
    assert (res.reasoning_chars, res.reasoning_passed, res.finish_reason, res.max_tokens) == (12, False, "length", 3)
    # Room for the answer: it passes, and the thinking (no answer in it) did not.
    (res,) = run_answers(OpenAIClient(shape_server.base_url), checks, extra_tokens=10)
    assert res.passed and (res.reasoning_passed, res.finish_reason, res.max_tokens) == (False, "stop", 13)


def test_baseline_record_then_regression_names_the_numbers(shape_server, tmp_path):
    # Throughput only: this test scales output_tok_s alone; the 2 ms decode rate of the in-process
    # server moves with the machine's load (the decode rate's own check: test_serve_baseline).
    cfg = replace(config(shape_server, tmp_path, answers=False), baseline_metrics=("output_tok_s",))
    recorded = run_validate(replace(cfg, update_baseline=True))
    assert recorded.baseline.status == "recorded"
    path = recorded.baseline.path

    ok = run_validate(cfg)
    assert ok.baseline.status == "compared"
    assert {c.concurrency for c in ok.baseline.checks} == {1, 4}

    # Pretend the known-good run was 100x as fast, every request of it (the samples the statistics
    # compare): today's numbers are a significant drop far past 5% however much a loaded CI machine
    # slowed down the recording run.
    data = json.loads(open(path).read())
    for conc, level in data["levels"].items():
        level["output_tok_s"] *= 100
        data["samples"][conc]["request_tok_s"] = [x * 100 for x in data["samples"][conc]["request_tok_s"]]
    open(path, "w").write(json.dumps(data))
    bad = run_validate(cfg)
    assert not bad.ok
    msg = [f for f in bad.failures if f.startswith("baseline")]
    assert len(msg) == 2 and "vs baseline" in msg[0]
    assert "significant and beyond the 5% threshold REGRESSED" in msg[0] and "95% interval" in msg[0]
    assert ServeReport.from_json(json.loads(json.dumps(bad.to_json()))) == bad

    # A baseline written before samples were kept is held to the threshold alone, and says so.
    del data["samples"]
    open(path, "w").write(json.dumps(data))
    old = run_validate(cfg)
    msg = [f for f in old.failures if f.startswith("baseline")]
    assert len(msg) == 2 and "threshold 5%) REGRESSED; no samples in the baseline: threshold only" in msg[0]

    # A different patch set is a different deployment: no baseline for it yet.
    other = run_validate(replace(cfg, patch_set="p2"))
    assert other.baseline.status == "missing"


def test_failed_requests_fail_the_run_and_never_become_a_baseline(shape_server, tmp_path):
    shape_server.settings["fail"] = True
    cfg = config(shape_server, tmp_path, answers=False, concurrency=(1,), warmup_requests=0, update_baseline=True)
    report = run_validate(cfg)
    (lv,) = report.throughput.levels
    assert (lv.requests, lv.failed, lv.output_tok_s) == (4, 4, None)
    assert any("4/4 requests failed" in f and "HTTP 500" in f for f in report.failures)
    assert report.baseline.status == "refused"
    assert not list((tmp_path / "baselines").glob("*.json"))


def test_streams_cut_short_are_failures_not_fast_requests(shape_server, tmp_path):
    shape_server.settings["truncate_after"] = 6
    report = run_validate(config(shape_server, tmp_path, answers=False, concurrency=(2,), warmup_requests=0))
    (lv,) = report.throughput.levels
    assert lv.failed == lv.requests == 4
    assert lv.errors == ("TruncatedStream: stream ended without a finish_reason after 6 chunks",)
    assert not report.ok


def test_extra_body_reaches_every_request(shape_server, tmp_path):
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    run_validate(
        config(
            shape_server,
            tmp_path,
            concurrency=(1,),
            requests_per_level=1,
            extra_body=extra,
            golden_path=tmp_path / "g.json",
            record_golden=True,
        )
    )
    posts = shape_server.requests
    assert len(posts) >= 4 + 4 + 2  # answers, golden, warm-up + throughput
    assert all(p["chat_template_kwargs"] == {"enable_thinking": False} for p in posts)


def test_renderers(shape_server, tmp_path):
    report = run_validate(config(shape_server, tmp_path, golden_path=tmp_path / "g.json", record_golden=True))
    table = validate_text(report)
    for needle in ("coherence: answers", "PASS", "throughput", "TTFT", "tok/s", "OK"):
        assert needle in table
    obj = json.loads(json.dumps(report.to_json()))
    assert obj["ok"] is True and obj["format"] == 1
    assert obj["throughput"]["levels"][1]["concurrency"] == 4
    assert obj["deployment"] == {"model": "tiny-reasoner", "engine_version": "0.0.0+shape", "patch_set": "p1"}
    json_path, png_path, warnings = write_outputs(report, tmp_path / "out" / "serve.json")
    assert json.loads(json_path.read_text()) == obj and warnings == ()
    # A stored report re-renders: the matrix can redraw tables and plots later.
    assert ServeReport.from_json(obj) == report
    assert png_path == tmp_path / "out" / "serve.png"
    assert png_path.read_bytes()[:8] == PNG_MAGIC and png_path.stat().st_size > 5000


def test_reports_stored_before_the_added_keys_still_load(shape_server, tmp_path):
    cfg = config(shape_server, tmp_path, concurrency=(1,), requests_per_level=2)
    run_validate(replace(cfg, update_baseline=True, answers=False))
    report = run_validate(cfg)
    obj = json.loads(json.dumps(report.to_json()))
    assert obj["throughput"]["single_request"]["output_tok_s"] == obj["throughput"]["levels"][0]["output_tok_s"]
    # Format 1 as first written: none of the keys added since.
    del obj["warnings"]
    for a in obj["answers"]:
        for key in ("reasoning_passed", "finish_reason", "max_tokens"):
            del a[key]
    for key in ("prompt", "prompt_sha256", "temperature", "single_request"):
        del obj["throughput"][key]
    del obj["throughput"]["levels"][0]["request_tok_s"]
    for key in ("not_compared", "workload_changes"):
        del obj["baseline"][key]
    old = ServeReport.from_json(obj)
    assert old.throughput.prompt is None and old.throughput.levels[0].request_tok_s is None
    assert old.throughput.single_request.output_tok_s == report.throughput.single_request.output_tok_s
    assert "-" in validate_text(old)  # the spread column says "not measured"
