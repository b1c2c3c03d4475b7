"""Per-deployment performance baselines and the comparison against them.

A deployment is (model, engine version, patch-set digest): a change to any of
them is a different thing to measure, so it gets its own baseline rather than
being compared against numbers from another setup. One JSON file per deployment
keeps concurrent recorders of different deployments from clobbering each other.

The patch set is what the server runs: the digest of the state record patchctl
keeps for the engine's tree (applied_patch_set), "none" for a pristine engine.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from patchctl.core.atomic import write_atomic
from patchctl.core.errors import UsageError
from patchctl.core.yamlio import load_json

if TYPE_CHECKING:
    from patchctl.tree.bookkeeping import StateRecord

FORMAT = 1
DEFAULT_THRESHOLD = 0.05
# The decode rate beside throughput: a slower decode hidden by a faster prefill still fails.
DEFAULT_METRICS: tuple[str, ...] = ("output_tok_s", "decode_tok_s_p50")

# Which way is better for every metric a level can report (metrics.LevelMetrics.flat).
HIGHER_IS_BETTER = {"output_tok_s", "request_tok_s_p50", "decode_tok_s_p50"}
LOWER_IS_BETTER = {f"{m}_{q}" for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms") for q in ("p50", "p99")}

# The per-request sample each median metric is judged on (metrics.LevelMetrics.samples). output_tok_s is
# one figure per level, with no sample of its own: at a fixed concurrency it moves with each request's
# output tokens over its E2E (request_tok_s), so that sample judges it. Tails (p99) and ITL (a sample of
# gaps, not of requests) have none: they are held to the threshold alone.
SAMPLE_OF = {
    "output_tok_s": "request_tok_s",
    "request_tok_s_p50": "request_tok_s",
    "decode_tok_s_p50": "decode_tok_s",
    "ttft_ms_p50": "ttft_ms",
    "tpot_ms_p50": "tpot_ms",
    "e2e_ms_p50": "e2e_ms",
}
# Why a check was judged on the threshold alone (BaselineCheck.evidence)
NO_BASELINE_SAMPLES = "no samples in the baseline: threshold only"
NO_CURRENT_SAMPLES = "no samples in this run: threshold only"
NO_SAMPLE_METRIC = "a tail or per-gap figure, no per-request sample: threshold only"
TOO_FEW_SAMPLES = "too few samples for a 95% interval: threshold only"
SAMPLED = "samples"


class Deployment(NamedTuple):
    model: str
    engine_version: str
    patch_set: str  # digest of the applied patch set, "none" for the pristine engine, "unknown" when not said

    @property
    def key(self) -> str:
        raw = json.dumps([self.model, self.engine_version, self.patch_set])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


def applied_patch_set(record: StateRecord | None) -> str:
    """Digest of what a tree's state record says is applied: every patch's name and variant in series
    order, and the sha256 of every file the patch set wrote. "none" when nothing is applied."""
    if record is None or not record.patches:
        return "none"
    raw = json.dumps(
        {
            "patches": [[p.name, p.variant] for p in record.patches],
            "files": sorted([f.path, f.patched_sha256] for f in record.files),
        }
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class Baseline(NamedTuple):
    deployment: Deployment
    recorded_at: str
    levels: Mapping[int, Mapping[str, float]]  # concurrency -> flat metrics
    # What was measured: {prompt, prompt_sha256, max_tokens, api, streamed}. None in baselines
    # written before it was recorded (their prompt was the essay, then the default).
    workload: Mapping[str, Any] | None = None
    # Per level, per-request samples (metric -> values, at most statistics.MAX_SAMPLES each): what the
    # statistics compare. None in baselines written before they were kept: those compare on the threshold.
    samples: Mapping[int, Mapping[str, Sequence[float]]] | None = None
    # What was measured, beyond the key (provenance.Provenance.to_json); None in older baselines.
    provenance: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": FORMAT,
            "deployment": self.deployment._asdict(),
            "recorded_at": self.recorded_at,
            "levels": {str(c): dict(m) for c, m in sorted(self.levels.items())},
        }
        if self.workload is not None:
            out["workload"] = dict(self.workload)
        if self.samples is not None:
            out["samples"] = {str(c): {k: list(v) for k, v in m.items()} for c, m in sorted(self.samples.items())}
        if self.provenance is not None:
            out["provenance"] = dict(self.provenance)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Baseline:
        if obj.get("format") != FORMAT:
            raise ValueError(f"baseline format {obj.get('format')!r}, expected {FORMAT}")
        workload = obj.get("workload")
        if workload is not None and not isinstance(workload, dict):
            raise ValueError(f"workload is {type(workload).__name__}, not an object")
        samples = obj.get("samples")
        provenance = obj.get("provenance")
        if provenance is not None and not isinstance(provenance, dict):
            raise ValueError(f"provenance is {type(provenance).__name__}, not an object")
        return cls(
            Deployment(**obj["deployment"]),
            obj["recorded_at"],
            {int(c): {k: float(v) for k, v in m.items()} for c, m in obj["levels"].items()},
            workload,
            None
            if samples is None
            else {int(c): {k: tuple(float(x) for x in v) for k, v in m.items()} for c, m in samples.items()},
            provenance,
        )


class BaselineStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path_for(self, deployment: Deployment) -> Path:
        return self.root / f"{deployment.key}.json"

    def load(self, deployment: Deployment) -> Baseline | None:
        """The deployment's baseline, None when it has none; a damaged file is bad input (exit 2)."""
        path = self.path_for(deployment)
        if not path.exists():
            return None
        hint = "delete it, or record a new baseline with --update-baseline"
        try:
            baseline = Baseline.from_json(load_json(path.read_text()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"{path} is not a baseline patchctl wrote: {exc!r}", hint=hint) from None
        if baseline.deployment != deployment:
            raise UsageError(f"{path} holds {baseline.deployment}, not {deployment}", hint=hint)
        return baseline

    def save(
        self,
        deployment: Deployment,
        levels: Mapping[int, Mapping[str, float]],
        workload: Mapping[str, Any] | None = None,
        samples: Mapping[int, Mapping[str, Sequence[float]]] | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> Path:
        now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        baseline = Baseline(deployment, now, levels, workload, samples, provenance)
        path = self.path_for(deployment)
        write_atomic(path, (json.dumps(baseline.to_json(), indent=2, sort_keys=True) + "\n").encode())
        return path


class BaselineCheck(NamedTuple):
    concurrency: int
    metric: str
    baseline: float
    current: float | None  # None only in reports written before not_compared existed
    change: float | None  # relative, signed: +0.02 is 2% higher than baseline
    regressed: bool  # worse beyond the threshold, and (with samples) significantly so
    # Added with the statistics (None in reports written before them, judged on the threshold alone):
    # `samples` when the per-request samples of both runs judged it, else why the threshold alone did.
    evidence: str | None = None
    # The 95% interval of the shift in the per-request medians, as a fraction of the baseline's median
    # (statistics.shift); None without samples on both sides.
    ci_low: float | None = None
    ci_high: float | None = None
    significant: bool | None = None  # the interval excludes no change; None without samples
    samples: tuple[int, int] | None = None  # how many per-request samples: (baseline, this run)

    def describe(self, threshold: float) -> str:
        if self.current is None:
            return f"c={self.concurrency} {self.metric}: baseline {self.baseline:.4g}, not measured now"
        head = f"c={self.concurrency} {self.metric}: {self.current:.4g} vs baseline {self.baseline:.4g} ({self.change:+.1%}"
        if self.evidence == SAMPLED and self.ci_low is not None and self.ci_high is not None:
            n = f", {self.samples[0]}/{self.samples[1]} requests" if self.samples else ""
            if not self.significant:
                bound = max(abs(self.ci_low), abs(self.ci_high))
                return f"{head}{n}): no significant change (±{bound:.1%} at 95%) ok"
            interval = f"95% interval {self.ci_low:+.1%} to {self.ci_high:+.1%}{n}"
            if self.regressed:
                return f"{head}, {interval}): significant and beyond the {threshold:.0%} threshold REGRESSED"
            better = (self.ci_low > 0) == (self.metric in HIGHER_IS_BETTER)
            if better:
                return f"{head}, {interval}): significantly better ok"
            return f"{head}, {interval}): significant but within the {threshold:.0%} threshold ok"
        verdict = "REGRESSED" if self.regressed else "ok"
        why = f"; {self.evidence}" if self.evidence else ""
        return f"{head}, threshold {threshold:.0%}) {verdict}{why}"


Samples = Mapping[int, Mapping[str, Sequence[float]]]


def compare(
    current: Mapping[int, Mapping[str, float]],
    baseline: Baseline,
    threshold: float = DEFAULT_THRESHOLD,
    metrics: Sequence[str] = DEFAULT_METRICS,
    current_samples: Samples | None = None,
) -> tuple[BaselineCheck, ...]:
    """Every (level, metric) measured both in the baseline and now is reported, within threshold or
    not; the rest is not_compared's.

    A worsening beyond `threshold` (relative) regresses only when it is also significant: when the
    per-request samples of both runs give a 95% interval of the shift that lies wholly on the worse
    side (statistics.shift). Where either run has no samples for the metric (a baseline recorded before
    they were kept, a tail figure), the threshold alone decides, and the check says so. Better numbers
    never regress.
    """
    checks = []
    for conc in sorted(set(baseline.levels) & set(current)):
        for metric in metrics:
            if metric not in HIGHER_IS_BETTER | LOWER_IS_BETTER:
                raise ValueError(f"unknown baseline metric {metric!r}")
            base = baseline.levels[conc].get(metric)
            now = current[conc].get(metric)
            if base is None or now is None:
                continue
            change = (now - base) / base if base else 0.0
            higher = metric in HIGHER_IS_BETTER
            beyond = change < -threshold if higher else change > threshold
            checks.append(_judged(conc, metric, base, now, change, beyond, higher, baseline.samples, current_samples))
    return tuple(checks)


def _judged(
    conc: int,
    metric: str,
    base: float,
    now: float,
    change: float,
    beyond: bool,
    higher: bool,
    then_samples: Samples | None,
    now_samples: Samples | None,
) -> BaselineCheck:
    from patchctl.validate.statistics import shift

    key = SAMPLE_OF.get(metric)
    then = (then_samples or {}).get(conc, {}).get(key or "")
    current = (now_samples or {}).get(conc, {}).get(key or "")
    if key is None:
        why = NO_SAMPLE_METRIC
    elif not then:
        why = NO_BASELINE_SAMPLES
    elif not current:
        why = NO_CURRENT_SAMPLES
    else:
        sh = shift(then, current)
        low, high = (sh.relative(sh.low), sh.relative(sh.high)) if sh is not None else (None, None)
        if sh is not None and low is not None and high is not None:
            worse = high < 0 if higher else low > 0
            counts = (sh.n_baseline, sh.n_current)
            return BaselineCheck(conc, metric, base, now, change, beyond and worse, SAMPLED, low, high, sh.significant, counts)
        why = TOO_FEW_SAMPLES
    return BaselineCheck(conc, metric, base, now, change, beyond, why)


class NotCompared(NamedTuple):
    concurrency: int
    reason: str  # "only in the baseline", "only in this run", "<metric> not measured in this run", ...


def not_compared(
    current: Mapping[int, Mapping[str, float]],
    baseline: Baseline,
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> tuple[NotCompared, ...]:
    """The levels compare() leaves out, and why: a level one run did not measure is no evidence
    of a regression (a --concurrency 1 run against a 1,8,32 baseline), nor of its absence."""
    out = []
    for conc in sorted(set(baseline.levels) | set(current)):
        if conc not in current:
            out.append(NotCompared(conc, "only in the baseline"))
        elif conc not in baseline.levels:
            out.append(NotCompared(conc, "only in this run"))
        else:
            for metric in metrics:
                if metric not in baseline.levels[conc]:
                    out.append(NotCompared(conc, f"{metric} not in the baseline"))
                elif metric not in current[conc]:
                    out.append(NotCompared(conc, f"{metric} not measured in this run"))
    return tuple(out)


def workload_differences(baseline: Baseline, workload: Mapping[str, Any]) -> tuple[str, ...]:
    """How this run's workload differs from the baseline's: "prompt essay -> counting", ...
    A baseline without one predates its recording (its prompt was the essay)."""
    if baseline.workload is None:
        return ("the baseline does not say what it measured (recorded by an older patchctl, whose default prompt was the essay)",)
    diffs = []
    for key in ("prompt", "max_tokens", "api", "streamed"):
        then, now = baseline.workload.get(key), workload.get(key)
        if then is not None and then != now:
            diffs.append(f"{key} {then} -> {now}")
    # Baselines recorded before prompts were made unique per request sent the same text every time.
    then_prompts, now_prompts = baseline.workload.get("prompts") or "shared", workload.get("prompts") or "shared"
    if then_prompts != now_prompts:
        diffs.append(f"prompts {then_prompts} -> {now_prompts} (a prefix cache serves shared ones)")
    if (
        not diffs
        and baseline.workload.get("prompt_sha256")
        and baseline.workload.get("prompt_sha256") != workload.get("prompt_sha256")
    ):
        diffs.append(f"the text of prompt {workload.get('prompt')} changed")
    return tuple(diffs)
