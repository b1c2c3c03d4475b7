"""Patching a tree all or nothing. Under its lock (tree.service takes it and recovers an interrupted
run first): the series evaluated on the tree's files (apply_locked) or on the pristine bytes the
record keeps when the set of patches shrinks (rebuild_locked), then one journaled write of the
files and the new record."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from patchctl.core import outcomes as O
from patchctl.core.errors import UsageError
from patchctl.core.nofollow import lstat_beneath, read_beneath
from patchctl.tree.bookkeeping import (
    BuildRecord,
    Change,
    FileRecord,
    PatchRecord,
    Selection,
    StateRecord,
    StoreRef,
    TargetState,
    sha256,
)
from patchctl.tree.status import TargetStatus
from patchctl.tree.target import Target, check_paths, check_writable

if TYPE_CHECKING:
    # The apply engine (the diff reader, the store, packaging.requirements under it) is imported by
    # the functions that evaluate only: status and revert read the state record and hash files.
    from patchctl.patching.evaluate import BaseFiles, SeriesResult
    from patchctl.patching.options import Options
    from patchctl.sources.files import Provenance
    from patchctl.store.series import Patch


class ApplyReport(NamedTuple):
    result: SeriesResult | None  # None: ensure found the record current and evaluated nothing
    written: tuple[str, ...]
    recovered: bool
    note: str
    state_before: str = "not-applied"
    record: StateRecord | None = None  # what is applied now
    failure: tuple[str, str] | None = None  # patches that do not apply (message, hint): nothing was written


class Plan(NamedTuple):
    """What a write records besides the files: the choice, the stores, the store fingerprint."""

    selection: Selection
    stores: tuple[StoreRef, ...]
    fingerprint: str | None


def _origins(picked: tuple[Patch, ...], result: SeriesResult) -> dict[str, tuple[StoreRef, str | None]]:
    """name -> (the store the patch came from, the sha256 of the variant applied)."""
    from patchctl.store.layered import store_kind
    from patchctl.store.series import variant_sha256

    by_name = {p.name: p for p in picked}
    out: dict[str, tuple[StoreRef, str | None]] = {}
    for o in result.outcomes:
        patch = by_name.get(o.name)
        if patch is not None:
            root = patch.directory.parent.parent
            out[o.name] = (StoreRef(str(root), store_kind(root)), variant_sha256(patch, o.variant))
    return out


def apply_locked(
    target: Target,
    st: TargetState,
    current: TargetStatus,
    patches: tuple[Patch, ...],
    plan: Plan,
    *,
    options: Options,
    base_files: BaseFiles | None,
    keep_going: bool,
    dry_run: bool,
    recovered: bool,
) -> ApplyReport:
    from patchctl.patching import evaluate

    record = current.record
    leftovers: frozenset[str] = frozenset()
    if current.state in ("wiped", "version-changed"):
        # The old record describes files pip replaced. Files the patches created are still there
        # (pip leaves files it did not install): they are ours, so they are evaluated as absent and
        # stay in the new record, whose revert removes them.
        assert record is not None  # status() reports these two states only about a record it loaded
        leftovers = frozenset(
            f.path
            for f, s in zip(record.files, current.files, strict=True)
            if f.pristine_sha256 is None and s.status == "patched"
        )
        carried = tuple(f for f in record.files if f.path in leftovers)
        record = record._replace(files=carried, patches=()) if carried else None
    applied = frozenset(p.name for p in record.patches) if record else frozenset()
    result = evaluate.evaluate(
        patches, target.version, _TreeSource(target, leftovers), options=options._replace(applied=applied), base_files=base_files
    )
    if not result.ok and not keep_going:
        return ApplyReport(
            result,
            (),
            recovered,
            "",
            current.state,
            failure=_failed(target, [o for o in result.outcomes if o.outcome == O.CONFLICT]),
        )
    if dry_run:
        return ApplyReport(result, (), recovered, "dry run: nothing written", current.state)
    changes = [c._replace(before=st.read_tree(c.path, st.state_file)) if c.path in leftovers else c for c in result.changes]
    origins = _origins(patches, result)
    # A record is rewritten without file changes when the series, the choice, the stores or the build
    # it names changed (`apply --install` of the build that was already there records how it was installed).
    if not changes and (
        record is None
        or (
            record.store_fingerprint == plan.fingerprint
            and record.selection == plan.selection
            and _build(target, record) == record.build
            and not _origins_changed(record, origins)
        )
    ):
        return ApplyReport(result, (), recovered, "nothing to write", current.state)
    check_paths(target, [c.path for c in changes])
    check_writable(target.root, [c.path for c in changes])
    new_record = _merge_record(target, st, record, result, changes, plan, origins)
    st.write_files([Change(c.path, c.before, c.after) for c in changes], new_record)
    return ApplyReport(result, tuple(c.path for c in changes), recovered, "", current.state, new_record)


def _origins_changed(record: StateRecord, origins: dict[str, tuple[StoreRef, str | None]]) -> bool:
    """A record `new` wrote lacks a store or fingerprint it can have now."""
    return any(p.name in origins and (p.store, p.sha256) != origins[p.name] for p in record.patches if p.outcome in O.ON_TREE)


def rebuild_locked(
    target: Target,
    st: TargetState,
    current: TargetStatus,
    patches: tuple[Patch, ...],
    plan: Plan,
    *,
    options: Options,
    base_files: BaseFiles | None,
    keep_going: bool,
    dry_run: bool,
    recovered: bool,
) -> ApplyReport:
    """An intact tree brought to a smaller set of patches: the chosen ones evaluated on the pristine
    bytes the record keeps, every file of the others put back as it was (mtime and bytecode), one
    journaled write."""
    from patchctl.patching import evaluate

    record = current.record
    assert record is not None  # only an intact record is rebuilt
    pristine = {f.path: (None if f.pristine_sha256 is None else st.blob(f.pristine_sha256)) for f in record.files}
    result = evaluate.evaluate(
        patches,
        target.version,
        _TreeSource(target, frozenset(), pristine),
        options=options._replace(applied=frozenset()),
        base_files=base_files,
    )
    if not result.ok and not keep_going:
        return ApplyReport(
            result,
            (),
            recovered,
            "",
            current.state,
            failure=_failed(target, [o for o in result.outcomes if o.outcome == O.CONFLICT]),
        )
    if dry_run:
        return ApplyReport(result, (), recovered, "dry run: nothing written", current.state)
    wanted = {c.path: c.after for c in result.changes}
    by_path = {f.path: f for f in record.files}
    changes: list[Change] = []
    files: list[FileRecord] = []
    for path in dict.fromkeys([*by_path, *wanted]):
        now = st.read_tree(path, st.state_file)
        old = by_path.get(path)
        if path in wanted:
            after = wanted[path]
            if old is None:
                mtime, bytecode = st.capture(path)
                before = next(c.before for c in result.changes if c.path == path)
                if before is not None:
                    st.put_blob(before)
                old = FileRecord(path, sha256(before), None, mtime, bytecode)
            files.append(old._replace(patched_sha256=sha256(after)))
            if after != now:
                changes.append(Change(path, now, after))
        else:
            assert old is not None
            back = pristine[path]
            if back != now:
                changes.append(Change(path, now, back, old.pristine_mtime_ns, old.bytecode))
    check_paths(target, [c.path for c in changes])
    check_writable(target.root, [c.path for c in changes])
    origins = _origins(patches, result)
    new_record = StateRecord(
        target.engine.name,
        str(target.root),
        str(target.version),
        time.time(),
        tuple(_patch_record(o.name, o.outcome, o.variant, origins) for o in result.outcomes),
        tuple(files),
        plan.fingerprint,
        _build(target, record),
        _stores(plan.stores, origins.values()),
        plan.selection,
    )
    st.write_files(changes, new_record)
    return ApplyReport(result, tuple(c.path for c in changes), recovered, "", current.state, new_record)


def _patch_record(name: str, outcome: str, variant: str | None, origins: dict[str, tuple[StoreRef, str | None]]) -> PatchRecord:
    store, digest = origins.get(name, (None, None))
    return PatchRecord(name, outcome, variant, store, digest)


def _stores(layers: tuple[StoreRef, ...], origins: Iterable[tuple[StoreRef | None, str | None]]) -> tuple[StoreRef, ...]:
    """The stores a record names: the layers applied from, then any other store a kept patch came from."""
    found = list(layers) + [store for store, _ in origins if store is not None]
    return tuple(dict.fromkeys(found))


class _TreeSource:
    """The target's files as the apply engine reads them, with the patches' own leftovers absent."""

    def __init__(self, target: Target, absent: frozenset[str], instead: dict[str, bytes | None] | None = None):
        from patchctl.sources.files import DirectorySource

        self._target = target
        self._tree = DirectorySource(target.root)
        self._absent = absent
        self._instead = instead or {}  # path -> bytes read instead of the tree's (the record's pristine ones)

    def read(self, path: str) -> bytes | None:
        if path in self._absent:
            return None
        if path in self._instead:
            return self._instead[path]
        from patchctl.sources.files import resolve_inside

        check_paths(self._target, [path])  # before the file system is asked: bad input is exit 2
        resolve_inside(self._tree.root, path)  # a link out of the tree: refused (exit 2) as every source refuses it
        # Read relative to folder descriptors (nofollow.read_beneath): a FIFO is refused, not read, and a
        # name swapped for a link meanwhile is followed only inside the tree.
        data = read_beneath(self._tree.root, path)
        entry = lstat_beneath(self._tree.root, path) if data is not None else None
        if entry is not None and stat.S_ISLNK(entry.st_mode):
            raise UsageError(
                f"{path} is a symlink: patchctl replaces files by rename and would turn it into a "
                f"copy, so it refuses to patch it",
                hint="replace the link by the file itself, or patch the tree it points into",
            )
        return data

    def prefetch(self, paths: Iterable[str]) -> None:
        self._tree.prefetch(paths)

    def provenance(self) -> Provenance:
        return self._tree.provenance()


def _failed(target: Target, bad: list) -> tuple[str, str]:
    return (
        f"{len(bad)} patch(es) do not apply: {', '.join(o.name for o in bad)}; nothing was written",
        f"the outcome table and each failing hunk with the upstream lines around it are below "
        f"(--json: `patches`); `patchctl rebase {target.engine.name} --onto {target.version}` carries "
        f"the patches onto this release; --keep-going applies the others",
    )


def _merge_record(
    target: Target,
    st: TargetState,
    old: StateRecord | None,
    result: SeriesResult,
    changes: list,
    plan: Plan,
    origins: dict[str, tuple[StoreRef, str | None]],
) -> StateRecord:
    files = {f.path: f for f in (old.files if old else ())}
    for change in changes:
        if change.path in files:
            files[change.path] = files[change.path]._replace(patched_sha256=sha256(change.after))
        else:
            # First time patchctl touches this file: remember the pristine file exactly, with its
            # mtime and bytecode, so revert leaves it as pip installed it.
            mtime, bytecode = st.capture(change.path)
            files[change.path] = FileRecord(change.path, sha256(change.before), sha256(change.after), mtime, bytecode)
    patches = {p.name: p for p in (old.patches if old else ())}
    for o in result.outcomes:
        if o.outcome in O.WRITES or o.name not in patches:
            patches[o.name] = _patch_record(o.name, o.outcome, o.variant, origins)
        elif o.name in origins:  # already applied: the record learns where it comes from now
            patches[o.name] = patches[o.name]._replace(store=origins[o.name][0], sha256=origins[o.name][1])
    kept = [(p.store, p.sha256) for p in patches.values()]
    return StateRecord(
        target.engine.name,
        str(target.root),
        str(target.version),
        time.time(),
        tuple(patches.values()),
        tuple(files.values()),
        plan.fingerprint,
        _build(target, old),
        _stores(plan.stores, kept),
        plan.selection,
    )


def _build(target: Target, old: StateRecord | None) -> BuildRecord | None:
    """The build to record: the one --install just installed; else what the record said before, while
    the version is the same (ensure re-applying after pip reinstalled that build keeps its URL and
    sha256); else what the tree's dist-info says."""
    build = target.build
    if build is not None and build.kind != "installed":
        return build
    if old is not None and old.build is not None and old.build.version == str(target.version):
        return old.build
    return build
