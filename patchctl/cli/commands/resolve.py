"""`patchctl resolve`: record a person's resolution of a rebase conflict (versioned rerere) and write
the patch's new variant."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, VERSION, store_option
from patchctl.core.errors import EXIT_OK

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.store.layered import Store


def run(engine: str, store: Store, workdir: Path, patch: str, onto: Version) -> tuple[dict, int]:
    from patchctl.rebase.rerere import record_resolution

    filename = record_resolution(store, engine, workdir, patch, onto)
    return document(
        "resolve",
        EXIT_OK,
        engine=engine,
        patch=patch,
        written=filename,
        message=f"recorded the resolution and wrote {patch}/{filename}; review both with `git diff`, then commit",
    ), EXIT_OK


@patchctl_command(
    "resolve",
    example=(
        "patchctl rebase vllm --onto 0.24.0 --workdir /tmp/rb      leaves /tmp/rb/conflicts/PATCH",
        "  (edit the files there, remove the markers)",
        "patchctl resolve vllm /tmp/rb --patch gguf-glm-dsa --onto 0.24.0",
    ),
)
@click.argument("engine", type=ENGINE)
@click.argument("workdir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--patch", "patch", required=True, metavar="NAME", help="The patch whose conflict worktree a person resolved.")
@click.option("--onto", required=True, type=VERSION, help="The version the rebase was onto.")
@store_option
def command(engine: str, workdir: Path, patch: str, onto: Version, store: Store) -> tuple[dict, int]:
    """Record a person's conflict resolution (versioned rerere) and write the new variant."""
    return run(engine, store, workdir, patch, onto)
