import pytest

from patchctl.validate.metrics import RequestRecord, aggregate, percentile, spread_of, summarize_ms


def rec(start=0.0, chunks=(), usage=None, streamed=True, end=None, ok=True, error=None, reasoning=""):
    chunks = tuple(chunks)
    return RequestRecord(
        ok,
        error,
        streamed,
        start,
        end if end is not None else (chunks[-1] if chunks else start + 1),
        chunks,
        usage,
        "x",
        reasoning,
    )


def test_percentile_interpolates_like_numpy():
    vals = [1.0, 2.0, 3.0, 4.0]
    assert percentile(vals, 50) == 2.5
    assert percentile(vals, 0) == 1.0
    assert percentile(vals, 100) == 4.0
    assert percentile(vals, 90) == pytest.approx(3.7)
    assert percentile([5.0], 99) == 5.0


def test_streamed_request_ttft_itl_tpot():
    r = rec(start=10.0, chunks=[10.5, 10.6, 10.8, 11.1])
    assert r.ttft == pytest.approx(0.5)
    assert r.itls == pytest.approx((0.1, 0.2, 0.3))
    # chunk count as token count: 3 gaps over 0.6s
    assert r.tpot == pytest.approx(0.2)
    assert r.token_count_method == "chunks"


def test_usage_wins_over_chunk_count_for_tpot():
    # Two chunks but the server says 7 tokens (multi-token chunks, e.g. speculative decoding).
    r = rec(start=0.0, chunks=[0.2, 0.8], usage=7)
    assert r.output_tokens == 7 and r.token_count_method == "usage"
    assert r.tpot == pytest.approx(0.6 / 6)


def test_non_streaming_reports_no_token_latencies():
    r = rec(start=0.0, chunks=[], usage=20, streamed=False, end=2.0)
    assert r.ttft is None and r.tpot is None and r.itls == ()
    assert r.output_tokens == 20 and r.e2e == 2.0
    # Without usage a non-streamed reply cannot be counted.
    assert rec(streamed=False, end=1.0).output_tokens is None


def test_tpot_undefined_for_single_token_or_single_chunk():
    assert rec(chunks=[0.1], usage=1).tpot is None
    assert rec(chunks=[0.1], usage=5).tpot is None


def test_aggregate_level():
    records = [
        rec(start=0.0, chunks=[0.1, 0.2, 0.3], usage=3),
        rec(start=0.0, chunks=[0.2, 0.4], usage=2, reasoning="r"),
        rec(ok=False, error="HTTPError: 500"),
    ]
    lv = aggregate(8, records, duration_s=0.5, streamed=True)
    assert (lv.requests, lv.failed, lv.output_tokens) == (3, 1, 5)
    assert lv.output_tok_s == pytest.approx(10.0)
    assert lv.ttft_ms.p50 == pytest.approx(150.0)
    assert lv.itl_ms.n == 3
    assert lv.token_count_method == "usage"
    assert lv.reasoning_requests == 1
    assert lv.errors == ("HTTPError: 500",)
    assert set(lv.flat()) >= {"output_tok_s", "ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50"}


def test_aggregate_non_streaming_without_usage_has_no_throughput():
    lv = aggregate(1, [rec(streamed=False, end=1.0)], 1.0, streamed=False)
    assert lv.output_tok_s is None and lv.ttft_ms is None and lv.tpot_ms is None
    assert lv.token_count_method == "unknown"
    assert "output_tok_s" not in lv.flat() and "tpot_ms_p50" not in lv.flat()


def test_mixed_count_methods_are_named():
    lv = aggregate(2, [rec(chunks=[0.1, 0.2], usage=2), rec(chunks=[0.1, 0.2])], 1.0, True)
    assert lv.token_count_method == "mixed"


def test_summarize_empty_is_none():
    assert summarize_ms([]) is None


def test_spread_of_per_request_tok_s():
    assert spread_of([]) is None
    single = spread_of([50.0])
    assert (single.n, single.p50, single.iqr_pct, single.median_ci_pct) == (1, 50.0, 0.0, None)
    steady = spread_of([99.0, 100.0, 101.0] * 6)
    assert steady.p10 == 99.0 and steady.p50 == 100.0 and steady.p90 == 101.0
    assert steady.iqr_pct == pytest.approx(2.0) and steady.median_ci_pct == pytest.approx(1.0)
    # The median's interval narrows with more requests of the same spread; the IQR does not.
    values = [90.0 + i for i in range(21)]
    few, many = spread_of(values), spread_of(values * 8)
    assert few.iqr_pct == pytest.approx(many.iqr_pct, rel=0.05)
    assert many.median_ci_pct < few.median_ci_pct / 2


def test_per_request_tok_s_is_tokens_over_end_to_end_time():
    assert rec(start=0.0, chunks=[0.5, 1.0], usage=10, end=2.0).tok_s == 5.0
    assert rec(streamed=False, end=1.0).tok_s is None  # no count without usage
    lv = aggregate(
        1, [rec(start=0.0, chunks=[0.5], usage=10, end=1.0), rec(start=1.0, chunks=[1.5], usage=10, end=3.0)], 3.0, True
    )
    assert (lv.request_tok_s.n, lv.request_tok_s.p50) == (2, 7.5)
    assert lv.flat()["request_tok_s_p50"] == 7.5 and "request_tok_s_ci_pct" in lv.flat()
