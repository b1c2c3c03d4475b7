"""`patchctl diff`: the hand edits of an installed engine that belong to no patch, as a unified diff
against its pristine release (`git diff` form: `git apply` or `patch -p1` in the import root take it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, fetch_options, target_options
from patchctl.core.errors import EXIT_OK
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.sources.fetch import SourceContext
    from patchctl.tree.find import TargetSpec


def run(engine: str, where: TargetSpec, ctx: SourceContext, *, files: tuple[str, ...] = ()) -> tuple[dict, int]:
    from patchctl.patching import capture
    from patchctl.sources import fetch
    from patchctl.tree import edits as ed
    from patchctl.tree.find import find_target

    target = find_target(parse_spec(engine), where)
    scan = ed.scan(target, ctx=ctx, files=files)
    label = f"{target.engine.name} {target.version}"
    text = ""
    warnings: list[str] = []
    if scan.edits:
        release = fetch.release(target.engine, target.version, ctx)
        pristine = ed.pristine_bytes(target, release, scan.edits)
        pairs, warnings = capture.text_only(
            {e.path: (ed.base_bytes(target, e, pristine[e.path]), ed.current_bytes(target, e.path)) for e in scan.edits}
        )
        text = capture.unified_diff(pairs) if pairs else ""
    left = [e.path for e in scan.on_top if e not in scan.edits]
    if left:
        warnings.append(
            f"{len(left)} file(s) changed on top of the applied patches are not shown: {', '.join(left)} "
            f"(`patchctl refresh {engine} PATCH` takes an edit into its patch; --file PATH shows it)"
        )
    if scan.edits:
        how = "" if scan.how == "record" else " (compared with the release on the index)"
        summary = (
            f"{len(scan.edits)} file(s) differ from {label} and belong to no patch{how}; "
            f"`patchctl new {engine} NAME` turns them into one"
        )
    else:
        summary = f"no file of {label} differs from its release"
    return document(
        "diff",
        EXIT_OK,
        engine=target.engine.name,
        version=str(target.version),
        target=str(target.root),
        compared_with=scan.how,
        files=[e.as_json() for e in scan.edits],
        on_top=[e.as_json() for e in scan.on_top],
        diff=text,
        summary=summary,
        warnings=warnings,
    ), EXIT_OK


def render(doc: dict, out: Console, err: Console) -> None:
    # stdout carries the diff alone (`patchctl diff vllm > my.patch`); the summary goes to stderr.
    if doc.get("diff"):
        out.print(doc["diff"], markup=False, highlight=False, end="")
    err.print(doc["summary"], markup=False, highlight=False)


@patchctl_command(
    "diff",
    render=render,
    example=(
        "patchctl diff vllm                           hand edits of the vLLM installed for python3",
        "patchctl diff sglang --target ./site-packages > my-fix.diff",
        "patchctl diff vllm --json                    which files, with their sha256 and the release's",
    ),
)
@click.argument("engine", type=ENGINE, metavar="ENGINE")
@target_options
@click.option(
    "--file",
    "files",
    multiple=True,
    metavar="PATH",
    help="Only this file (relative to the import root, or a path into the tree; repeatable).",
)
@fetch_options
def command(engine: str, where: TargetSpec, files: tuple[str, ...], ctx: SourceContext) -> tuple[dict, int]:
    """The hand edits of ENGINE that belong to no patch, as a unified diff against its release.

    Files are found by the dist-info RECORD's sha256s (a wheel install), else against the release on
    the package index; the diff is made against the release's own bytes (for a file named with --file
    that the applied patches wrote, against what they wrote).
    """
    return run(engine, where, ctx, files=files)
