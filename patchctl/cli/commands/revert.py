"""`patchctl revert`: restore every file patchctl wrote in a target, byte for byte (with its mtime and
bytecode); with --from-release, restore the release's own files when patchctl's record is damaged."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.image_options import ImageOptions, image_options
from patchctl.cli.options import fetch_options, store_option, target_options, wait_option
from patchctl.core.errors import EXIT_OK
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store
    from patchctl.tree.find import TargetSpec


def run(spec: str, where: TargetSpec, *, force: bool = False, wait: float = 0.0) -> tuple[dict, int]:
    from patchctl.cli.tree_documents import revert_document
    from patchctl.tree import service
    from patchctl.tree.find import find_target

    target = find_target(parse_spec(spec), where)
    return revert_document(service.revert(target, force=force, wait=wait)), EXIT_OK


def run_patches(
    spec: str, names: tuple[str, ...], where: TargetSpec, store: Store, ctx: SourceContext, *, wait: float = 0.0
) -> tuple[dict, int]:
    """`revert --patch P`: P out, the other applied patches left applied (tree.service.revert_patches),
    from the stores the tree's record names; the record's choice then leaves P out for `ensure`."""
    from patchctl.cli.tree_documents import revert_document
    from patchctl.tree import service
    from patchctl.tree.find import find_target
    from patchctl.tree.stores import Stores

    target = find_target(parse_spec(spec), where)
    return revert_document(service.revert_patches(target, names, Stores(store), ctx, wait=wait)), EXIT_OK


def run_from_release(spec: str, where: TargetSpec, store: Store, ctx: SourceContext, *, wait: float = 0.0) -> tuple[dict, int]:
    """The way out of a damaged record or journal: no guess at what patchctl did. Every file the series
    can touch at this version, and every file the dist-info RECORD says differs, gets the release's
    own bytes (read from its artifact, checked against the wheel's RECORD). The variants are read as
    check and apply read them: pinned, and refused when they name a file outside the engine's packages
    (tree.target.check_paths refuses it again before anything is written)."""
    from patchctl.cli.tree_documents import revert_document
    from patchctl.tree import service
    from patchctl.tree.find import find_target

    target = find_target(parse_spec(spec), where)
    return revert_document(service.revert_from_release(target, store, ctx, wait=wait)), EXIT_OK


@patchctl_command(
    "revert",
    example=(
        "patchctl revert vllm",
        "patchctl revert sglang --target ./site-packages --force    also files edited since",
        "patchctl revert vllm --from-release      the record is damaged: the release's own files back",
        "patchctl revert sglang --patch bench-fix   only that patch out; ensure keeps it out",
    ),
)
@click.argument("spec", metavar="ENGINE")
@target_options
@wait_option
@click.option("--force", is_flag=True, help="Restore files even if they changed since they were patched.")
@click.option(
    "--from-release",
    is_flag=True,
    help="Ignore patchctl's (damaged) record: restore the release's own files, fetched from the "
    "package index and checked against the wheel's RECORD.",
)
@click.option(
    "--patch",
    "patches",
    multiple=True,
    metavar="NAME",
    help="Take only this patch out (repeatable), leaving the others applied; refused while an applied "
    "patch depends on it, unless named too. Recorded: `ensure` keeps it out.",
)
@store_option
@fetch_options
@image_options(writes=True)
def command(
    spec: str,
    where: TargetSpec,
    wait: float,
    force: bool,
    from_release: bool,
    patches: tuple[str, ...],
    store: Store,
    ctx: SourceContext,
    image: ImageOptions | None,
) -> tuple[dict, int]:
    """Restore every patched file byte for byte (--patch: take one patch out, keep the rest; --image REF
    --to REF2: push the image it was made from)."""
    if image:
        from patchctl.cli import image_command

        return image_command.revert(spec, image)
    if from_release:
        return run_from_release(spec, where, store, ctx, wait=wait)
    if patches:
        if force:
            from patchctl.core.errors import UsageError

            raise UsageError("--force restores every file; with --patch the tree must be intact")
        return run_patches(spec, patches, where, store, ctx, wait=wait)
    return run(spec, where, force=force, wait=wait)
