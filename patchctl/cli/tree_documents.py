"""The documents of the commands that work on a tree (apply, ensure, revert, status): tree.service's typed
results mapped to the --json dicts, once for the commands and their image path, so that no command
imports another."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from patchctl.cli.documents import document, series_json
from patchctl.core import outcomes as O
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED

if TYPE_CHECKING:
    from patchctl.tree.bookkeeping import BuildRecord, PatchRecord
    from patchctl.tree.service import ApplyResult, ApplyRun, RevertResult, StatusResult


def apply_document(run: ApplyRun, command: str, *, dry_run: bool = False, install: bool = False) -> tuple[dict, int]:
    """apply's (and ensure's) document: the engine's tree, with the trees its code moved to under `also`."""
    from patchctl.cli.commands.text import moved_warnings

    docs = [tree_document(r, command, dry_run=dry_run) for r in run.results]
    target = run.results[0].target
    warnings = moved_warnings(target.engine, target.version)
    warnings += [f"{name} is not installed, so its patches were not applied" for name in run.not_installed]
    first = docs[0]
    code = max(d["exit_code"] for d in docs)
    first["also"] = docs[1:]
    first["exit_code"], first["ok"] = code, code == EXIT_OK
    first["warnings"] = warnings + [w for d in docs for w in d["warnings"]]
    if not first.get("error"):
        # Which build was patched: what --install installed (its URL, commit), or what the tree says.
        first["build"] = run.build._asdict() if run.build else None
        if install:
            first["note"] = "; ".join(filter(None, [f"installed {_build_line(run.build)}", first.get("note")]))
    return first, code


def tree_document(r: ApplyResult, command: str, *, dry_run: bool = False) -> dict:
    target = r.target
    fields: dict[str, Any] = dict(
        engine=target.engine.name,
        version=str(target.version),
        target=str(target.root),
        source={"kind": "target", "description": target.how},
    )
    if r.failure is not None:
        error = {"kind": r.failure.kind, "message": r.failure.message, "hint": r.failure.hint}
        if r.failure.state is not None:  # changed by hand: nothing evaluated
            return document(command, EXIT_PATCH_FAILED, state=r.failure.state, written=[], removed=[], error=error, **fields)
        assert r.result is not None  # a failure without a state is patches that do not apply
        return document(command, EXIT_PATCH_FAILED, patches=series_json(r.result), written=[], removed=[], error=error, **fields)
    if r.result is None:  # ensure: intact, nothing evaluated
        assert r.record is not None  # the service evaluates nothing only on a record it loaded
        if r.unlocked is not None:
            fields["warnings"] = [
                f"read without the lock: {target.state().dir} cannot be written ({r.unlocked}); "
                f"the patches are intact, nothing was written"
            ]
        return document(
            command,
            EXIT_OK,
            patches=[_recorded(p) for p in r.record.patches],
            written=[],
            removed=[],
            note=r.note,
            state_before=r.state_before,
            **fields,
        )
    if r.record is not None and not r.record.selection.everything:
        fields["selection"] = r.record.selection.to_json()
    fields["warnings"] = list(r.warnings)
    fields["state_before"] = r.state_before
    failed = any(o.outcome == O.CONFLICT for o in r.result.outcomes)
    notes = [r.note] if r.note else []
    if r.recovered:
        notes.append("recovered an interrupted earlier run first")
    if r.written:
        notes.append(f"wrote {len(r.written)} file(s)")
    if r.removed:
        notes.append(f"{'would take' if dry_run else 'took'} {', '.join(r.removed)} out")
    return document(
        command,
        EXIT_PATCH_FAILED if failed else EXIT_OK,
        patches=series_json(r.result),
        written=list(r.written),
        removed=list(r.removed),
        note="; ".join(notes) or None,
        **fields,
    )


# ensure on an intact tree evaluates nothing: each patch's line says what the record says of it.
_RECORDED = {
    O.ALREADY_APPLIED: "recorded as applied, and every file it wrote is intact",
    O.OBSOLETE: "recorded as obsolete on this version when applied: nothing of it was written",
    O.UPSTREAMED: "recorded as upstreamed when applied (its change was already there): nothing of it was written",
    O.CONFLICT: "recorded as not applying when applied with --keep-going: nothing of it was written",
}


def _recorded(p: PatchRecord) -> dict:
    outcome = O.ALREADY_APPLIED if p.outcome in O.WRITES else p.outcome
    return {
        "name": p.name,
        "outcome": outcome,
        "variant": p.variant,
        "reason": _RECORDED.get(outcome, f"recorded as {outcome}"),
        "files": [],
        "hunks": [],
    }


def _build_line(build: BuildRecord | None) -> str:
    if build is None:
        return "?"
    commit = f", commit {build.commit}" if build.commit else ""
    via = f" with {build.installer}" if build.installer else ""
    return f"{build.version}{commit} ({build.artifact or build.url or build.kind}){via}"


def revert_document(r: RevertResult) -> dict:
    target = r.target
    fields = dict(engine=target.engine.name, version=str(target.version), target=str(target.root))
    if r.reverted:  # revert --patch
        from patchctl.tree.status import on_tree

        kept = [p.name for p in on_tree(r.record)]
        message = (
            f"took {', '.join(r.reverted)} out ({len(r.restored)} file(s) written); still applied: {', '.join(kept) or 'none'}"
        )
        return document(
            "revert",
            EXIT_OK,
            **fields,
            restored=list(r.restored),
            skipped=[],
            reverted=list(r.reverted),
            applied=kept,
            selection=r.record.selection.to_json() if r.record else None,
            message=message,
        )
    message = r.note or f"restored {len(r.restored)} file(s) byte for byte"
    if r.skipped:
        message += f"; {len(r.skipped)} already pristine"
    return document("revert", EXIT_OK, **fields, restored=list(r.restored), skipped=list(r.skipped), message=message)


# A tree's state → status's exit code: a wiped, upgraded or hand-edited patch set is a drift (1).
EXIT_BY_STATE = {
    "intact": EXIT_OK,
    "not-applied": EXIT_OK,
    "wiped": EXIT_PATCH_FAILED,
    "version-changed": EXIT_PATCH_FAILED,
    "modified": EXIT_PATCH_FAILED,
}


def status_document(r: StatusResult) -> tuple[dict, int]:
    from patchctl.tree.status import on_tree

    target, st = r.target, r.status
    code = EXIT_BY_STATE[st.state]
    record = st.record
    doc = document(
        "status",
        code,
        engine=target.engine.name,
        version=str(target.version),
        target=str(target.root),
        state=st.state,
        message=st.message + (" (recovered an interrupted run first)" if r.recovered else ""),
        applied_version=record.version if record else None,
        applied_at=record.applied_at if record else None,
        # Only what is on the tree counts as applied; the record's other patches (obsolete or
        # upstreamed on its version, a conflict --keep-going skipped) are listed with their outcome.
        applied=[p.to_json() for p in on_tree(record)],
        not_applied=[p.to_json() for p in record.patches if p.outcome not in O.ON_TREE] if record else [],
        # What ensure re-applies: the choice (--patch/--exclude; patches null: every patch of the
        # series) and the stores, highest priority first.
        selection=record.selection.to_json() if record else None,
        stores=[s._asdict() for s in record.stores] if record else [],
        # Which build the patches were applied to (a nightly's version, commit, URL); null for a
        # record written before patchctl kept it, or with nothing applied. installed_build: what the
        # tree is now, from its dist-info.
        build=record.build._asdict() if record and record.build else None,
        installed_build=target.build._asdict() if target.build else None,
        files=[f._asdict() for f in st.files],
        unmanaged=list(r.unmanaged),
        warnings=list(r.warnings),
    )
    doc["note"] = unmanaged_line(doc)  # printed after the message
    return doc, code


def unmanaged_line(doc: dict) -> str | None:
    paths = doc.get("unmanaged") or []
    if not paths:
        return None
    shown = ", ".join(paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    files = "1 file differs" if len(paths) == 1 else f"{len(paths)} files differ"
    return (
        f"{files} from {doc['engine']} {doc['version']} and belong{'s' if len(paths) == 1 else ''} to no patch: "
        f"{shown}; `patchctl new {doc['engine']} NAME` turns {'it' if len(paths) == 1 else 'them'} into one"
    )
