"""`patchctl apply`: the series onto an installed engine or a directory, all or nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import print_outcomes
from patchctl.cli.image_options import ImageOptions, image_options
from patchctl.cli.options import writer_options
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.patching.options import Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.tree.bookkeeping import Selection
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.stores import Stores


def run(
    spec: str,
    stores: Stores,
    ctx: SourceContext,
    options: Options,
    where: TargetSpec,
    *,
    install: bool = False,
    keep_going: bool = False,
    dry_run: bool = False,
    wait: float = 0.0,
    force: bool = False,
    no_deps: bool = False,
    selection: Selection | None = None,
) -> tuple[dict, int]:
    from patchctl.cli.tree_documents import apply_document
    from patchctl.tree import service

    request = service.ApplyRequest(stores, options, ctx, service.Mode.APPLY, selection, keep_going, dry_run, force, wait)
    result = service.apply(parse_spec(spec), where, request, install=install, no_deps=no_deps)
    return apply_document(result, "apply", dry_run=dry_run, install=install)


def render(doc: dict, out: Console, err: Console) -> None:
    for d in [doc, *doc.get("also", [])]:
        print_outcomes(out, d)


@patchctl_command(
    "apply",
    render=render,
    example=(
        "patchctl apply vllm                      the vLLM installed for python3",
        "patchctl apply vllm --python ~/venvs/serve/bin/python --dry-run",
        "patchctl apply sglang@0.5.9 --target ./site-packages",
        "patchctl apply vllm@0.23.0 --install     pip-install 0.23.0 first, then patch it",
        "patchctl apply vllm@nightly --install    install the nightly check resolves (by its wheel's URL), then patch it",
        "patchctl apply sglang --image reg.example/sglang:0.5.9 --to reg.example/sglang:0.5.9-patched",
    ),
)
@click.argument("spec", metavar="ENGINE[@VERSION]")
@writer_options
@click.option(
    "--install",
    is_flag=True,
    help="Install exactly the named build first (a nightly by its wheel's URL, git:REF by its commit; "
    "uv when on PATH, else pip), then patch it.",
)
@click.option("--no-deps", is_flag=True, help="With --install: install the engine only, not its dependencies.")
@click.option("--keep-going", is_flag=True, help="Apply the patches that apply even if others conflict.")
@click.option("--dry-run", is_flag=True, help="Report what would happen; write nothing.")
@click.option("--force", is_flag=True, help="Apply even if patched files were changed by hand since.")
@image_options(writes=True)
def command(
    spec: str,
    where: TargetSpec,
    ctx: SourceContext,
    stores: Stores,
    options: Options,
    wait: float,
    install: bool,
    no_deps: bool,
    keep_going: bool,
    dry_run: bool,
    force: bool,
    selection: Selection | None,
    image: ImageOptions | None,
) -> tuple[dict, int]:
    """Apply the series to the installed engine (or --target DIR, or --image REF --to REF2), all or nothing.

    --patch/--exclude choose the patches and --store the stores; both are recorded in the tree, and
    with neither, apply (as `ensure`) keeps what the record names. A patch taken out is named.
    """
    if image:
        from patchctl.cli import image_command

        return image_command.apply(
            spec, image, stores, ctx, options, keep_going=keep_going, dry_run=dry_run, force=force, wait=wait, selection=selection
        )
    return run(
        spec,
        stores,
        ctx,
        options,
        where,
        install=install,
        keep_going=keep_going,
        dry_run=dry_run,
        wait=wait,
        force=force,
        no_deps=no_deps,
        selection=selection,
    )
