"""First release (or commit) where a patch stops applying, or its smoke checks fail."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl.core import outcomes as O
from patchctl.core.engines import Engine
from patchctl.core.errors import UsageError
from patchctl.patching import evaluate
from patchctl.sources import fetch
from patchctl.store.series import Patch

if TYPE_CHECKING:
    from git import Repo

# point (a version or a commit) -> (good, what was seen there)
Predicate = Callable[[str], tuple[bool, str]]


class BisectStep(NamedTuple):
    point: str
    good: bool
    detail: str


class BisectResult(NamedTuple):
    first_bad: str
    last_good: str
    steps: tuple[BisectStep, ...]


def bisect(points: list[str], is_good: Callable[[str], tuple[bool, str]]) -> BisectResult:
    """points[0] must be good and points[-1] bad; O(log n) evaluations in between."""
    if len(points) < 2:
        raise UsageError("bisect needs at least two points")
    steps = []
    for point, expect in ((points[0], True), (points[-1], False)):
        good, detail = is_good(point)
        steps.append(BisectStep(point, good, detail))
        if good != expect:
            raise UsageError(f"{point} is {'good' if good else 'bad'} ({detail}); expected {'good' if expect else 'bad'}")
    lo, hi = 0, len(points) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        good, detail = is_good(points[mid])
        steps.append(BisectStep(points[mid], good, detail))
        if good:
            lo = mid
        else:
            hi = mid
    return BisectResult(points[hi], points[lo], tuple(steps))


def release_predicate(
    patch: Patch,
    series: tuple[Patch, ...],
    ctx: fetch.SourceContext,
    engine: Engine,
    smoke: Callable[[Version], tuple[bool, str]] | None = None,
) -> Predicate:
    upto = series[: [p.name for p in series].index(patch.name) + 1]

    def is_good(point: str) -> tuple[bool, str]:
        version = Version(point)
        source = fetch.release(engine, version, ctx)
        outcome = evaluate.evaluate(upto, version, source).outcome_of(patch.name)
        if outcome.outcome not in O.SATISFIED:
            return False, f"{outcome.outcome}: {outcome.reason}"
        if smoke is not None and outcome.outcome in O.WRITES:
            ok, why = smoke(version)
            return ok, f"{outcome.outcome}; smoke {why}"
        return True, outcome.outcome

    return is_good


def commit_predicate(patch: Patch, series: tuple[Patch, ...], repo: Repo, engine: Engine, version: Version) -> Predicate:
    from patchctl.sources.git import GitSource

    upto = series[: [p.name for p in series].index(patch.name) + 1]

    def is_good(commit: str) -> tuple[bool, str]:
        source = GitSource(repo, commit, engine.layout_prefix("git"), "repo")
        outcome = evaluate.evaluate(upto, version, source).outcome_of(patch.name)
        return outcome.outcome in O.SATISFIED, outcome.outcome

    return is_good
