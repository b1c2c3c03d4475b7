"""The serve tier's result: plain immutable data, JSON-able (to_json gives plain dicts and lists, the
shape of a validate document's `report` and of the file --out writes), no rendering."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, NamedTuple

from patchctl.validate.answers import AnswerResult
from patchctl.validate.baseline import BaselineCheck, Deployment, NotCompared
from patchctl.validate.golden import GoldenDiff, diff_from_json
from patchctl.validate.longcontext import LongContextReport
from patchctl.validate.metrics import LevelMetrics, Spread, Stats
from patchctl.validate.provenance import Provenance

# Keys have been added to format 1 since it was first written (answers' reasoning_passed,
# finish_reason and max_tokens; throughput's prompt, prompt_sha256, temperature, prompts, single_request and
# each level's request_tok_s, decode_tok_s, request_throughput, stream, latency_not_measured,
# buffered_requests, reasoning_tokens, content_tokens, ended_in_reasoning, usage_rejected, usage_problems;
# baseline's not_compared and workload_changes; warnings, bad_replies, bad_reply_count; provenance, each
# level's samples and each baseline check's evidence, ci_low, ci_high, significant, samples; each golden
# diff's numerics; long_context), none renamed or
# removed: a reader of format 1 keeps working, and older stored reports still load.
FORMAT = 1


@dataclass(frozen=True)
class GoldenReport:
    mode: str  # "recorded" | "compared" | "missing" | "wrong-model"
    path: str
    diffs: tuple[GoldenDiff, ...]
    golden_model: str = ""  # what the golden file was recorded from
    golden_engine_version: str = ""

    @property
    def diverged(self) -> tuple[GoldenDiff, ...]:
        return tuple(d for d in self.diffs if not d.matched)

    @property
    def numerics_failed(self) -> tuple[GoldenDiff, ...]:
        return tuple(d for d in self.diffs if d.numerics is not None and not d.numerics.passed)

    def numerics_notes(self) -> list[str]:
        """Once: the prompts compared on text alone, and why (an old golden file, a server without logprobs)."""
        alone = [d for d in self.diffs if d.numerics is not None and d.numerics.status != "compared"]
        if not alone:
            return []
        return [f"golden: {len(alone)}/{len(self.diffs)} prompt(s) compared on text only: {alone[0].numerics.reason}"]  # type: ignore[union-attr]


class SingleRequest(NamedTuple):
    """The figure people quote: one request at a time (the concurrency-1 level), led by what a user
    feels: the time to the first token and the decode rate after it. output_tok_s is output tokens
    over the requests' wall time, prefill included (what `time curl` gives), not the decode rate."""

    concurrency: int  # always 1
    requests: int
    ttft_ms: Stats | None
    decode_tok_s: Spread | None  # per-request 1 / TPOT
    tpot_ms: Stats | None
    itl_ms: Stats | None
    e2e_ms: Stats | None
    output_tok_s: float | None
    stream: str | None  # streamed | buffered | not streamed | too short to tell
    latency_not_measured: str | None  # why the latency figures are None
    token_count_method: str | None = None  # usage | chunks | mixed | unknown: how its tokens were counted


@dataclass(frozen=True)
class ThroughputReport:
    api: str
    streamed: bool
    max_tokens: int
    levels: tuple[LevelMetrics, ...]
    prompt: str | None = None  # counting | essay | the --prompt file's path; None in older reports
    prompt_sha256: str | None = None  # of the prompt's text, 16 hex digits
    temperature: float | None = None
    prompts: str | None = None  # unique (a tag of its own per request) | shared; None in older reports
    # The concurrency-1 level, when one was measured: derived from levels, never passed.
    single_request: SingleRequest | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        one = next((lv for lv in self.levels if lv.concurrency == 1), None)
        if one is not None:
            single = SingleRequest(
                1,
                one.requests,
                one.ttft_ms,
                one.decode_tok_s,
                one.tpot_ms,
                one.itl_ms,
                one.e2e_ms,
                one.output_tok_s,
                one.stream,
                one.latency_not_measured,
                one.token_count_method,
            )
            object.__setattr__(self, "single_request", single)

    @property
    def workload(self) -> dict[str, Any]:
        """What a baseline records of how it was measured, to tell a like-for-like comparison."""
        return {
            "prompt": self.prompt,
            "prompt_sha256": self.prompt_sha256,
            "max_tokens": self.max_tokens,
            "api": self.api,
            "streamed": self.streamed,
            "prompts": self.prompts,
        }


@dataclass(frozen=True)
class BaselineReport:
    status: str  # "compared" | "missing" | "recorded" | "refused" (not recorded: requests failed)
    path: str
    threshold: float
    checks: tuple[BaselineCheck, ...]
    not_compared: tuple[NotCompared, ...] = ()  # levels measured in only one of the two runs
    workload_changes: tuple[str, ...] = ()  # how this run was measured differently from the baseline

    @property
    def regressions(self) -> tuple[BaselineCheck, ...]:
        return tuple(c for c in self.checks if c.regressed)


@dataclass(frozen=True)
class ServeReport:
    base_url: str
    deployment: Deployment
    started_at: str
    duration_s: float
    answers: tuple[AnswerResult, ...] | None
    golden: GoldenReport | None
    throughput: ThroughputReport | None
    baseline: BaselineReport | None
    failures: tuple[str, ...]  # one sentence each, naming the numbers
    notes: tuple[str, ...]  # what was skipped or measured differently, and why
    warnings: tuple[str, ...] = ()  # results to distrust: a comparison that is within the noise
    # Requests whose reply broke the protocol or a cap ("c=8 request 5: event 3: `choices` is str, not a
    # list"), the first BAD_REPLIES_KEPT of them: the server is wrong, validate exits 3.
    bad_replies: tuple[str, ...] = ()
    bad_reply_count: int = 0  # all of them
    provenance: Provenance | None = None  # what was measured (provenance.py); None in older reports
    long_context: LongContextReport | None = None  # needles and the long greedy run (None: --long-context off)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        out = _plain(self)
        out["format"] = FORMAT
        out["ok"] = self.ok
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ServeReport:
        """Inverse of to_json: re-render a table or plot from a stored report."""
        if obj.get("format") != FORMAT:
            raise ValueError(f"serve report format {obj.get('format')!r}, expected {FORMAT}")
        answers = obj.get("answers")
        golden = obj.get("golden")
        tp = obj.get("throughput")
        base = obj.get("baseline")
        return cls(
            base_url=obj["base_url"],
            deployment=Deployment(**obj["deployment"]),
            started_at=obj["started_at"],
            duration_s=obj["duration_s"],
            answers=None if answers is None else tuple(AnswerResult(**a) for a in answers),
            golden=None
            if golden is None
            else GoldenReport(**{**golden, "diffs": tuple(diff_from_json(d) for d in golden["diffs"])}),
            throughput=None
            if tp is None
            else ThroughputReport(
                # single_request is derived from the levels, not passed
                **{k: v for k, v in tp.items() if k not in ("single_request", "levels")},
                levels=tuple(_level(lv) for lv in tp["levels"]),
            ),
            baseline=None
            if base is None
            else BaselineReport(
                **{
                    **base,
                    "checks": tuple(_check(c) for c in base["checks"]),
                    "not_compared": tuple(NotCompared(**n) for n in base.get("not_compared", ())),
                    "workload_changes": tuple(base.get("workload_changes", ())),
                }
            ),
            failures=tuple(obj["failures"]),
            notes=tuple(obj["notes"]),
            warnings=tuple(obj.get("warnings", ())),
            bad_replies=tuple(obj.get("bad_replies", ())),
            bad_reply_count=int(obj.get("bad_reply_count", 0)),
            provenance=None if obj.get("provenance") is None else Provenance.from_json(obj["provenance"]),
            long_context=None if obj.get("long_context") is None else LongContextReport.from_json(obj["long_context"]),
        )


def _check(obj: dict[str, Any]) -> BaselineCheck:
    counts = obj.get("samples")
    return BaselineCheck(**{**obj, "samples": None if counts is None else tuple(counts)})


def _level(obj: dict[str, Any]) -> LevelMetrics:
    stats = {k: None if obj[k] is None else Stats(**obj[k]) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")}
    spreads = {k: None if obj.get(k) is None else Spread(**obj[k]) for k in ("request_tok_s", "decode_tok_s")}
    return LevelMetrics(
        **{
            **obj,
            **stats,
            **spreads,
            "errors": tuple(obj["errors"]),
            "usage_problems": tuple(obj.get("usage_problems", ())),
            "samples": None if obj.get("samples") is None else {k: tuple(v) for k, v in obj["samples"].items()},
        }
    )


def _plain(obj: Any) -> Any:
    """NamedTuples and dataclasses to dicts, tuples to lists, recursively."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple) and hasattr(obj, "_asdict"):
        return {k: _plain(v) for k, v in obj._asdict().items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj
