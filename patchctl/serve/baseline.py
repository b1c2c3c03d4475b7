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

from patchctl.atomic import write_atomic
from patchctl.errors import UsageError

if TYPE_CHECKING:
    from patchctl.target.journal import StateRecord

FORMAT = 1
DEFAULT_THRESHOLD = 0.05
DEFAULT_METRICS: tuple[str, ...] = ("output_tok_s",)

# Which way is better for every metric a level can report (metrics.LevelMetrics.flat).
HIGHER_IS_BETTER = {"output_tok_s"}
LOWER_IS_BETTER = {
    f"{m}_{q}" for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms") for q in ("p50", "p99")
}


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
    raw = json.dumps({
        "patches": [[p.name, p.variant] for p in record.patches],
        "files": sorted([f.path, f.patched_sha256] for f in record.files),
    })
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class Baseline(NamedTuple):
    deployment: Deployment
    recorded_at: str
    levels: Mapping[int, Mapping[str, float]]  # concurrency -> flat metrics

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "deployment": self.deployment._asdict(),
            "recorded_at": self.recorded_at,
            "levels": {str(c): dict(m) for c, m in sorted(self.levels.items())},
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Baseline:
        if obj.get("format") != FORMAT:
            raise ValueError(f"baseline format {obj.get('format')!r}, expected {FORMAT}")
        return cls(
            Deployment(**obj["deployment"]),
            obj["recorded_at"],
            {int(c): {k: float(v) for k, v in m.items()} for c, m in obj["levels"].items()},
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
            baseline = Baseline.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"{path} is not a baseline patchctl wrote: {exc!r}", hint=hint) from None
        if baseline.deployment != deployment:
            raise UsageError(f"{path} holds {baseline.deployment}, not {deployment}", hint=hint)
        return baseline

    def save(self, deployment: Deployment, levels: Mapping[int, Mapping[str, float]]) -> Path:
        baseline = Baseline(
            deployment, _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), levels
        )
        path = self.path_for(deployment)
        write_atomic(path, (json.dumps(baseline.to_json(), indent=2, sort_keys=True) + "\n").encode())
        return path


class BaselineCheck(NamedTuple):
    concurrency: int
    metric: str
    baseline: float
    current: float | None  # None: measured in the baseline, not measurable now
    change: float | None  # relative, signed: +0.02 is 2% higher than baseline
    regressed: bool

    def describe(self, threshold: float) -> str:
        if self.current is None:
            return f"c={self.concurrency} {self.metric}: baseline {self.baseline:.4g}, not measured now"
        verdict = "REGRESSED" if self.regressed else "ok"
        return (
            f"c={self.concurrency} {self.metric}: {self.current:.4g} vs baseline {self.baseline:.4g} "
            f"({self.change:+.1%}, threshold {threshold:.0%}) {verdict}"
        )


def compare(
    current: Mapping[int, Mapping[str, float]],
    baseline: Baseline,
    threshold: float = DEFAULT_THRESHOLD,
    metrics: Sequence[str] = DEFAULT_METRICS,
) -> tuple[BaselineCheck, ...]:
    """Every (level, metric) the baseline has is reported, within threshold or not.

    A worsening beyond `threshold` (relative) regresses; better numbers never do.
    """
    checks = []
    for conc in sorted(baseline.levels):
        for metric in metrics:
            if metric not in baseline.levels[conc]:
                continue
            base = baseline.levels[conc][metric]
            now = current.get(conc, {}).get(metric)
            if now is None:
                checks.append(BaselineCheck(conc, metric, base, None, None, True))
                continue
            change = (now - base) / base if base else 0.0
            if metric in HIGHER_IS_BETTER:
                regressed = change < -threshold
            elif metric in LOWER_IS_BETTER:
                regressed = change > threshold
            else:
                raise ValueError(f"unknown baseline metric {metric!r}")
            checks.append(BaselineCheck(conc, metric, base, now, change, regressed))
    return tuple(checks)
