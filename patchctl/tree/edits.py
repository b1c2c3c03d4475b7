"""Hand edits: the files of an installed engine that differ from its release — by the dist-info
RECORD's sha256s for a wheel install, else against the pristine release read from the index — less
what the applied patches wrote (the target's state record), and taking such edits into that record
once `new` or `refresh` made them a patch.

One scan serves `status` (RECORD only, .py files only: no network, a few hundred milliseconds for
vLLM), `revert --from-release` (every file RECORD hashes), `diff` and `new` (the release when there
is no RECORD) and `refresh`. Compiled extensions and bytecode are never hashed: no patch touches
them, and hashing vLLM's .so files costs seconds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from patchctl.core import outcomes as O
from patchctl.core.errors import EnvironmentProblem, PatchctlError, UsageError
from patchctl.core.nofollow import RECORD_LIMIT, read_beneath
from patchctl.core.paths import outside_packages
from patchctl.tree.bookkeeping import FileRecord, PatchRecord, StateRecord, sha256
from patchctl.tree.target import Target

if TYPE_CHECKING:
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.release import ReleaseSource

COMPILED = (".so", ".pyd", ".pyc", ".pyo", ".dll", ".dylib")
MODIFIED, ADDED, DELETED = "modified", "added", "deleted"


class Edit(NamedTuple):
    """One file that differs from the release."""

    path: str  # relative to the import root
    status: str  # modified | added | deleted
    sha256: str | None  # of the tree's bytes now (None: deleted)
    release_sha256: str | None  # of the release's bytes (None: the release has no such file)
    # A file the applied patches wrote and a person changed since: the edit on top is the difference
    # from what they wrote (patched_sha256; None: they deleted it), not from the release.
    on_top: bool = False
    patched_sha256: str | None = None

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "path": self.path,
            "status": self.status,
            "sha256": self.sha256,
            "release_sha256": self.release_sha256,
        }
        if self.on_top:
            doc["patched_sha256"] = self.patched_sha256
        return doc


class Scan(NamedTuple):
    edits: tuple[Edit, ...]  # hand edits that belong to no patch (plus on-top files named with --file)
    on_top: tuple[Edit, ...]  # files the record lists, changed since patchctl wrote them
    how: str  # "record" (the dist-info RECORD) or "release" (the pristine release from the index)
    managed: tuple[str, ...] = ()  # files that differ from the release as the applied patches wrote them


# --- the dist-info RECORD ------------------------------------------------------------------------


def record_of(target: Target) -> dict[str, str] | None:
    """path -> sha256 from the RECORD of the engine's dist-info for the target's version; None when
    the tree has none (a checkout, an editable install, an unpacked sdist)."""
    from patchctl.sources.zipread import record_hashes

    prefix = target.engine.dist.replace("-", "_") + "-"
    infos = [
        d
        for d in sorted(target.root.glob("*.dist-info"))
        if d.name.startswith(prefix) and d.name.removesuffix(".dist-info").endswith(f"-{target.version}")
    ]
    records = [raw for raw in (dist_info_file(target.root, d.name, "RECORD") for d in infos) if raw is not None]
    if not records:
        return None
    hashes: dict[str, str] = {}
    for raw in records:
        hashes.update(record_hashes(raw))
    return hashes


def dist_info_file(root: Path, info: str, name: str) -> bytes | None:
    """A file of a dist-info folder in the tree (RECORD, METADATA, direct_url.json), read as every
    tree file is (nofollow.read_beneath): None when missing; a FIFO, a device, a link out of the tree
    or a file over 64 MiB is refused (exit 3), not read."""
    return read_beneath(root, f"{info}/{name}", RECORD_LIMIT)


def _wanted(path: str, packages: Sequence[str], only_py: bool) -> bool:
    if outside_packages([path], packages) or "__pycache__/" in path:
        return False
    return path.endswith(".py") if only_py else not path.endswith(COMPILED)


def _digest(target: Target, path: str) -> str | None:
    """The sha256 of a tree file now (None: missing), read as every tree file is (read_beneath)."""
    return sha256(read_beneath(target.root, path))


def tree_files(target: Target, *, only_py: bool) -> list[str]:
    """Files of the engine's packages in the tree (bytecode, compiled extensions and dot-folders left out)."""
    found = []
    for package in target.engine.packages:
        top = target.root / package
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            rel_dir = Path(dirpath).relative_to(target.root).as_posix()
            for name in sorted(filenames):
                rel = f"{rel_dir}/{name}"
                if _wanted(rel, target.engine.packages, only_py) and not name.startswith("."):
                    found.append(rel)
    return found


def record_mismatches(
    target: Target, *, only_py: bool = False, added: bool = False, paths: Iterable[str] | None = None
) -> list[Edit]:
    """Files of the engine's packages whose bytes differ from the installed dist-info's RECORD: changed
    or missing, and with `added` files RECORD does not list. only_py: hash .py files only (status).
    paths: only these. Empty when the tree has no RECORD."""
    record = record_of(target)
    if record is None:
        return []
    packages = target.engine.packages
    named = None if paths is None else list(dict.fromkeys(paths))
    out = []
    for path, digest in sorted(record.items()):
        if (named is not None and path not in named) or (named is None and not _wanted(path, packages, only_py)):
            continue
        now = _digest(target, path)
        if now != digest:
            out.append(Edit(path, DELETED if now is None else MODIFIED, now, digest))
    if added or named is not None:
        candidates = tree_files(target, only_py=only_py) if named is None else named
        for path in candidates:
            if path not in record:
                now = _digest(target, path)
                if now is not None:
                    out.append(Edit(path, ADDED, now, None))
    return sorted(out)


# --- against the pristine release ------------------------------------------------------------------


def release_mismatches(target: Target, release: ReleaseSource, *, paths: Iterable[str] | None = None) -> list[Edit]:
    """Without a RECORD: the tree against the release's own bytes (read from the index, each checked
    against the wheel's RECORD). paths: only these; else every .py file of the engine's packages in
    the tree. A file the release has and the tree lacks counts as deleted only when named: a checkout
    lacks what the wheel's build adds (vLLM's vllm_flash_attn/), and that is no edit."""
    wanted = tree_files(target, only_py=True) if paths is None else list(dict.fromkeys(paths))
    release.prefetch(wanted)
    out = []
    for path in wanted:
        now = _digest(target, path)
        then = sha256(release.read(path))
        if now != then:
            status = ADDED if then is None else DELETED if now is None else MODIFIED
            out.append(Edit(path, status, now, then))
    return out


# --- the scan --------------------------------------------------------------------------------------


def scan(
    target: Target, *, ctx: SourceContext | None = None, files: Sequence[str] = (), release: ReleaseSource | None = None
) -> Scan:
    """Every hand edit of the tree. files: only these paths (relative to the import root); named
    files that the applied patches wrote and a person changed since are edits too (else on_top).
    Without a RECORD the release is read from the index (`release`, or one opened with ctx)."""
    named = [inside_engine(target, f) for f in files] or None
    record = record_of(target)
    if record is not None:
        found, how = record_mismatches(target, added=True, paths=named), "record"
    else:
        if release is None:
            if ctx is None:
                raise UsageError(
                    f"{target.root} has no dist-info RECORD for {target.engine.dist} {target.version}, "
                    f"and comparing with the release needs the package index"
                )
            from patchctl.sources import fetch

            release = fetch.release(target.engine, target.version, ctx)
        found, how = release_mismatches(target, release, paths=named), "release"
    edits, on_top, managed = _partition(target, found, set(named or ()))
    return Scan(tuple(edits), tuple(on_top), how, tuple(managed))


def _partition(target: Target, found: list[Edit], named: set[str]) -> tuple[list[Edit], list[Edit], list[str]]:
    """Leave out what the applied patches wrote: a file whose bytes are the recorded patched bytes is
    the patch set's; one the record lists that changed since is a hand edit on top."""
    state = target.state().load()
    if state is None:
        return found, [], []
    recorded = {f.path: f for f in state.files}
    current = state.version == str(target.version)
    edits, on_top, managed = [], [], []
    for edit in found:
        f = recorded.get(edit.path)
        if f is None:
            edits.append(edit)
        elif edit.sha256 == f.patched_sha256:
            managed.append(edit.path)
        elif not current:
            edits.append(edit)  # a record from before an upgrade describes files pip replaced
        else:
            top = edit._replace(on_top=True, patched_sha256=f.patched_sha256)
            on_top.append(top)
            if edit.path in named:
                edits.append(top)
    return edits, on_top, managed


def unmanaged(target: Target) -> list[str]:
    """What `status` shows: .py files of the engine's packages that differ from the RECORD and that
    no applied patch wrote. No network: without a RECORD, nothing."""
    found = record_mismatches(target, only_py=True, added=True)
    if not found:
        return []
    state = target.state().load()
    recorded = {f.path for f in state.files} if state is not None else set()
    return [e.path for e in found if e.path not in recorded]


def inside_engine(target: Target, path: str) -> str:
    """A --file argument as a path relative to the import root, inside one of the engine's packages:
    `vllm/x.py` (relative to the import root), or a path to a file in the tree (absolute, or from the
    current folder)."""
    raw = Path(path).expanduser()
    on_disk = raw if raw.is_absolute() else Path.cwd() / raw
    rel: str | None = None
    if raw.is_absolute() or on_disk.exists():
        try:
            rel = on_disk.resolve().relative_to(target.root.resolve()).as_posix()
        except ValueError:
            rel = None
    if rel is None and not raw.is_absolute():
        rel = raw.as_posix()
    if rel is None or ".." in rel.split("/") or outside_packages([rel], target.engine.packages):
        raise UsageError(
            f"--file {path}: not a file of the {', '.join(target.engine.packages)} package in {target.root}",
            hint=f"name it relative to the import root, e.g. {target.engine.packages[0]}/module.py",
        )
    return rel


# --- the bytes an edit is made against ---------------------------------------------------------------


def pristine_bytes(target: Target, release: ReleaseSource, edits: Iterable[Edit]) -> dict[str, bytes | None]:
    """The release's own bytes of each edited file, checked against the sha256 the scan expected
    (RECORD's): a tree whose RECORD is not this release's is refused rather than diffed wrongly."""
    edits = list(edits)
    release.prefetch([e.path for e in edits])
    out: dict[str, bytes | None] = {}
    for e in edits:
        data = release.read(e.path)
        got = sha256(data)
        if got != e.release_sha256:
            said = "no such file" if e.release_sha256 is None else f"sha256 {e.release_sha256[:12]}…"
            raise UsageError(
                f"{e.path}: the tree's RECORD says {target.engine.dist} {target.version} has {said}, but the "
                f"release on the index has " + ("no such file" if got is None else f"{got[:12]}…"),
                hint="the dist-info does not belong to these files: reinstall the engine, or pass --as-version",
            )
        out[e.path] = data
    return out


def release_bytes(target: Target, release: ReleaseSource, paths: Iterable[str]) -> dict[str, bytes | None]:
    """The release's bytes of these paths, each checked against the tree's RECORD where it lists the file."""
    paths = list(dict.fromkeys(paths))
    release.prefetch(paths)
    record = record_of(target) or {}
    checked = pristine_bytes(target, release, [Edit(p, MODIFIED, None, record[p]) for p in paths if p in record])
    return {p: checked[p] if p in checked else release.read(p) for p in paths}


def base_bytes(target: Target, edit: Edit, pristine: bytes | None) -> bytes | None:
    """What a hand edit is the difference from: the release's bytes, or, for an edit on top of what
    the applied patches wrote, those bytes (kept in the target's state as a blob)."""
    if not edit.on_top:
        return pristine
    if edit.patched_sha256 is None:  # the patches deleted it; a person made it again
        return None
    return target.state().blob(edit.patched_sha256)


def current_bytes(target: Target, path: str) -> bytes | None:
    """The tree's bytes of `path` now (None: missing), read as every tree file is (read_beneath)."""
    return read_beneath(target.root, path)


# --- taking edits into the record --------------------------------------------------------------------


def adopt(
    target: Target,
    patch: str,
    variant: str,
    files: Mapping[str, tuple[bytes | None, bytes | None]],
    *,
    wait: float = 0.0,
    store: Path | None = None,
    variant_sha256: str | None = None,
) -> str | None:
    """Record in the target that `patch` (its `variant`) is applied and wrote these files as they are
    now: path -> (the release's bytes, the tree's bytes). So `status` reports it intact, `revert`
    restores the release's files, and `ensure` finds it already applied. Nothing else is written.
    The record keeps what it said besides (the build, the choice, the stores) and learns the store the
    patch lives in (`store`) and its variant's sha256, so `ensure` re-applies it with no --store.
    Returns a warning when the record could not be written (a tree this user cannot write)."""
    from patchctl.store.layered import store_kind
    from patchctl.tree.bookkeeping import Selection, StoreRef
    from patchctl.tree.target import check_paths

    check_paths(target, list(files))  # what revert will restore: the one rule of every tree write
    st = target.state()
    try:
        with st.locked(wait):
            st.recover()
            record = st.load()
            if record is not None and record.version != str(target.version):
                return (
                    f"the tree's record is from {target.engine.dist} {record.version}: {patch} was not recorded as "
                    f"applied (run `patchctl ensure {target.engine.name}` first)"
                )
            by_path: dict[str, FileRecord] = {f.path: f for f in record.files} if record else {}
            for path, (pristine, now) in files.items():
                old = by_path.get(path)
                if old is None and sha256(now) == sha256(pristine):
                    continue  # the release's own bytes: nothing of the patch's
                if old is None:
                    if pristine is not None:
                        st.put_blob(pristine)  # what revert puts back
                    by_path[path] = FileRecord(path, sha256(pristine), sha256(now))
                elif sha256(now) == old.pristine_sha256:
                    del by_path[path]  # back to the release's bytes: nothing of ours any more
                else:
                    by_path[path] = old._replace(patched_sha256=sha256(now))
                if now is not None:
                    st.put_blob(now)
            patches = {p.name: p for p in record.patches} if record else {}
            ref = None if store is None else StoreRef(str(store.resolve()), store_kind(store))
            patches[patch] = PatchRecord(patch, O.CLEAN, variant, ref, variant_sha256)
            stores = tuple(dict.fromkeys(([ref] if ref else []) + list(record.stores if record else ())))
            selection = record.selection if record else Selection()
            if selection.patches is not None and patch not in selection.patches:
                selection = selection._replace(patches=(*selection.patches, patch))
            if patch in selection.exclude:
                selection = selection._replace(exclude=tuple(n for n in selection.exclude if n != patch))
            # No store fingerprint: the next `ensure` evaluates the series once and records it.
            st.save(
                StateRecord(
                    target.engine.name,
                    str(target.root),
                    str(target.version),
                    time.time(),
                    tuple(patches.values()),
                    tuple(by_path.values()),
                    None,
                    record.build if record else target.build,
                    stores,
                    selection,
                )
            )
    except (EnvironmentProblem, OSError) as exc:
        why = exc.message if isinstance(exc, PatchctlError) else (exc.strerror or str(exc))
        return (
            f"{patch} was not recorded as applied in {target.root} ({why}): `patchctl status` lists its "
            f"files as hand edits until `patchctl apply {target.engine.name}` runs as the tree's owner"
        )
    return None


__all__ = [
    "Edit",
    "Scan",
    "adopt",
    "base_bytes",
    "current_bytes",
    "dist_info_file",
    "inside_engine",
    "pristine_bytes",
    "record_mismatches",
    "record_of",
    "release_mismatches",
    "scan",
    "unmanaged",
]
