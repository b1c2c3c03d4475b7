"""Patching a real tree on disk (an installed engine or a source checkout): all-or-nothing apply,
status, exact revert and idempotent ensure, on top of the in-memory apply engine."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl import config
from patchctl import outcomes as O
from patchctl.engines import Engine
from patchctl.errors import EnvironmentProblem, PatchFailed
from patchctl.target.journal import FileRecord, PatchRecord, StateRecord, TargetState, sha256

if TYPE_CHECKING:
    # The apply engine (and unidiff, the store, packaging.requirements under it) is imported by
    # apply() only: status and revert read the state record and hash files, nothing more.
    from patchctl.engine.evaluate import BaseFiles, Options, SeriesResult
    from patchctl.store import Patch


class Target(NamedTuple):
    engine: Engine
    root: Path  # import root
    version: Version
    how: str  # "installed in /usr/bin/python3", "directory"

    def state(self) -> TargetState:
        key = hashlib.sha256(f"{self.engine.name}\0{self.root.resolve()}".encode()).hexdigest()[:20]
        return TargetState(config.data_dir() / "targets" / key)


class FileStatus(NamedTuple):
    path: str
    status: str  # patched | pristine | changed | missing


class TargetStatus(NamedTuple):
    state: str  # not-applied | intact | wiped | modified | version-changed
    record: StateRecord | None
    files: tuple[FileStatus, ...]
    message: str


def status(target: Target) -> TargetStatus:
    record = target.state().load()
    if record is None:
        return TargetStatus("not-applied", None, (), f"no patches applied to {target.engine.name} at {target.root}")
    files = []
    for f in record.files:
        data = (target.root / f.path).read_bytes() if (target.root / f.path).is_file() else None
        digest = sha256(data)
        if digest == f.patched_sha256:
            files.append(FileStatus(f.path, "patched"))
        elif digest == f.pristine_sha256:
            files.append(FileStatus(f.path, "pristine"))
        elif data is None:
            files.append(FileStatus(f.path, "missing"))
        else:
            files.append(FileStatus(f.path, "changed"))
    kinds = {f.status for f in files}
    names = ", ".join(p.name for p in record.patches if p.outcome in O.WRITES) or "none"
    if str(target.version) != record.version:
        return TargetStatus(
            "version-changed", record, tuple(files),
            f"{target.engine.dist} changed from {record.version} to {target.version} since the patches were "
            f"applied (pip install -U?): the patches are gone. Run `patchctl ensure {target.engine.name}`.",
        )
    if kinds <= {"patched"}:
        return TargetStatus("intact", record, tuple(files), f"{len(record.patches)} patches applied and intact ({names})")
    upstream_files = {f.status for f, r in zip(files, record.files, strict=False) if r.pristine_sha256 is not None}
    # pip never removes files it did not install, so files the patches created may outlive a wipe.
    if upstream_files and upstream_files <= {"pristine"}:
        return TargetStatus(
            "wiped", record, tuple(files),
            f"every patched file is back to the pristine {record.version} content: {target.engine.dist} was "
            f"reinstalled and the patches are gone. Run `patchctl ensure {target.engine.name}`.",
        )
    changed = [f.path for f in files if f.status != "patched"]
    return TargetStatus(
        "modified", record, tuple(files),
        f"patched files changed since patchctl applied them (not by an upgrade: the version is still "
        f"{record.version}): {', '.join(changed)}",
    )


class ApplyReport(NamedTuple):
    result: SeriesResult
    written: tuple[str, ...]
    recovered: bool
    note: str


def apply(target: Target, patches: tuple[Patch, ...], *, options: Options, base_files: BaseFiles | None,
          keep_going: bool = False, dry_run: bool = False, wait: float = 0.0, force: bool = False) -> ApplyReport:
    from patchctl.engine import evaluate as engine_apply
    from patchctl.sources.base import DirectorySource

    st = target.state()
    with st.locked(wait):
        recovered = st.recover(target.root)
        current = status(target)
        record = current.record
        if current.state in ("wiped", "version-changed"):
            record = None  # the old record describes files that no longer exist
        elif current.state == "modified" and not force:
            raise PatchFailed(current.message, hint="revert with --force, or apply with --force to take the files as they are")
        applied = frozenset(p.name for p in record.patches) if record else frozenset()
        result = engine_apply.evaluate(
            patches, target.version, DirectorySource(target.root),
            options=options._replace(applied=applied), base_files=base_files,
        )
        if not result.ok and not keep_going:
            bad = [o for o in result.outcomes if o.outcome == O.CONFLICT]
            raise _failed(result, bad)
        if dry_run or not result.changes:
            return ApplyReport(result, (), recovered, "dry run: nothing written" if dry_run else "nothing to write")
        _check_writable(target.root, [c.path for c in result.changes])
        new_record = _merge_record(target, record, result)
        st.write_files(target.root, [(c.path, c.before, c.after) for c in result.changes], new_record)
        return ApplyReport(result, tuple(c.path for c in result.changes), recovered, "")


class ConflictError(PatchFailed):
    def __init__(self, message: str, result: SeriesResult, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.result = result


def _failed(result: SeriesResult, bad) -> ConflictError:
    return ConflictError(
        f"{len(bad)} patch(es) do not apply: {', '.join(o.name for o in bad)}; nothing was written",
        result, hint="see the report; --keep-going applies the others",
    )


def _check_writable(root: Path, paths: list[str]) -> None:
    for rel in paths:
        file = root / rel
        directory = file.parent  # a rename into it needs the directory writable, not the file
        while not directory.exists():
            directory = directory.parent
        if not os.access(directory, os.W_OK):
            raise EnvironmentProblem(f"cannot write {file}: permission denied; nothing was changed",
                                     hint="run as the owner of the environment, or use --target on a copy")


def _merge_record(target: Target, old: StateRecord | None, result: SeriesResult) -> StateRecord:
    files = {f.path: f for f in (old.files if old else ())}
    for change in result.changes:
        pristine = files[change.path].pristine_sha256 if change.path in files else sha256(change.before)
        files[change.path] = FileRecord(change.path, pristine, sha256(change.after))
    patches = {p.name: p for p in (old.patches if old else ())}
    for o in result.outcomes:
        if o.outcome in O.WRITES or o.name not in patches:
            patches[o.name] = PatchRecord(o.name, o.outcome, o.variant)
    return StateRecord(target.engine.name, str(target.root), str(target.version), time.time(),
                       tuple(patches.values()), tuple(files.values()))


class RevertReport(NamedTuple):
    restored: tuple[str, ...]
    skipped: tuple[str, ...]
    recovered: bool
    note: str


def revert(target: Target, *, force: bool = False, wait: float = 0.0) -> RevertReport:
    st = target.state()
    with st.locked(wait):
        recovered = st.recover(target.root)
        current = status(target)
        if current.record is None:
            return RevertReport((), (), recovered, "nothing to revert: no patches applied")
        if current.state == "version-changed":
            st.save(None)
            return RevertReport((), (), recovered, f"{current.message} Dropped the stale record.")
        changes, skipped = [], []
        for record, fs in zip(current.record.files, current.files, strict=False):
            if fs.status == "pristine" or (fs.status == "missing" and record.pristine_sha256 is None):
                skipped.append(record.path)
                continue
            if fs.status != "patched" and not force:
                raise PatchFailed(f"{record.path} changed since it was patched; refusing to overwrite it",
                                  hint="pass --force to restore the pristine file anyway")
            before = (target.root / record.path).read_bytes() if (target.root / record.path).is_file() else None
            pristine = None if record.pristine_sha256 is None else st.blob(record.pristine_sha256)
            changes.append((record.path, before, pristine))
        _check_writable(target.root, [c[0] for c in changes])
        st.write_files(target.root, changes, None)
        return RevertReport(tuple(c[0] for c in changes), tuple(skipped), recovered, "")
