"""What a tree's record says against what its files are: intact, wiped by a reinstall, gone with an
upgrade, changed by hand; and the record's patches counted as they are (only the ones on the tree
are applied)."""

from __future__ import annotations

from typing import NamedTuple

from patchctl.core import outcomes as O
from patchctl.tree.bookkeeping import PatchRecord, StateRecord, sha256
from patchctl.tree.target import Target


class FileStatus(NamedTuple):
    path: str
    status: str  # patched | pristine | changed | missing


class TargetStatus(NamedTuple):
    state: str  # not-applied | intact | wiped | modified | version-changed
    record: StateRecord | None
    files: tuple[FileStatus, ...]
    message: str


def status(target: Target) -> TargetStatus:
    """What the record says against what the files are; the caller holds the lock (or reads only)."""
    st = target.state()
    record = st.load()
    if record is None:
        return TargetStatus("not-applied", None, (), f"no patches applied to {target.engine.name} at {target.root}")
    files = []
    for f in record.files:
        data = st.read_tree(f.path, st.state_file)
        digest = sha256(data)
        if digest == f.patched_sha256:
            files.append(FileStatus(f.path, "patched"))
        elif data is None:  # before "pristine": a file the patches created is pristine only in name when absent
            files.append(FileStatus(f.path, "missing"))
        elif digest == f.pristine_sha256:
            files.append(FileStatus(f.path, "pristine"))
        else:
            files.append(FileStatus(f.path, "changed"))
    kinds = {f.status for f in files}
    if str(target.version) != record.version:
        return TargetStatus(
            "version-changed",
            record,
            tuple(files),
            f"{target.engine.dist} changed from {record.version} to {target.version} since the patches were "
            f"applied (pip install -U?): the patches are gone. Run `patchctl ensure {target.engine.name}`.",
        )
    if kinds <= {"patched"}:
        return TargetStatus("intact", record, tuple(files), counted(record, "applied and intact"))
    upstream_files = {f.status for f, r in zip(files, record.files, strict=True) if r.pristine_sha256 is not None}
    # pip never removes files it did not install, so files the patches created may outlive a wipe.
    if upstream_files and upstream_files <= {"pristine"}:
        return TargetStatus(
            "wiped",
            record,
            tuple(files),
            f"every patched file is back to the pristine {record.version} content: {target.engine.dist} was "
            f"reinstalled and the patches are gone. Run `patchctl ensure {target.engine.name}`.",
        )
    changed = [f.path for f in files if f.status != "patched"]
    return TargetStatus(
        "modified",
        record,
        tuple(files),
        f"patched files changed since patchctl applied them (not by an upgrade: the version is still "
        f"{record.version}): {', '.join(changed)}",
    )


def on_tree(record: StateRecord | None) -> list[PatchRecord]:
    return [p for p in record.patches if p.outcome in O.ON_TREE] if record else []


def counted(record: StateRecord, how: str) -> str:
    """`1 patch applied and intact (loader); not applied: 1 obsolete (old), 1 upstreamed (up)`: the
    applied patches counted and named, the record's others by outcome."""
    applied = on_tree(record)
    names = ", ".join(p.name for p in applied)
    text = f"{len(applied)} patch{'' if len(applied) == 1 else 'es'} {how} ({names})" if applied else "no patch applied"
    rest: dict[str, list[str]] = {}
    for p in record.patches:
        if p.outcome not in O.ON_TREE:
            rest.setdefault(p.outcome, []).append(p.name)
    if rest:
        order = sorted(rest, key=lambda o: (O.ALL.index(o) if o in O.ALL else len(O.ALL), o))
        text += "; not applied: " + ", ".join(f"{len(rest[o])} {o} ({', '.join(rest[o])})" for o in order)
    return text


def checked_status(target: Target, wait: float = 30.0) -> tuple[TargetStatus, bool, str | None]:
    """status under the lock, after recovering an interrupted run: (status, recovered, unlocked).
    unlocked: why the lock could not be taken on a tree nothing may be written into (read without
    it, nothing to recover), else None."""
    st = target.state()
    with st.locked(wait, read_only_ok=True) as unlocked:
        if unlocked is not None:
            return status(target), False, unlocked
        recovered = st.recover()
        return status(target), recovered, None
