"""The one service under `apply`, `ensure`, `revert` and `status` (and their image path): each takes
the target's lock, recovers an interrupted run, reads the tree's record ONCE and decides there which
stores and which patches apply; it returns typed results, which the commands turn into documents.

`ensure` is a mode of apply (Mode.ENSURE): the same decisions under stricter rules — stop at "intact,
from this very series", refuse a tree changed by hand, refuse a recorded patch or store that is gone.
The record is the contract for both: with no --store, the recorded stores; with no --patch/--exclude,
the recorded choice; and a patch that leaves the tree is always named (ApplyResult.removed)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from patchctl.core import outcomes as O
from patchctl.core.errors import EnvironmentProblem, PatchFailed, RecordUnmet, UsageError
from patchctl.patching.options import Options
from patchctl.tree import stores as S
from patchctl.tree.apply import Plan, apply_locked, rebuild_locked
from patchctl.tree.bookkeeping import Selection
from patchctl.tree.revert import repair_from_release
from patchctl.tree.revert import revert as revert_tree
from patchctl.tree.status import checked_status
from patchctl.tree.status import status as read_status

if TYPE_CHECKING:
    from collections.abc import Callable

    from patchctl.patching.evaluate import SeriesResult
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.spec import EngineRef
    from patchctl.store.layered import Store
    from patchctl.store.series import Patch
    from patchctl.tree.bookkeeping import BuildRecord, StateRecord
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.status import TargetStatus
    from patchctl.tree.target import Target


class Mode(enum.Enum):
    APPLY = "apply"
    ENSURE = "ensure"  # what systemd runs before every start: the record's set, or a refusal


@dataclass(frozen=True)
class ApplyRequest:
    stores: S.Stores
    options: Options = Options(strict=True)
    ctx: SourceContext | None = None  # where a variant's base release comes from (three-way merges)
    mode: Mode = Mode.APPLY
    selection: Selection | None = None  # --patch/--exclude; None: the record's choice, else every patch
    keep_going: bool = False
    dry_run: bool = False
    force: bool = False
    wait: float = 0.0


@dataclass(frozen=True)
class Failure:
    """Why nothing was written: patches that do not apply, or a tree changed by hand (state)."""

    kind: str
    message: str
    hint: str | None
    state: str | None = None


@dataclass(frozen=True)
class ApplyResult:
    target: Target
    state_before: str = "not-applied"
    result: SeriesResult | None = None  # None: nothing evaluated (ensure on an intact tree, or a drift)
    written: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # patches the record listed as applied that this run takes out
    recovered: bool = False
    note: str = ""
    record: StateRecord | None = None  # what is applied now
    warnings: tuple[str, ...] = ()
    unlocked: str | None = None  # ensure on a tree nothing may be written into: why, read without the lock
    failure: Failure | None = None

    @property
    def ok(self) -> bool:
        """Nothing refused and no patch in conflict (--keep-going writes the others, and still fails)."""
        return self.failure is None and (self.result is None or all(o.outcome != O.CONFLICT for o in self.result.outcomes))


@dataclass(frozen=True)
class ApplyRun:
    """apply/ensure on an engine: its tree first, then every distribution its code moved to
    (vLLM's GGUF support → vllm-gguf-plugin) that is installed beside it."""

    results: tuple[ApplyResult, ...]
    not_installed: tuple[str, ...] = ()  # distributions code moved to that the environment lacks
    build: BuildRecord | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


def apply(ref: EngineRef, where: TargetSpec, request: ApplyRequest, *, install: bool = False, no_deps: bool = False) -> ApplyRun:
    from patchctl.core.engines import get_engine
    from patchctl.sources import installed as inst
    from patchctl.tree import find
    from patchctl.tree.target import Target

    if no_deps and not install:
        raise UsageError("--no-deps only means something with --install")
    target = find.find_target(ref, where, install=install, ctx=request.ctx, no_deps=no_deps)
    python = find.env_python(where)
    results = [apply_tree(target, request, python=python)]
    missing: list[str] = []
    if python is not None:
        for move in target.engine.moves_at(target.version):
            other = inst.find_installed(get_engine(move.engine), where.python)
            if other is None:
                missing.append(move.engine)
                continue
            tree = Target(other.engine, other.root, other.version, f"installed in {other.python}")
            results.append(apply_tree(tree, request, python=python))
    return ApplyRun(tuple(results), tuple(missing), target.build)


def apply_tree(target: Target, request: ApplyRequest, *, python: str | None = None) -> ApplyResult:
    """One tree. python: the environment's interpreter, whose companion packages are checked."""
    ensure = request.mode is Mode.ENSURE
    name = target.engine.name
    st = target.state()
    with st.locked(request.wait, read_only_ok=ensure) as unlocked:
        recovered = st.recover() if unlocked is None else False
        current = read_status(target)  # the record, read once: every decision below is made on it
        record = current.record
        # The record's stores unless the command line named others (ensure: always, the named in front).
        keep = ensure or not request.stores.named
        decided = S.decide(record, request.stores, keep_record=keep, refuse_gone=ensure, root=str(target.root), engine=name)
        store = decided.store
        fingerprint = S.fingerprint(store, name)
        series = _series(store, name)
        if unlocked is not None:
            note = _ensure_read_only(target, current, series, unlocked, fingerprint, request.selection)
            return ApplyResult(target, "intact", note=note, record=record, unlocked=unlocked)
        if request.selection is not None:
            chosen = request.selection
        elif record is not None and keep:
            chosen = record.selection
        else:
            chosen = Selection()  # stores named without a choice: every patch of them
        if ensure and record is not None and request.selection is not None and request.selection != record.selection:
            raise UsageError(
                f"the tree's record chose {_describe(record.selection)}; this asks for {_describe(request.selection)}",
                hint=f"changing the set is an explicit `patchctl apply {name}` with --patch/--exclude",
            )
        if ensure and current.state == "intact" and record is not None and record.store_fingerprint == fingerprint:
            return ApplyResult(target, "intact", note="patches intact: nothing to do", record=record, recovered=recovered)
        if current.state == "modified" and (ensure or not request.force):
            return ApplyResult(target, current.state, recovered=recovered, failure=_drifted(current))
        patches = series()
        if ensure and record is not None:
            _require_recorded(target, record, patches)
        from patchctl.store.selection import select

        picked = select(patches, chosen.patches, chosen.exclude, name)
        leaving = _leaving(target, current, picked, patches, decided.gone, request.stores.named)
        plan = Plan(chosen, S.refs(store), fingerprint)
        base_files = None
        if request.ctx is not None:
            from patchctl.sources.fetch import base_files_for

            base_files = base_files_for(target.engine, request.ctx)
        work = rebuild_locked if current.state == "intact" and leaving else apply_locked
        rep = work(
            target,
            st,
            current,
            picked,
            plan,
            options=request.options,
            base_files=base_files,
            keep_going=request.keep_going,
            dry_run=request.dry_run,
            recovered=recovered,
        )
    from patchctl.tree.find import requirement_warnings

    # Companion packages (gguf>=0.18, ...) can only be checked in an environment, not in a bare tree.
    warnings = requirement_warnings([p for p in patches if p.in_range(target.version)], python)
    if rep.failure is not None:
        message, hint = rep.failure
        return ApplyResult(
            target, current.state, rep.result, recovered=recovered, failure=Failure(PatchFailed.kind, message, hint)
        )
    removed = tuple(leaving)
    warnings += [f"{n} leaves {target.root}: {why}" for n, why in leaving.items()]
    return ApplyResult(
        target, rep.state_before, rep.result, rep.written, removed, rep.recovered, rep.note, rep.record, tuple(warnings)
    )


def _series(store: Store, engine: str) -> Callable[[], tuple[Patch, ...]]:
    """The store's series, parsed when first asked for (ensure on an intact tree never parses it)."""
    parsed: list[tuple[Patch, ...]] = []

    def patches() -> tuple[Patch, ...]:
        if not parsed:
            parsed.append(store.series(engine).patches)
        return parsed[0]

    return patches


def _leaving(
    target: Target,
    current: TargetStatus,
    picked: tuple[Patch, ...],
    series: tuple[Patch, ...],
    gone: tuple[tuple[str, str], ...],
    named: bool,
) -> dict[str, str]:
    """The patches the record lists as written that this run takes out, with why: only where the run
    replaces the record's set (an intact tree rebuilt, a wiped tree re-applied); a tree taken over with
    --force keeps its record's patches."""
    record = current.record
    if record is None or current.state not in ("intact", "wiped", "version-changed"):
        return {}
    chosen = {p.name for p in picked}
    in_series = {p.name for p in series}
    gone_paths = {path for path, _ in gone}
    out: dict[str, str] = {}
    for p in record.patches:
        if p.outcome not in O.WRITES or p.name in chosen:
            continue
        store = p.store.path if p.store else None
        if store in gone_paths:
            out[p.name] = f"the store it was applied from, {store}, is gone"
        elif p.name in in_series:
            out[p.name] = "this run's choice of patches (--patch/--exclude, or the record's) leaves it out"
        elif named:
            out[p.name] = f"the stores named here do not have it (it was applied from {store or 'another store'})"
        else:
            out[p.name] = f"{store or 'its store'} no longer has it"
    return out


def _drifted(current: TargetStatus) -> Failure:
    return Failure(
        PatchFailed.kind,
        current.message,
        "inspect the files; `patchctl revert --force` restores them, `patchctl apply --force` takes them as they are",
        current.state,
    )


def _describe(selection: Selection) -> str:
    if selection.everything:
        return "every patch of the series"
    text = "only " + ", ".join(selection.patches) if selection.patches is not None else "every patch"
    return text + (f" except {', '.join(selection.exclude)}" if selection.exclude else "")


def _ensure_read_only(
    target: Target,
    current: TargetStatus,
    patches: Callable[[], tuple[Patch, ...]],
    unlocked: str,
    fingerprint: str,
    selection: Selection | None,
) -> str:
    """ensure on a tree nothing may be written into (a read-only mount, a service user) and no
    interrupted write in it (locked() checked): exit 0 without writing when the tree is intact by the
    record's fingerprints — the recorded patches, from stores that give the same variants (sha256) and
    the same choice —, else exit 3 with what needs writing and how to let it be written."""
    from patchctl.store.selection import select
    from patchctl.store.series import choose_variant, variant_sha256

    record = current.record
    fix = (
        f"make the tree writable for this run (the owner of the environment, a read-write mount), then "
        f"`patchctl ensure {target.engine.name}`"
    )
    why = f"cannot lock {target.state().dir}: {unlocked}"
    if current.state != "intact" or record is None:
        raise EnvironmentProblem(f"{why}, and the tree needs writing: {current.message}", hint=fix)
    if selection is not None and selection != record.selection:
        raise EnvironmentProblem(f"{why}, and this asks for another choice of patches than the record's", hint=fix)
    note = f"patches intact; read without the lock ({why}): nothing may be written, and nothing needed writing"
    if record.store_fingerprint is not None and record.store_fingerprint == fingerprint:
        return note
    series = patches()
    _require_recorded(target, record, series)
    picked = {p.name: p for p in select(series, record.selection.patches, record.selection.exclude, target.engine.name)}
    recorded = {p.name: p for p in record.patches}
    for name, patch in picked.items():
        choice = choose_variant(patch, target.version)
        had = recorded.get(name)
        variant = None if choice.variant is None else choice.variant.filename
        if had is None or had.variant != variant or (had.sha256 is not None and had.sha256 != variant_sha256(patch, variant)):
            raise EnvironmentProblem(
                f"{why}, and {name} in the store differs from what the record says was applied: the tree needs writing", hint=fix
            )
    return note


def _require_recorded(target: Target, record: StateRecord, series: tuple[Patch, ...]) -> None:
    """Every patch the record lists as written (or found applied) must still be in the series."""
    names = {p.name for p in series}
    gone = [p for p in record.patches if p.outcome in O.ON_TREE and p.name not in names]
    if gone:
        p = gone[0]
        where = (
            f"the store {p.store.path} ({p.store.kind})"
            if p.store
            else "a store the record does not name (recorded by `new` without --store)"
        )
        raise RecordUnmet(
            f"{', '.join(g.name for g in gone)} {'is' if len(gone) == 1 else 'are'} recorded as applied to "
            f"{target.root} from {where}, which no longer has {'it' if len(gone) == 1 else 'them'}: ensure does "
            f"not start the engine without a patch the record lists",
            hint=f"put the patch back into its store, or change the set explicitly: `patchctl apply "
            f"{target.engine.name} --exclude {gone[0].name}` (or `patchctl revert {target.engine.name} --patch "
            f"{gone[0].name}`)",
        )


# --- revert and status ------------------------------------------------------------------------


@dataclass(frozen=True)
class RevertResult:
    target: Target
    restored: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    recovered: bool = False
    note: str = ""
    reverted: tuple[str, ...] = ()  # revert --patch: the patches taken out
    record: StateRecord | None = None  # revert --patch: what is still applied


def revert(target: Target, *, force: bool = False, wait: float = 0.0) -> RevertResult:
    rep = revert_tree(target, force=force, wait=wait)
    return RevertResult(target, rep.restored, rep.skipped, rep.recovered, rep.note)


def revert_patches(
    target: Target, names: tuple[str, ...], stores: S.Stores, ctx: SourceContext | None, *, wait: float = 0.0
) -> RevertResult:
    """`revert --patch P`: P taken out of an intact tree, the other applied patches left applied (their
    files computed again from the pristine bytes), from the stores the record names, and the record's
    choice updated so `ensure` keeps P out. A patch still applied that depends on P is refused (exit 2)
    unless it is named too."""
    from patchctl.store.selection import dependents, unknown_names

    names = tuple(dict.fromkeys(names))
    st = target.state()
    with st.locked(wait):
        recovered = st.recover()
        current = read_status(target)
        record = current.record
        if record is None:
            raise UsageError(f"nothing to revert: no patches applied to {target.engine.name} at {target.root}")
        store = S.decide(
            record, stores, keep_record=True, refuse_gone=True, root=str(target.root), engine=target.engine.name
        ).store
        if current.state != "intact":
            raise PatchFailed(
                f"{current.message}; `revert --patch` takes one patch out of an intact tree only",
                hint=f"`patchctl ensure {target.engine.name}` first, or `patchctl revert {target.engine.name}` for every patch",
            )
        applied = [p.name for p in record.patches if p.outcome in O.ON_TREE]
        series = store.series(target.engine.name).patches
        unknown_names(series, names, target.engine.name)
        not_applied = [n for n in names if n not in applied]
        if not_applied:
            raise UsageError(
                f"{', '.join(not_applied)} {'is' if len(not_applied) == 1 else 'are'} not applied to "
                f"{target.root} (applied: {', '.join(applied) or 'none'})"
            )
        needs = dependents(series, names, applied)
        if needs:
            name, deps = next(iter(needs.items()))
            raise UsageError(
                f"{name} is applied and depends on {', '.join(deps)}: refusing to take {', '.join(deps)} out alone",
                hint=f"name it too: `patchctl revert {target.engine.name} "
                + " ".join(f"--patch {n}" for n in [*names, *needs])
                + "`",
            )
        keep = [p for p in series if p.name in applied and p.name not in names]
        old = record.selection
        selection = (
            old._replace(patches=tuple(n for n in old.patches if n not in names))
            if old.patches is not None
            else old._replace(exclude=tuple(dict.fromkeys([*old.exclude, *names])))
        )
        plan = Plan(selection, record.stores, record.store_fingerprint)
        base_files = None
        if ctx is not None:
            from patchctl.sources.fetch import base_files_for

            base_files = base_files_for(target.engine, ctx)
        rep = rebuild_locked(
            target,
            st,
            current,
            tuple(keep),
            plan,
            options=Options(),
            base_files=base_files,
            keep_going=False,
            dry_run=False,
            recovered=recovered,
        )
    if rep.failure is not None:  # the patches left do not apply without it: nothing was written
        message, hint = rep.failure
        raise PatchFailed(message, hint=hint)
    return RevertResult(target, rep.written, (), rep.recovered, rep.note, names, rep.record)


def revert_from_release(target: Target, store: Store, ctx: SourceContext, *, wait: float = 0.0) -> RevertResult:
    """The way out of a damaged record or journal: no guess at what patchctl did. Every file the series
    can touch at this version, and every file the dist-info RECORD says differs, gets the release's
    own bytes (read from its artifact, checked against the wheel's RECORD). The variants are read as
    check and apply read them: pinned, and refused when they name a file outside the engine's packages
    (tree.target.check_paths refuses it again before anything is written)."""
    from patchctl.sources import fetch
    from patchctl.tree.edits import record_mismatches

    # Changed or missing files RECORD hashes (not files it does not list: the release has no bytes for them).
    paths = set(_series_paths(store, target)) | {e.path for e in record_mismatches(target)}
    release = fetch.release(target.engine, target.version, ctx)
    release.prefetch(sorted(paths))
    rep = repair_from_release(target, release, sorted(paths), wait=wait)
    return RevertResult(target, rep.restored, rep.skipped, rep.recovered, rep.note)


def _series_paths(store: Store, target: Target) -> list[str]:
    from patchctl.patching.evaluate import load_variant, outside_package
    from patchctl.store.series import choose_variant

    paths: list[str] = []
    for patch in store.series(target.engine.name).patches:
        choice = choose_variant(patch, target.version)
        if choice.variant is not None:
            parsed = load_variant(choice.variant, allow_modified=False)
            outside_package(patch, choice.variant, parsed)
            paths.extend(parsed.paths)
    return paths


@dataclass(frozen=True)
class StatusResult:
    target: Target
    status: TargetStatus
    recovered: bool = False
    unlocked: str | None = None  # read without the lock: why it could not be taken
    unmanaged: tuple[str, ...] = ()  # hand edits no applied patch wrote (tree.edits.unmanaged)
    warnings: tuple[str, ...] = ()


def status(target: Target, *, wait: float = 30.0) -> StatusResult:
    """The tree's state under the lock, and its hand edits: .py files of the engine's packages that
    differ from the dist-info RECORD and that no applied patch wrote. RECORD only (no network; a
    tree without one says nothing), and never a reason to change the state: an intact patch set with
    a hand edit beside it is still intact."""
    from patchctl.tree.edits import unmanaged

    current, recovered, unlocked = checked_status(target, wait)
    warnings = []
    if unlocked is not None:
        warnings.append(
            f"read without the lock: {target.state().dir} cannot be written ({unlocked}), and no "
            f"interrupted write is there to undo"
        )
    try:
        edits = tuple(unmanaged(target))
    except OSError as exc:
        edits = ()
        warnings.append(f"could not look for hand edits in {target.root}: {exc}")
    return StatusResult(target, current, recovered, unlocked, edits, tuple(warnings))
