"""Putting a tree back: an exact revert through the record (each file's pristine bytes, mtime and
bytecode), and the way out of a damaged record, from the release itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from patchctl.core.errors import PatchFailed
from patchctl.tree.bookkeeping import Change
from patchctl.tree.status import status
from patchctl.tree.target import Target, check_paths, check_writable

if TYPE_CHECKING:
    from patchctl.sources.files import FileSource


class RevertReport(NamedTuple):
    restored: tuple[str, ...]
    skipped: tuple[str, ...]
    recovered: bool
    note: str


def revert(target: Target, *, force: bool = False, wait: float = 0.0) -> RevertReport:
    st = target.state()
    with st.locked(wait):
        recovered = st.recover()
        current = status(target)
        if current.record is None:
            return RevertReport((), (), recovered, "nothing to revert: no patches applied")
        if current.state == "version-changed":
            # Only files the patches created are still ours: pip replaced the others.
            created = [
                f
                for f, s in zip(current.record.files, current.files, strict=True)
                if f.pristine_sha256 is None and s.status == "patched"
            ]
            changes = [Change(f.path, st.read_tree(f.path, st.state_file), None) for f in created]
            st.write_files(changes, None)
            return RevertReport(
                tuple(c.path for c in changes),
                (),
                recovered,
                f"{current.message} Dropped the stale record"
                + (f" and removed {len(changes)} file(s) the patches had created." if changes else "."),
            )
        changes, skipped = [], []
        for record, fs in zip(current.record.files, current.files, strict=True):
            if fs.status == "pristine" or (fs.status == "missing" and record.pristine_sha256 is None):
                skipped.append(record.path)
                continue
            if fs.status != "patched" and not force:
                raise PatchFailed(
                    f"{record.path} changed since it was patched; refusing to overwrite it",
                    hint="pass --force to restore the pristine file anyway",
                )
            before = st.read_tree(record.path, st.state_file)
            pristine = None if record.pristine_sha256 is None else st.blob(record.pristine_sha256)
            changes.append(Change(record.path, before, pristine, record.pristine_mtime_ns, record.bytecode))
        check_paths(target, [c.path for c in changes])
        check_writable(target.root, [c.path for c in changes])
        st.write_files(changes, None)
        return RevertReport(tuple(c.path for c in changes), tuple(skipped), recovered, "")


def repair_from_release(target: Target, release: FileSource, paths: list[str], *, wait: float = 0.0) -> RevertReport:
    """The way out of a damaged record or journal: every file in `paths` (what the series touches at
    this version, and whatever the dist-info RECORD says differs) back to the release's own bytes,
    read from its artifact (each member checked against the wheel's RECORD), and the record dropped."""
    st = target.state()
    check_paths(target, paths)
    with st.locked(wait):
        changes, skipped = [], []
        for rel in paths:
            current = st.read_tree(rel, st.dir)
            pristine = release.read(rel)
            if current == pristine:
                skipped.append(rel)
            else:
                changes.append(Change(rel, current, pristine))
        check_writable(target.root, [c.path for c in changes])
        # Nothing of the damaged record or journal is trusted: they are set aside, not replayed.
        st.set_aside_damaged()
        st.write_files(changes, None)
        return RevertReport(
            tuple(c.path for c in changes),
            tuple(skipped),
            False,
            f"restored {len(changes)} file(s) from {target.engine.dist} {target.version} itself",
        )
