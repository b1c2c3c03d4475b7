"""`patchctl status`: what is applied to a target, and whether its patched files changed since."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.image_options import ImageOptions, image_options
from patchctl.cli.options import WAIT, target_options
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.operations import Target

EXIT_BY_STATE = {"intact": EXIT_OK, "not-applied": EXIT_OK, "wiped": EXIT_PATCH_FAILED,
                 "version-changed": EXIT_PATCH_FAILED, "modified": EXIT_PATCH_FAILED}


def run(spec: str, where: TargetSpec, *, wait: float = 30.0) -> tuple[dict, int]:
    from patchctl.tree import operations as tgt
    from patchctl.tree.find import find_target

    target = find_target(parse_spec(spec), where)
    st, recovered, unlocked = tgt.checked_status(target, wait)
    code = EXIT_BY_STATE[st.state]
    record = st.record
    unmanaged, warnings = _unmanaged(target)
    if unlocked is not None:
        warnings.insert(0, f"read without the lock: {target.state().dir} cannot be written ({unlocked}), and no "
                           f"interrupted write is there to undo")
    doc = document(
        "status", code, engine=target.engine.name, version=str(target.version), target=str(target.root),
        state=st.state, message=st.message + (" (recovered an interrupted run first)" if recovered else ""),
        applied_version=record.version if record else None,
        applied_at=record.applied_at if record else None,
        applied=[p.to_json() for p in record.patches] if record else [],
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
        unmanaged=unmanaged, warnings=warnings,
    )
    doc["note"] = unmanaged_line(doc)  # printed after the message
    return doc, code


def _unmanaged(target: Target) -> tuple[list[str], list[str]]:
    """Hand edits: .py files of the engine's packages that differ from the dist-info RECORD and that no
    applied patch wrote. RECORD only (no network; a tree without one says nothing), and never a
    reason to change the exit code: an intact patch set with a hand edit beside it is still intact."""
    from patchctl.tree.edits import unmanaged

    try:
        return unmanaged(target), []
    except OSError as exc:
        return [], [f"could not look for hand edits in {target.root}: {exc}"]


def unmanaged_line(doc: dict) -> str | None:
    paths = doc.get("unmanaged") or []
    if not paths:
        return None
    shown = ", ".join(paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    files = "1 file differs" if len(paths) == 1 else f"{len(paths)} files differ"
    return (f"{files} from {doc['engine']} {doc['version']} and belong{'s' if len(paths) == 1 else ''} to no patch: "
            f"{shown}; `patchctl new {doc['engine']} NAME` turns {'it' if len(paths) == 1 else 'them'} into one")


def build_line(build: dict | None) -> str | None:
    """`vllm 0.23.1.dev12+g1234abcd5 (commit 1234abcd5) from <URL>, installed with uv`."""
    if not build:
        return None
    line = build["version"] + (f" (commit {build['commit']})" if build.get("commit") else "")
    if build.get("url"):
        line += f" from {build['url']}"
    if build.get("sha256"):
        line += f", sha256 {build['sha256']}"
    if build.get("installer"):
        line += f", installed with {build['installer']}"
    return line


def render(doc: dict, out: Console, err: Console) -> None:
    line = build_line(doc.get("build"))
    if line:
        out.print(f"patched build: {doc['engine']} {line}", markup=False, highlight=False)
    chosen = selection_line(doc.get("selection"))
    if chosen:
        out.print(f"chosen: {chosen}", markup=False, highlight=False)
    for p in doc.get("applied", []):
        if p.get("store"):
            out.print(f"  {p['name']}: {p['variant'] or '-'} from {p['store']['path']} ({p['store']['kind']})",
                      markup=False, highlight=False)
    for f in doc.get("files", []):
        out.print(f"  {f['status']:<9} {f['path']}", markup=False, highlight=False)


def selection_line(selection: dict | None) -> str | None:
    """`only a, b` / `every patch except c`; None for every patch of the series."""
    if not selection or (selection["patches"] is None and not selection["exclude"]):
        return None
    text = "only " + ", ".join(selection["patches"]) if selection["patches"] is not None else "every patch"
    return text + (f" except {', '.join(selection['exclude'])}" if selection["exclude"] else "")


@patchctl_command("status", render=render, example=(
    "patchctl status vllm                         the vLLM installed for python3",
    "patchctl status sglang --target ./site-packages --json",
))
@click.argument("spec", metavar="ENGINE")
@target_options
@click.option("--wait", type=WAIT, default=30.0, show_default=True,
              help="Seconds to wait for another patchctl working on the same target.")
@image_options(writes=False)
def command(spec: str, where: TargetSpec, wait: float, image: ImageOptions | None) -> tuple[dict, int]:
    """What is applied, and whether patched files changed since (e.g. wiped by pip).

    Also lists hand edits: .py files that differ from the dist-info RECORD and belong to no patch
    (`patchctl new ENGINE NAME` turns them into one); they do not change the exit code.
    """
    if image:
        from patchctl.cli import image_command

        return image_command.status(run, spec, image, wait=wait)
    return run(spec, where, wait=wait)
