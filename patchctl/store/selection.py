"""Which patches a --patch/--exclude choice takes, checked against the series and its depends_on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from patchctl.core.errors import UsageError
from patchctl.store.series import Patch

# --- choosing patches: --patch / --exclude, checked against the series and its depends_on ---------
# (the choice is kept in the tree's record, tree.bookkeeping.Selection, so that `ensure` keeps applying it)


def unknown_names(series: Sequence[Patch], names: Iterable[str], engine: str) -> None:
    known = [p.name for p in series]
    for name in names:
        if name not in known:
            raise UsageError(
                f"no patch {name!r} in the {engine} series",
                hint=f"the series has: {', '.join(known) or 'no patches'} (`patchctl list {engine}`)",
            )


def dependencies(series: Sequence[Patch], names: Iterable[str]) -> set[str]:
    """names with every patch they depend on, transitively."""
    by_name = {p.name: p for p in series}
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in wanted or name not in by_name:
            continue
        wanted.add(name)
        todo.extend(by_name[name].depends_on)
    return wanted


def dependents(series: Sequence[Patch], names: Iterable[str], among: Iterable[str]) -> dict[str, list[str]]:
    """For each of `among` that depends (transitively) on one of `names`: which of them."""
    out: dict[str, list[str]] = {}
    names = set(names)
    for patch in series:
        if patch.name in among and patch.name not in names:
            hit = sorted(dependencies(series, [patch.name]) & names)
            if hit:
                out[patch.name] = hit
    return out


def select(series: Sequence[Patch], only: Sequence[str] | None, exclude: Sequence[str], engine: str) -> tuple[Patch, ...]:
    """The patches of the series `--patch` (only; None: every patch) and `--exclude` choose, in series
    order. A name the series lacks is exit 2 naming it; `--patch P` brings the patches P depends on;
    excluding a patch that a chosen one depends on is exit 2 naming both."""
    unknown_names(series, [*(only or ()), *exclude], engine)
    chosen = {p.name for p in series} if only is None else dependencies(series, only)
    chosen -= set(exclude)
    needs = dependents(series, exclude, chosen)
    if needs:
        name, deps = next(iter(needs.items()))
        raise UsageError(
            f"{name} depends on {', '.join(deps)}, which --exclude leaves out",
            hint=f"exclude {name} too, or keep {', '.join(deps)}",
        )
    return tuple(p for p in series if p.name in chosen)
