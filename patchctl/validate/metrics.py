"""Latency and throughput arithmetic over measured requests. No I/O here.

Names and definitions are the field's (vLLM's `vllm bench serve`, SGLang's `bench_serving`), so
numbers compare with what people already quote:
- TTFT: request sent -> first chunk carrying output (content or reasoning).
- TPOT (excluding the first token): (last output chunk - first output chunk) / (output tokens - 1).
  vLLM and SGLang compute (E2E - TTFT) / (output tokens - 1) with E2E ending at their last chunk (vLLM)
  or at the stream's end (SGLang): the same but for the time after the last token. Undefined for fewer
  than two tokens and without streaming (never derived from an E2E minus a TTFT we did not see: that
  gave negative TPOT).
- decode rate: one request's 1 / TPOT, in tokens per second: how fast it decoded once prefill was done.
- ITL: gap between consecutive output-carrying chunks.
- E2E: request sent -> stream ended.
- output throughput: all output tokens of a level / wall time of the level; request throughput:
  completed requests / wall time of the level.
- per-request tok/s: one request's output tokens / its E2E (what `time curl` measures, prefill included);
  their spread across a level says how steady the level's figure is (Spread).

Latency figures need a stream that was really streamed: a request whose output chunks arrived all at
once (a buffering proxy, a server that does not flush) is `buffered`, and a level of such requests
reports no TTFT, TPOT, ITL or decode rate rather than the arrival time of one buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from typing import NamedTuple


class RequestRecord(NamedTuple):
    """Raw measurements of one request (perf_counter seconds)."""

    ok: bool
    error: str | None
    streamed: bool
    start: float
    end: float
    chunk_times: tuple[float, ...]  # arrival of every chunk carrying output
    usage_tokens: int | None  # completion_tokens from the server's usage
    content: str
    reasoning: str
    # Added with the stream check and the reasoning split; defaults keep older callers working.
    finish_reason: str | None = None
    reasoning_chunks: int = 0  # output chunks that carried reasoning_content
    content_chunks: int = 0  # output chunks that carried content
    reads: int = 0  # separate reads from the socket that brought output chunks
    ended_in_reasoning: bool = False  # cut by max_tokens (finish_reason length) while still reasoning
    # The server's completion_tokens made no sense (sse.usage_problem: negative, not an integer, more than
    # max_tokens): why; usage_tokens is then None and the tokens are counted from chunks.
    usage_rejected: str | None = None

    @property
    def chunk_tokens(self) -> int:
        return len(self.chunk_times)

    @property
    def output_tokens(self) -> int | None:
        if self.usage_tokens is not None:
            return self.usage_tokens
        # Without usage a non-streaming reply cannot be counted honestly.
        return self.chunk_tokens if self.streamed else None

    @property
    def token_count_method(self) -> str:
        if self.usage_tokens is not None:
            return "usage"
        return "chunks" if self.streamed else "unknown"

    @property
    def ttft(self) -> float | None:
        if not self.streamed or not self.chunk_times:
            return None
        return self.chunk_times[0] - self.start

    @property
    def tpot(self) -> float | None:
        n = self.output_tokens
        # One chunk carrying every token would give TPOT 0: not a measurement.
        if not self.streamed or n is None or n < 2 or len(self.chunk_times) < 2:
            return None
        return max(0.0, (self.chunk_times[-1] - self.chunk_times[0]) / (n - 1))

    @property
    def itls(self) -> tuple[float, ...]:
        if not self.streamed:
            return ()
        t = self.chunk_times
        return tuple(b - a for a, b in pairwise(t))

    @property
    def buffered(self) -> bool:
        """The output arrived at once, not as it was made: one read brought every chunk, or the chunks
        came in the last few percent of the request's time with no gap between them. An honest fast
        stream (2 ms between tokens) has gaps far above BUFFER_GAP_S; fewer than MIN_CHUNKS chunks
        cannot tell."""
        t = self.chunk_times
        if not self.streamed or len(t) < MIN_CHUNKS:
            return False
        if self.reads == 1:
            return True
        gaps = sorted(self.itls)
        span = t[-1] - t[0]
        return span <= BUFFER_SPAN * self.e2e and percentile(gaps, 50) < BUFFER_GAP_S

    @property
    def decode_tok_s(self) -> float | None:
        """1 / TPOT: tokens per second after the first."""
        tpot = self.tpot
        return 1.0 / tpot if tpot else None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tok_s(self) -> float | None:
        """This request's output tokens per second, end to end; None where its tokens are not known."""
        n = self.output_tokens
        return n / self.e2e if n is not None and self.e2e > 0 else None


USAGE_PROBLEMS_KEPT = 3  # distinct reasons a level keeps, for its warning
MIN_CHUNKS = 4  # fewer output chunks than this cannot show whether a stream was streamed
BUFFER_SPAN = 0.05  # every chunk inside the last 5% of the request's time...
BUFFER_GAP_S = 0.0005  # ...and half the gaps under 0.5 ms: what parsing one buffer takes, not decoding

STREAMED = "streamed"
BUFFERED = "buffered"
NOT_STREAMED = "not streamed"
TOO_SHORT = "too short to tell"
NOT_MEASURED_BUFFERED = "the stream arrived buffered"


class Stats(NamedTuple):
    """Summary of a sample, in milliseconds."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not sorted_values:
        raise ValueError("percentile of an empty sample")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summarize_ms(seconds: Iterable[float]) -> Stats | None:
    values = sorted(s * 1000.0 for s in seconds)
    if not values:
        return None
    return Stats(
        n=len(values),
        mean=sum(values) / len(values),
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        max=values[-1],
    )


class Spread(NamedTuple):
    """How per-request output tok/s spread across one level's requests."""

    n: int
    p10: float
    p25: float
    p50: float
    p75: float
    p90: float
    iqr_pct: float | None  # (p75 - p25) / p50, in %: the spread of one request's figure
    # Half-width of the 95% confidence interval of the median, in % of it: how well this many
    # requests pin the level down. It shrinks as 1/sqrt(n), so more requests narrow it; what is
    # held against --threshold. None for a single request (no spread to see).
    median_ci_pct: float | None


def spread_of(values: Iterable[float]) -> Spread | None:
    """Percentiles, IQR and the median's distribution-free 95% interval (the order statistics at
    ranks n/2 -+ 1.96 sqrt(n)/2, the binomial's normal approximation), None for no values."""
    xs = sorted(values)
    n = len(xs)
    if not n:
        return None
    p = {q: percentile(xs, q) for q in (10, 25, 50, 75, 90)}
    med = p[50]
    iqr = (p[75] - p[25]) / med * 100 if med > 0 else None
    ci = None
    if n >= 2 and med > 0:
        lo = max(1, math.floor(n / 2 - 0.98 * math.sqrt(n)))  # 1-based ranks
        hi = min(n, math.ceil(n / 2 + 1 + 0.98 * math.sqrt(n)))
        ci = (xs[hi - 1] - xs[lo - 1]) / 2 / med * 100
    return Spread(n, p[10], p[25], med, p[75], p[90], iqr, ci)


class LevelMetrics(NamedTuple):
    """One concurrency level's result. None means 'not measurable here', never 0."""

    concurrency: int
    requests: int
    failed: int
    streamed: bool
    duration_s: float
    output_tokens: int | None
    output_tok_s: float | None
    token_count_method: str  # usage | chunks | mixed | unknown
    ttft_ms: Stats | None
    tpot_ms: Stats | None
    itl_ms: Stats | None
    e2e_ms: Stats | None
    reasoning_requests: int  # requests that streamed any reasoning_content
    errors: tuple[str, ...]
    # Added after format 1 was first written; the default keeps older stored reports readable.
    request_tok_s: Spread | None = None  # per-request output tok/s over E2E; None where tokens are not known
    decode_tok_s: Spread | None = None  # per-request decode rate (1 / TPOT)
    request_throughput: float | None = None  # completed requests per second
    stream: str | None = None  # streamed | buffered | not streamed | too short to tell
    latency_not_measured: str | None = None  # why TTFT/TPOT/ITL/decode rate are None, when they are
    buffered_requests: int = 0
    reasoning_tokens: int | None = None  # output tokens spent reasoning (counted from chunks)
    content_tokens: int | None = None  # output tokens of the answer (counted from chunks)
    ended_in_reasoning: int = 0  # requests cut by max_tokens while still reasoning
    usage_rejected: int = 0  # requests whose server usage made no sense, so were counted from chunks
    usage_problems: tuple[str, ...] = ()  # why, the first few distinct reasons
    # Per-request values the statistics compare (metric -> sorted values, statistics.thin): request_tok_s,
    # decode_tok_s, ttft_ms, tpot_ms, e2e_ms, where measured. None in reports written before them.
    samples: Mapping[str, Sequence[float]] | None = None
    # validate's own CPU time over the level (the load generator's thread) per output token, in ms:
    # what the client costs, so a reader sees whether it could have been the bottleneck (issue 37).
    client_cpu_ms_per_token: float | None = None

    def flat(self) -> dict[str, float]:
        """The scalar numbers a baseline stores (and can compare: baseline.HIGHER_IS_BETTER and
        LOWER_IS_BETTER; request_tok_s_ci_pct is kept only to say how steady the baseline was)."""
        out: dict[str, float] = {}
        if self.output_tok_s is not None:
            out["output_tok_s"] = self.output_tok_s
        if self.decode_tok_s is not None:
            out["decode_tok_s_p50"] = self.decode_tok_s.p50
        if self.request_tok_s is not None:
            out["request_tok_s_p50"] = self.request_tok_s.p50
            if self.request_tok_s.median_ci_pct is not None:
                out["request_tok_s_ci_pct"] = self.request_tok_s.median_ci_pct
        for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            stats = getattr(self, name)
            if stats is not None:
                out[f"{name}_p50"] = stats.p50
                out[f"{name}_p99"] = stats.p99
        return out


def stream_verdict(records: Sequence[RequestRecord], streamed: bool) -> str:
    """The level's stream: buffered when most of its requests that could tell arrived buffered."""
    if not streamed:
        return NOT_STREAMED
    telling = [r for r in records if len(r.chunk_times) >= MIN_CHUNKS]
    if not telling:
        return TOO_SHORT
    return BUFFERED if 2 * sum(r.buffered for r in telling) > len(telling) else STREAMED


def aggregate(concurrency: int, records: Sequence[RequestRecord], duration_s: float, streamed: bool) -> LevelMetrics:
    ok = [r for r in records if r.ok]
    counts = [r.output_tokens for r in ok]
    methods = {r.token_count_method for r in ok}
    if any(c is None for c in counts) or not ok:
        total: int | None = None
        tok_s: float | None = None
    else:
        total = sum(c for c in counts if c is not None)
        tok_s = total / duration_s if duration_s > 0 else None
    method = methods.pop() if len(methods) == 1 else ("mixed" if methods else "unknown")
    verdict = stream_verdict(ok, streamed)
    # A buffered stream's chunk times are when one buffer was parsed: no latency was measured.
    timed = [] if verdict == BUFFERED else ok
    split = streamed and bool(ok)
    return LevelMetrics(
        concurrency=concurrency,
        requests=len(records),
        failed=len(records) - len(ok),
        streamed=streamed,
        duration_s=duration_s,
        output_tokens=total,
        output_tok_s=tok_s,
        token_count_method=method,
        ttft_ms=summarize_ms(r.ttft for r in timed if r.ttft is not None),
        tpot_ms=summarize_ms(r.tpot for r in timed if r.tpot is not None),
        itl_ms=summarize_ms(x for r in timed for x in r.itls),
        e2e_ms=summarize_ms(r.e2e for r in ok),
        reasoning_requests=sum(1 for r in ok if r.reasoning),
        errors=tuple(sorted({r.error for r in records if r.error})),
        request_tok_s=spread_of(t for r in ok if (t := r.tok_s) is not None),
        decode_tok_s=spread_of(d for r in timed if (d := r.decode_tok_s) is not None),
        request_throughput=len(ok) / duration_s if duration_s > 0 and ok else None,
        stream=verdict,
        latency_not_measured=NOT_MEASURED_BUFFERED if verdict == BUFFERED else None,
        buffered_requests=sum(1 for r in ok if r.buffered),
        reasoning_tokens=sum(r.reasoning_chunks for r in ok) if split else None,
        content_tokens=sum(r.content_chunks for r in ok) if split else None,
        ended_in_reasoning=sum(1 for r in ok if r.ended_in_reasoning),
        usage_rejected=sum(1 for r in ok if r.usage_rejected),
        usage_problems=tuple(sorted({r.usage_rejected for r in ok if r.usage_rejected}))[:USAGE_PROBLEMS_KEPT],
        samples=request_samples(ok, timed),
    )


def request_samples(ok: Sequence[RequestRecord], timed: Sequence[RequestRecord]) -> dict[str, tuple[float, ...]]:
    """One value per request for each figure a baseline compares on its median, thinned to
    statistics.MAX_SAMPLES: what lets a later run say whether a change is more than noise."""
    from patchctl.validate.statistics import thin

    per_request: dict[str, list[float | None]] = {
        "request_tok_s": [r.tok_s for r in ok],
        "decode_tok_s": [r.decode_tok_s for r in timed],
        "ttft_ms": [None if r.ttft is None else r.ttft * 1000 for r in timed],
        "tpot_ms": [None if r.tpot is None else r.tpot * 1000 for r in timed],
        "e2e_ms": [r.e2e * 1000 for r in ok],
    }
    out = {k: thin(v for v in vs if v is not None) for k, vs in per_request.items()}
    return {k: v for k, v in out.items() if v}
