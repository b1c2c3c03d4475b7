"""`validate --compare A.json B.json`: two saved reports (validate's `--out` files or `--json`
documents), B judged against A the way a run is judged against its baseline (baseline.compare: the
per-request samples' 95% interval, then the threshold), with no server.

Two reports that measured different things (another model, patch set, engine build, GPU, context
length, prompt or max_tokens) are refused, naming each field that differs, unless the user names the
fields the comparison is about with --allow-different: before and after a patch change is
`--allow-different patch_set`, and every other field must still match. Naming the one variable
under test, rather than one switch that allows any difference, keeps a change of GPU or prompt from
riding along unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.core.errors import UsageError
from patchctl.validate import baseline as _baseline
from patchctl.validate.provenance import IDENTITY, Difference, differences, patch_changes

WORKLOAD = ("prompts", "prompt", "prompt_sha256", "max_tokens", "api", "streamed")
FIELDS = IDENTITY + WORKLOAD
ALL = "all"
MAX_REPORT_BYTES = 64 * 1024 * 1024  # a report is a few hundred kB at most: a larger file is not one


class Saved(NamedTuple):
    path: str
    report: Any  # ServeReport
    facts: dict[str, Any]  # FIELDS, and the patch list


class CompareReport(NamedTuple):
    a: str
    b: str
    a_started_at: str
    b_started_at: str
    threshold: float
    checks: tuple[_baseline.BaselineCheck, ...]
    not_compared: tuple[_baseline.NotCompared, ...]
    differences: tuple[Difference, ...]  # fields that differ and --allow-different allowed
    not_known: tuple[str, ...]  # fields one of the reports does not say: not checked

    @property
    def regressions(self) -> tuple[_baseline.BaselineCheck, ...]:
        return tuple(c for c in self.checks if c.regressed)

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "a_started_at": self.a_started_at,
            "b_started_at": self.b_started_at,
            "threshold": self.threshold,
            "checks": [_check_json(c) for c in self.checks],
            "not_compared": [n._asdict() for n in self.not_compared],
            "differences": [d._asdict() for d in self.differences],
            "not_known": list(self.not_known),
            "regressions": len(self.regressions),
        }


def _check_json(c: _baseline.BaselineCheck) -> dict[str, Any]:
    out = c._asdict()
    out["samples"] = None if c.samples is None else list(c.samples)
    return out


def load(path: Path) -> Saved:
    """A saved report: `--out`'s file, or a `validate --json` document (its `report`). UsageError (exit
    2) for anything else, naming the file."""
    from patchctl.core.yamlio import load_json
    from patchctl.validate.report import ServeReport

    hint = "pass two files that `patchctl validate --out FILE` (or `--json > FILE`) wrote"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_REPORT_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"--compare {path}: {exc.strerror or exc}", hint=hint) from None
    if len(raw) > MAX_REPORT_BYTES:
        raise UsageError(f"--compare {path}: larger than {MAX_REPORT_BYTES // 2**20} MiB, not a validate report", hint=hint)
    try:
        obj = load_json(raw)
        if isinstance(obj, dict) and obj.get("command") == "validate" and "schema" in obj:
            if obj.get("report") is None:
                raise ValueError("the document has no report (the run failed before measuring)")
            obj = obj["report"]
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        report = ServeReport.from_json(obj)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--compare {path} is not a validate report: {exc}", hint=hint) from None
    if report.throughput is None or not report.throughput.levels:
        raise UsageError(f"--compare {path} measured no throughput (--no-throughput): nothing to compare", hint=hint)
    return Saved(str(path), report, _facts(obj))


def _facts(obj: Mapping[str, Any]) -> dict[str, Any]:
    d = obj["deployment"]
    tp = obj.get("throughput") or {}
    prov = obj.get("provenance") or {}
    facts = {"model": d["model"], "patch_set": d["patch_set"], "engine_version": d["engine_version"]}
    facts.update({k: prov.get(k) for k in ("engine_build", "max_model_len", "gpu_name", "patches")})
    facts.update({k: tp.get(k) for k in WORKLOAD})
    return facts


def allowed_fields(values: Sequence[str]) -> frozenset[str]:
    """--allow-different's fields (repeatable, or comma-separated); UsageError naming an unknown one."""
    names = {v.strip() for value in values for v in value.split(",") if v.strip()}
    if ALL in names:
        return frozenset(FIELDS)
    unknown = sorted(names - set(FIELDS))
    if unknown:
        raise UsageError(
            f"--allow-different {', '.join(unknown)}: not a field a report names",
            hint=f"one or more of {', '.join(FIELDS)}, or {ALL}",
        )
    return frozenset(names)


def compare_reports(
    a_path: Path,
    b_path: Path,
    threshold: float = _baseline.DEFAULT_THRESHOLD,
    allow_different: Sequence[str] = (),
    metrics: Sequence[str] = _baseline.DEFAULT_METRICS,
) -> CompareReport:
    """B judged against A. UsageError (exit 2) for a file that is not a report, or for two reports that
    measured different things in a field not allowed to differ."""
    allowed = allowed_fields(allow_different)
    a, b = load(a_path), load(b_path)
    diffs, not_known = differences(a.facts, b.facts, FIELDS)
    refused = [d for d in diffs if d.field not in allowed]
    if refused:
        said = "; ".join(_said(d, a.facts, b.facts) for d in refused)
        fields = ",".join(d.field for d in refused)
        raise UsageError(
            f"{a.path} and {b.path} measured different things: {said}",
            hint=f"to compare them anyway, name what the comparison is about: --allow-different {fields}",
        )
    then = _as_baseline(a.report)
    current = {lv.concurrency: lv.flat() for lv in b.report.throughput.levels}
    samples = {lv.concurrency: lv.samples for lv in b.report.throughput.levels if lv.samples}
    checks = _baseline.compare(current, then, threshold, metrics, samples)
    skipped = _baseline.not_compared(current, then, metrics)
    return CompareReport(a.path, b.path, a.report.started_at, b.report.started_at, threshold, checks, skipped, diffs, not_known)


def _said(d: Difference, a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    if d.field == "patch_set" and (changes := patch_changes(a, b)):
        return f"{d.describe()} (patches {changes})"
    return d.describe()


def _as_baseline(report: Any) -> _baseline.Baseline:
    levels = report.throughput.levels
    return _baseline.Baseline(
        report.deployment,
        report.started_at,
        {lv.concurrency: lv.flat() for lv in levels},
        report.throughput.workload,
        {lv.concurrency: lv.samples for lv in levels if lv.samples} or None,
    )
