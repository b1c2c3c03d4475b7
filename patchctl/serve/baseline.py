"""Per-deployment performance baselines and the comparison against them.

A deployment is (model, engine version, patch-set digest): a change to any of
them is a different thing to measure, so it gets its own baseline rather than
being compared against numbers from another setup. One JSON file per deployment
keeps concurrent recorders of different deployments from clobbering each other.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence

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
    patch_set: str  # digest of the applied patch set, "none" for the pristine engine

    @property
    def key(self) -> str:
        raw = json.dumps([self.model, self.engine_version, self.patch_set])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


def patch_set_digest(files: Iterable[Path]) -> str:
    """Digest of patch files' bytes, order-sensitive (the series order matters)."""
    h = hashlib.sha256()
    n = 0
    for path in files:
        data = Path(path).read_bytes()
        h.update(str(len(data)).encode() + b"\0" + data)
        n += 1
    return h.hexdigest()[:16] if n else "none"


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
    def from_json(cls, obj: Mapping[str, Any]) -> "Baseline":
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

    def load(self, deployment: Deployment) -> Optional[Baseline]:
        path = self.path_for(deployment)
        if not path.exists():
            return None
        baseline = Baseline.from_json(json.loads(path.read_text()))
        if baseline.deployment != deployment:
            raise ValueError(f"{path} holds {baseline.deployment}, not {deployment}")
        return baseline

    def save(self, deployment: Deployment, levels: Mapping[int, Mapping[str, float]]) -> Path:
        baseline = Baseline(
            deployment, _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), levels
        )
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(deployment)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(baseline.to_json(), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        return path


class BaselineCheck(NamedTuple):
    concurrency: int
    metric: str
    baseline: float
    current: Optional[float]  # None: measured in the baseline, not measurable now
    change: Optional[float]  # relative, signed: +0.02 is 2% higher than baseline
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
