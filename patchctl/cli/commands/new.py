"""`patchctl new`: turn the hand edits of an installed engine into a new patch of a store (patch-package's
`npx patch-package PKG`, quilt's new + refresh): every file that differs from its release and belongs
to no applied patch becomes one `git format-patch` variant for the installed version, pinned and
appended to the series."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, fetch_options, target_options, wait_option
from patchctl.core.errors import EXIT_OK, UsageError
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.sources.fetch import SourceContext
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.target import Target

STORE_HELP = (
    "Store to write the patch into (created when missing; default: $PATCHCTL_STORE). The bundled patch "
    "set is written only when named here."
)
FILE_HELP = "Only this file (relative to the import root, or a path into the tree; repeatable)."


def run(
    engine: str,
    name: str,
    where: TargetSpec,
    store_dir: str | None,
    ctx: SourceContext,
    *,
    files: tuple[str, ...] = (),
    title: str | None = None,
    why: str | None = None,
    wait: float = 0.0,
) -> tuple[dict, int]:
    from patchctl.patching import capture
    from patchctl.sources import fetch
    from patchctl.tree import edits as ed
    from patchctl.tree.find import find_target
    from patchctl.tree.target import check_paths

    store_root = capture.writable_store(store_dir)
    capture.check_new_name(store_root, engine, name)
    target = find_target(parse_spec(engine), where)
    scan = ed.scan(target, ctx=ctx, files=files)
    label = f"{target.engine.name} {target.version}"
    warnings = [
        f"{p} does not differ from {label}: left out" for p in _named(target, files) if p not in {e.path for e in scan.edits}
    ]
    left_on_top = [e.path for e in scan.on_top if e not in scan.edits]
    if left_on_top:
        warnings.append(
            f"{len(left_on_top)} file(s) changed on top of the applied patches, left out: "
            f"{', '.join(left_on_top)} (`patchctl refresh {engine} PATCH` takes an edit into its patch; "
            f"--file PATH takes it into this one)"
        )
    if not scan.edits:
        besides = len(scan.managed)
        raise UsageError(
            f"no file of {label} differs from its release"
            + (f" besides the {besides} file(s) the applied patches wrote" if besides else ""),
            hint=(
                "edit the installed files first, then run this again"
                if not scan.on_top
                else f"{', '.join(left_on_top)} changed on top of the applied patches: "
                f"`patchctl refresh {engine} PATCH`, or name them with --file"
            ),
        )
    release = fetch.release(target.engine, target.version, ctx)
    pristine = ed.pristine_bytes(target, release, scan.edits)
    pairs, skipped = capture.text_only(
        {e.path: (ed.base_bytes(target, e, pristine[e.path]), ed.current_bytes(target, e.path)) for e in scan.edits},
        named=_named(target, files),
    )
    warnings += skipped
    check_paths(target, list(pairs))
    if not pairs:
        raise UsageError(f"no file of {label} that differs from its release is text: nothing a variant can carry")
    title = title or capture.TITLE_PLACEHOLDER
    why = why or capture.WHY_PLACEHOLDER
    data = capture.build_variant(pairs, title, why)
    capture.verify(data, pairs, f"{engine}/{name}/{target.version}.patch")
    written = capture.write_new_patch(store_root, engine, name, target.version, data, title=title, why=why)
    refused = ed.adopt(
        target,
        name,
        written.variant.name,
        {p: (pristine[p], after) for p, (_, after) in pairs.items()},
        wait=wait,
        store=store_root,
        variant_sha256=written.sha256,
    )
    if refused:
        warnings.append(refused)
    unfinished = [key for key, value in (("title", title), ("why", why)) if capture.is_placeholder(value)]
    message = (
        f"wrote {written.variant} ({len(pairs)} file(s), pinned in {store_root / engine / 'series.yaml'}); "
        f"next: `patchctl check {engine}@{target.version} --store {store_root}`"
    )
    if unfinished:
        message += (
            f"; fill in {' and '.join(unfinished)} in {written.patch_dir / 'patch.yaml'} (`patchctl lint` "
            f"lists them until then), then `patchctl refresh {engine} {name} --store {store_root}` puts them into "
            f"the variant"
        )
    return document(
        "new",
        EXIT_OK,
        engine=target.engine.name,
        version=str(target.version),
        target=str(target.root),
        store=str(store_root),
        patch=name,
        variant=str(written.variant),
        sha256=written.sha256,
        compared_with=scan.how,
        files=[e.as_json() for e in scan.edits if e.path in pairs],
        on_top=[e.as_json() for e in scan.on_top],
        recorded=refused is None,
        unfinished=unfinished,
        message=message,
        warnings=warnings,
    ), EXIT_OK


def _named(target: Target, files: tuple[str, ...]) -> list[str]:
    from patchctl.tree.edits import inside_engine

    return [inside_engine(target, f) for f in files]


def render(doc: dict, out: Console, err: Console) -> None:
    for f in doc.get("files", []):
        out.print(f"  {f['status']:<9} {f['path']}", markup=False, highlight=False)


@patchctl_command(
    "new",
    render=render,
    example=(
        "patchctl new vllm glm5-rope-fix --store ~/patches --title 'Fix GLM-5 RoPE scaling' --why 'garbage past 32k'",
        "patchctl new sglang my-fix --target ./site-packages --store ./patches --file sglang/srt/server_args.py",
        "PATCHCTL_STORE=~/patches patchctl new vllm my-fix --python /opt/vllm/bin/python --json",
    ),
)
@click.argument("engine", type=ENGINE, metavar="ENGINE")
@click.argument("name", metavar="NAME")
@target_options
@click.option("--store", "store_dir", type=click.Path(file_okay=False), help=STORE_HELP)
@click.option("--file", "files", multiple=True, metavar="PATH", help=FILE_HELP)
@click.option("--title", help="One line: what the patch fixes (default: a TODO placeholder `patchctl lint` reports).")
@click.option("--why", help="What breaks without it, for whom (default: a TODO placeholder).")
@wait_option
@fetch_options
def command(
    engine: str,
    name: str,
    where: TargetSpec,
    store_dir: str | None,
    files: tuple[str, ...],
    title: str | None,
    why: str | None,
    wait: float,
    ctx: SourceContext,
) -> tuple[dict, int]:
    """Turn the hand edits of an installed ENGINE into a new patch NAME.

    Every file of the engine that differs from its release (by the dist-info RECORD's sha256s, else
    against the release on the package index) and belongs to no applied patch goes into
    <store>/ENGINE/NAME/<installed version>.patch, appended to the series and pinned. The tree's record
    then lists NAME as applied: `status` reports it intact, `revert` restores the release's files.
    """
    return run(engine, name, where, store_dir, ctx, files=files, title=title, why=why, wait=wait)
