"""The serve tier's one entry point: coherence, throughput and baseline against one running server
(run_validate), or against a server it starts and stops (run_with_server, for --start).

Errors are patchctl's: bad input (a golden or baseline file that is not one, impossible settings) is a
UsageError, exit 2, raised before any server is started or asked; a server that does not answer, or
stops answering, is a NetworkError and one that does not start a ServerStartError, both exit 3.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchctl.core.errors import (
    BadServerReply,
    NetworkError,
    RequestDeadline,
    RequestFailed,
    UsageError,
    plain_network_reason,
)
from patchctl.validate import answers as _answers
from patchctl.validate import baseline as _baseline
from patchctl.validate import golden as _golden
from patchctl.validate import longcontext as _longcontext
from patchctl.validate import provenance as _provenance
from patchctl.validate.client import CHAT, COMPLETIONS, DEFAULT_TIMEOUT_S, OpenAIClient
from patchctl.validate.metrics import BUFFERED
from patchctl.validate.process import ServerProcess
from patchctl.validate.report import BaselineReport, GoldenReport, ServeReport, ThroughputReport
from patchctl.validate.serverinfo import context_limit
from patchctl.validate.throughput import (
    DEFAULT_PROMPT,
    PROMPTS,
    TEMPERATURE,
    default_requests,
    prompt_digest,
    run_level,
    warm_up,
)

Progress = Callable[[str], None]


def default_data_dir() -> Path:
    """patchctl's data dir (PATCHCTL_DATA_DIR or the platform's), serve/ inside it."""
    from patchctl.core.config import data_dir

    return data_dir() / "serve"


@dataclass(frozen=True)
class ServeConfig:
    base_url: str
    model: str | None = None  # None: the first model GET /v1/models lists
    engine_version: str | None = None  # None: GET /version, else "unknown"
    patch_set: str = "unknown"  # what the server runs: baseline.applied_patch_set ("none": pristine)
    patch_set_from: str = "unknown"  # target | option | unknown
    patches: Sequence[tuple[str, str | None]] | None = None  # (name, sha256) from the tree's record
    engine_build: str | None = None  # the build the tree's record names (provenance.record_facts)
    accept_baseline_mismatch: bool = False  # compare with a baseline that measured something else
    api_key: str | None = None
    request_timeout_s: float = DEFAULT_TIMEOUT_S  # each request's deadline, connect to last byte (--timeout)
    level_timeout_s: float | None = None  # each level's (--level-timeout); None: throughput.level_deadline
    extra_body: Mapping[str, Any] = field(default_factory=dict)  # merged into every request

    answers: bool = True
    answers_api: str = CHAT
    answers_extra_tokens: int = 0  # thinking budget for reasoning models

    golden_path: Path | None = None  # golden mode runs only with a file
    record_golden: bool = False
    golden_prompts: Sequence[str] = _golden.DEFAULT_PROMPTS
    golden_max_tokens: int = 48
    golden_api: str = COMPLETIONS

    long_context: str = _longcontext.QUICK  # off | quick | full (--long-context)
    long_context_budget_s: float | None = None  # None: the mode's (--long-context-budget)
    max_context: int | None = None  # the server's context limit, when it does not say it (--max-context)

    throughput: bool = True
    concurrency: Sequence[int] = (1, 8, 32)
    requests_per_level: int | None = None  # None: throughput.default_requests
    max_tokens: int = 128
    stream: bool = True
    throughput_api: str = CHAT
    prompt: str = DEFAULT_PROMPT  # the text; throughput.resolve_prompt reads --prompt
    prompt_name: str | None = None  # for the report: counting | essay | a file's path; None: from the text
    shared_prompt: bool = False  # every throughput request the same text (throughput.request_prompts)
    warmup_requests: int = 1

    baseline_dir: Path | None = None  # None: default_data_dir()/baselines
    update_baseline: bool = False
    threshold: float = _baseline.DEFAULT_THRESHOLD
    baseline_metrics: Sequence[str] = _baseline.DEFAULT_METRICS


def check_config(config: ServeConfig) -> None:
    """UsageError for settings no server could satisfy and for a golden file that is not one: found
    before a server is started (which can take many minutes) or asked anything."""
    if config.record_golden and config.golden_path is None:
        raise UsageError("recording a golden file needs its path (--golden PATH)")
    if config.long_context not in _longcontext.MODES:
        raise UsageError(f"long context {config.long_context!r}: one of {', '.join(_longcontext.MODES)}")
    if not config.concurrency or min(config.concurrency) < 1:
        raise UsageError(f"concurrency levels must be >= 1, got {tuple(config.concurrency)}")
    golden = config.golden_path
    if golden is not None and not config.record_golden and Path(golden).exists():
        _golden.GoldenRecord.load(Path(golden))


def _why(exc: BaseException) -> str:
    """One line for a failed request (issue 36): a socket's or resolver's words as core.errors says them
    everywhere (plain_network_reason); a deadline's own message as it is (it names the deadline)."""
    if isinstance(exc, RequestDeadline):
        return " ".join(str(exc).split())[:200]
    return plain_network_reason(str(exc))


def run_validate(config: ServeConfig, progress: Progress | None = None) -> ServeReport:
    check_config(config)
    say = progress or (lambda _msg: None)
    t0 = time.monotonic()
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    client = OpenAIClient(config.base_url, config.model, config.api_key, config.request_timeout_s)
    try:
        model = client.resolve_model()
    except (RequestFailed, BadServerReply, RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # ValueError and the rest: /v1/models answered, but not with OpenAI's list of models
        raise NetworkError(
            f"no OpenAI-compatible server answers at {client.base_url}: {_why(exc)}",
            hint="start one, or pass --start 'vllm serve MODEL' to let patchctl start and stop it",
        ) from None
    notes: list[str] = []
    engine_version = config.engine_version or client.engine_version()
    if engine_version is None:
        engine_version = "unknown"
        notes.append("engine version unknown: the server has no /version; pass it for a precise baseline key")
    deployment = _baseline.Deployment(model, engine_version, config.patch_set)
    failures: list[str] = []
    warnings: list[str] = []
    prompts = ("shared" if config.shared_prompt else "unique") if config.throughput else None
    # Read once: the report's max_model_len and the long-context lengths rest on the same statement.
    server_limit = context_limit(client)
    provenance = _provenance.collect(
        client,
        model,
        engine_version,
        config.patch_set,
        config.patch_set_from,
        config.patches,
        config.engine_build,
        prompts,
        server_limit,
    )
    # Before any check runs: a baseline of something else is refused now, not after minutes of load.
    base = _load_baseline(config, deployment)
    if base is not None:
        path = str(_store(config).path_for(deployment))
        warnings += _provenance.check_baseline(base.provenance, provenance, path, config.accept_baseline_mismatch)
    extra = dict(config.extra_body)

    answer_results = None
    if config.answers:
        say("coherence: answers")
        answer_results = _answers.run_answers(
            client, api=config.answers_api, extra_tokens=config.answers_extra_tokens, extra=extra
        )
        failures += [f"answers/{a.name}: {a.reason}" for a in answer_results if not a.passed]

    golden_report = None
    if config.golden_path is not None:
        try:
            golden_report = _run_golden(config, Path(config.golden_path), client, engine_version, extra, say)
        except RequestFailed as exc:
            raise NetworkError(f"golden: a request to {client.base_url} failed: {exc}") from None
        except BadServerReply as exc:  # named in bad_replies too: the run goes on, and exits 3
            failures.append(f"golden: {exc}")
            golden_report = None
    if golden_report is not None:
        if golden_report.mode == "missing":
            failures.append(f"golden: no golden file at {golden_report.path} (record one on a known-good engine)")
        elif golden_report.mode == "wrong-model":
            failures.append(
                f"golden: {golden_report.path} was recorded from model {golden_report.golden_model!r}, "
                f"the server serves {model!r}"
            )
        for d in golden_report.diverged:
            failures.append(
                f"golden: {d.prompt!r} diverges at {d.unit} {d.position}, after {d.context}: expected {d.expected}, got {d.got}"
            )
        failures += [
            f"golden: {d.prompt!r} logprobs moved: {d.numerics.reason}" for d in golden_report.numerics_failed if d.numerics
        ]
        notes += golden_report.numerics_notes()

    long_report = None
    if config.long_context != _longcontext.OFF:
        settings = _longcontext.Settings(config.long_context, config.long_context_budget_s, config.max_context)
        golden_file = None if golden_report is None or golden_report.mode == "missing" else Path(config.golden_path or "")
        long_report = _longcontext.run(client, settings, golden_file, config.record_golden, extra, say, server_limit)
        client.require_answer()
        failures += long_report.failures()
        notes += long_report.notes()

    throughput_report = None
    baseline_report = None
    if config.throughput:
        throughput_report = _run_throughput(config, client, extra, say)
        for lv in throughput_report.levels:
            if lv.failed:
                errors = "; ".join(lv.errors)[:300]
                failures.append(f"throughput c={lv.concurrency}: {lv.failed}/{lv.requests} requests failed ({errors})")
            methods = lv.token_count_method
            if methods != "usage":
                notes.append(f"c={lv.concurrency}: output tokens counted by {methods}, not server usage")
            if not lv.streamed:
                notes.append(f"c={lv.concurrency}: not streamed, so TTFT, TPOT and ITL are not measured")
        warnings += level_warnings(throughput_report)
        baseline_report = _run_baseline(config, deployment, throughput_report, base, provenance)
        if baseline_report.status == "refused":
            failures.append(f"baseline not recorded: requests failed, so {baseline_report.path} keeps its numbers")
        for check in baseline_report.regressions:
            failures.append("baseline " + check.describe(config.threshold))
        notes += _not_compared_notes(baseline_report)
        warnings += _baseline_warnings(config, baseline_report, throughput_report, base)

    if client.bad_reply_count:
        failures.append(
            f"the server's replies broke the protocol or a limit in {client.bad_reply_count} request(s) (the first: "
            f"{client.bad_replies[0]}): every one is listed under bad_replies"
        )
    return ServeReport(
        base_url=client.base_url,
        deployment=deployment,
        started_at=started,
        duration_s=time.monotonic() - t0,
        answers=answer_results,
        golden=golden_report,
        long_context=long_report,
        throughput=throughput_report,
        baseline=baseline_report,
        failures=tuple(failures),
        notes=tuple(notes),
        warnings=tuple(warnings),
        bad_replies=tuple(client.bad_replies),
        bad_reply_count=client.bad_reply_count,
        provenance=provenance,
    )


def level_warnings(tp: ThroughputReport) -> list[str]:
    """Figures to distrust, per level: a stream that arrived buffered, requests that ran out of
    max_tokens while still reasoning, token counts that come from chunks instead of server usage."""
    warnings = []
    for lv in tp.levels:
        c = f"c={lv.concurrency}"
        done = lv.requests - lv.failed
        if lv.stream == BUFFERED:
            warnings.append(
                f"{c}: the stream arrived buffered ({lv.buffered_requests}/{done} requests got all their output "
                "at once, at the end): TTFT, TPOT, ITL and the decode rate are not measured. Likely cause: a proxy "
                "between patchctl and the server buffers the response (nginx: proxy_buffering off), or the server "
                "does not stream it (no chunked encoding, no flush per event)"
            )
        if lv.ended_in_reasoning:
            warnings.append(
                f"{c}: {lv.ended_in_reasoning}/{done} requests ran out of max_tokens ({tp.max_tokens}) inside their "
                f"reasoning (finish_reason length before any answer): the figures measure thinking only; raise "
                "--max-tokens, or turn the model's thinking down (its setting, through the server's extra body)"
            )
        if lv.usage_rejected:
            warnings.append(
                f"{c}: the server's usage made no sense for {lv.usage_rejected}/{done} requests "
                f"({'; '.join(lv.usage_problems)}): not used, their tokens were counted from chunks instead"
            )
        if lv.token_count_method in ("chunks", "mixed"):
            warnings.append(
                f"{c}: the server did not report usage, so output tokens were counted from chunks (one chunk taken as "
                "one token; a chunk carrying several undercounts): tok/s, TPOT and the decode rate rest on that count"
            )
    return warnings


def _run_golden(
    config: ServeConfig, path: Path, client: OpenAIClient, engine_version: str, extra: Mapping[str, Any], say: Progress
) -> GoldenReport:
    if config.record_golden:
        say(f"coherence: recording golden to {path}")
        rec = _golden.record(client, engine_version, config.golden_prompts, config.golden_max_tokens, config.golden_api, extra)
        rec.save(path)
        return GoldenReport("recorded", str(path), (), rec.model, rec.engine_version)
    if not path.exists():
        return GoldenReport("missing", str(path), ())
    rec = _golden.GoldenRecord.load(path)
    if rec.model != client.resolve_model():
        # Diffing another model's outputs would report a meaningless divergence at token 0.
        return GoldenReport("wrong-model", str(path), (), rec.model, rec.engine_version)
    say(f"coherence: comparing with golden {path}")
    return GoldenReport("compared", str(path), _golden.compare(client, rec, extra), rec.model, rec.engine_version)


def _run_throughput(config: ServeConfig, client: OpenAIClient, extra: Mapping[str, Any], say: Progress) -> ThroughputReport:
    if config.warmup_requests:
        warm_up(client, config.throughput_api, config.prompt, config.warmup_requests, extra)
    levels = []
    for conc in config.concurrency:
        n = config.requests_per_level or default_requests(conc)
        say(f"throughput: concurrency {conc}, {n} requests")
        levels.append(
            run_level(
                client,
                conc,
                n,
                config.throughput_api,
                config.prompt,
                config.max_tokens,
                config.stream,
                extra,
                unique_prompts=not config.shared_prompt,
                level_timeout_s=config.level_timeout_s,
            )
        )
        client.require_answer()
    name = config.prompt_name or next((k for k, v in PROMPTS.items() if v == config.prompt), "custom")
    return ThroughputReport(
        config.throughput_api,
        config.stream,
        config.max_tokens,
        tuple(levels),
        prompt=name,
        prompt_sha256=prompt_digest(config.prompt),
        temperature=TEMPERATURE,
        prompts="shared" if config.shared_prompt else "unique",
    )


def _store(config: ServeConfig) -> _baseline.BaselineStore:
    return _baseline.BaselineStore(Path(config.baseline_dir) if config.baseline_dir else default_data_dir() / "baselines")


def _load_baseline(config: ServeConfig, deployment: _baseline.Deployment) -> _baseline.Baseline | None:
    """The baseline this run is compared with; None when it records one, measures no throughput, or
    the deployment has none."""
    if not config.throughput or config.update_baseline:
        return None
    return _store(config).load(deployment)


def _run_baseline(
    config: ServeConfig,
    deployment: _baseline.Deployment,
    tp: ThroughputReport,
    base: _baseline.Baseline | None,
    provenance: _provenance.Provenance,
) -> BaselineReport:
    store = _store(config)
    current = {lv.concurrency: lv.flat() for lv in tp.levels}
    samples = {lv.concurrency: lv.samples for lv in tp.levels if lv.samples}
    path = store.path_for(deployment)
    if config.update_baseline:
        if any(lv.failed for lv in tp.levels):
            # A run with failed requests would become the bar every later run is held to.
            return BaselineReport("refused", str(path), config.threshold, ())
        store.save(deployment, current, tp.workload, samples, provenance.to_json())
        return BaselineReport("recorded", str(path), config.threshold, ())
    if base is None:
        return BaselineReport("missing", str(path), config.threshold, ())
    checks = _baseline.compare(current, base, config.threshold, config.baseline_metrics, samples)
    skipped = _baseline.not_compared(current, base, config.baseline_metrics)
    changes = _baseline.workload_differences(base, tp.workload)
    return BaselineReport("compared", str(path), config.threshold, checks, skipped, changes)


def _levels(concurrencies: Iterable[int]) -> str:
    return ", ".join(f"c={c}" for c in concurrencies)


def _not_compared_notes(b: BaselineReport) -> list[str]:
    """One note per reason a level was left out of the comparison."""
    notes = []
    by_reason: dict[str, list[int]] = {}
    for n in b.not_compared:
        by_reason.setdefault(n.reason, []).append(n.concurrency)
    for reason, concs in by_reason.items():
        why = {
            "only in the baseline": "measured only in the baseline",
            "only in this run": "measured only in this run (--update-baseline records it)",
        }.get(reason, reason)
        notes.append(f"baseline: {_levels(concs)} not compared: {why}")
    if b.status == "compared" and not b.checks:
        notes.append("baseline: no level was measured in both this run and the baseline: nothing compared")
    return notes


def _baseline_warnings(
    config: ServeConfig, b: BaselineReport, tp: ThroughputReport, base: _baseline.Baseline | None
) -> list[str]:
    """A comparison (or a baseline being recorded) that the noise of the numbers makes meaningless,
    and a comparison against numbers measured some other way."""
    warnings = []
    if b.workload_changes:
        warnings.append(
            f"the baseline {b.path} was measured differently ({'; '.join(b.workload_changes)}): the comparison "
            "is not like for like; record a new one with --update-baseline, or measure as it did "
            "(--prompt, --max-tokens)"
        )
    if b.status == "recorded":
        judged = list(tp.levels)
        consequence = "the baseline recorded from it is too noisy at this level for later comparisons to mean much"
    elif b.status == "compared":
        compared = {c.concurrency for c in b.checks}
        judged = [lv for lv in tp.levels if lv.concurrency in compared]
        consequence = "the comparison against the baseline is not meaningful at this level"
    else:
        return warnings
    limit = config.threshold * 100
    for lv in judged:
        spread = lv.request_tok_s
        if spread is None:
            continue  # no token counts (non-streaming without usage): nothing was compared on them
        if spread.median_ci_pct is None:
            warnings.append(
                f"c={lv.concurrency}: {spread.n} request, so its noise is unknown: {consequence}; "
                f"use --requests {default_requests(lv.concurrency)} or more"
            )
        elif spread.median_ci_pct > limit:
            # The interval narrows as 1/sqrt(n): the requests that bring it inside the threshold.
            need = math.ceil(spread.n * (spread.median_ci_pct / limit) ** 2) if limit > 0 else None
            more = f"--requests {need} or so" if need else "--requests"
            iqr = f"; IQR {spread.iqr_pct:.1f}%" if spread.iqr_pct is not None else ""
            warnings.append(
                f"c={lv.concurrency}: median per-request tok/s known only to ±{spread.median_ci_pct:.1f}% (95% "
                f"interval over {spread.n} requests{iqr}), wider than the {config.threshold:.0%} threshold: "
                f"{consequence}; more requests narrow it ({more})"
            )
    if base is not None:
        for c in b.checks:
            then = base.levels.get(c.concurrency, {}).get("request_tok_s_ci_pct")
            if c.metric == "output_tok_s" and then is not None and then > limit:
                warnings.append(
                    f"c={c.concurrency}: the baseline's own median was known only to ±{then:.1f}%, wider than the "
                    f"{config.threshold:.0%} threshold: the comparison is not meaningful at this level; re-record "
                    "it with --update-baseline and more --requests"
                )
    return warnings


def run_with_server(
    config: ServeConfig,
    command: str | Sequence[str],
    ready_timeout_s: float = 900.0,
    free_timeout_s: float = 120.0,
    state_dir: Path | None = None,
    progress: Progress | None = None,
) -> ServeReport:
    """`--start`: wait for the old server to be gone, start, run, stop. The settings are checked first."""
    check_config(config)
    say = progress or (lambda _msg: None)
    server = ServerProcess(
        command,
        config.base_url,
        state_dir=state_dir or default_data_dir() / "servers",
        ready_timeout_s=ready_timeout_s,
        free_timeout_s=free_timeout_s,
    )
    say(f"starting {' '.join(server.argv)} (log: {server.log_path})")
    with server:
        say(f"server ready after {server.startup_s:.1f}s")
        return run_validate(config, progress)
