"""`patchctl export`: a release's patched files (an overlay for PYTHONPATH) or, with --full, the whole
patched package, written to a directory — for reading, for a patch's checks, or to copy onto a box."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import print_outcomes
from patchctl.cli.documents import document, series_json
from patchctl.cli.options import apply_options, source_options, store_option
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED, UsageError
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.core.engines import Engine
    from patchctl.patching.evaluate import Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.files import FileSource
    from patchctl.store.layered import Store


def run(spec: str, dest: Path, store: Store, ctx: SourceContext, options: Options, *, full: bool = False) -> tuple[dict, int]:
    from patchctl.patching.evaluate import evaluate
    from patchctl.sources import fetch, registry

    ref = parse_spec(spec)
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest} exists and is not empty")
    upstream = registry.open_upstream(ref, ctx)
    # --full: the ref's kind says what the whole package is copied from (a release's wheel, where
    # `check` would read its sdist; a nightly's wheel; a file on disk; a directory).
    source = registry.kind_named(ref.kind).full_source(upstream, ctx) if full else upstream.source
    result = evaluate(
        store.series(ref.engine.name).patches,
        upstream.version,
        source,
        options=options,
        base_files=fetch.base_files_for(ref.engine, ctx),
    )
    fields = dict(engine=ref.engine.name, version=str(upstream.version), patches=series_json(result), destination=str(dest))
    if not result.ok:
        return document(
            "export", EXIT_PATCH_FAILED, written=[], source=source.provenance()._asdict(), **fields
        ), EXIT_PATCH_FAILED
    # A full tree is built beside dest and moved there whole: a member that fails its check leaves
    # nothing behind at dest.
    work = dest.with_name(f".{dest.name}.patchctl-{os.getpid()}") if full else dest
    work.mkdir(parents=True, exist_ok=True)
    try:
        if full:
            _copy_tree(source, ref.engine, work)
        written = []
        for change in result.changes:
            path = work / change.path
            if change.after is None:
                path.unlink(missing_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(change.after)
            written.append(change.path)
        if full:
            if dest.exists():
                dest.rmdir()  # empty, checked above
            os.replace(work, dest)
    finally:
        if full:
            shutil.rmtree(work, ignore_errors=True)
    if not full:
        _make_packages_importable(dest, written)
    note = (
        f"wrote the whole package ({', '.join(ref.engine.packages)}) to {dest}, {len(written)} of its file(s) patched"
        if full
        else f"wrote {len(written)} patched file(s) to {dest}"
    )
    # The provenance after the copy: its bytes_fetched counts the download of the whole artifact.
    provenance = source.provenance()._asdict()
    return document(
        "export", EXIT_OK, written=written, note=note, source=provenance, warnings=list(provenance.get("refetched", [])), **fields
    ), EXIT_OK


def _copy_tree(source: FileSource, engine: Engine, dest: Path) -> None:
    from patchctl.sources.files import DirectorySource
    from patchctl.sources.release import ReleaseSource

    if isinstance(source, DirectorySource):
        for package in engine.packages:
            shutil.copytree(source.root / package, dest / package, dirs_exist_ok=True)
        return
    assert isinstance(source, ReleaseSource)  # full_source answers a directory or a release artifact
    # A whole tree: one download beats thousands of range reads; members stream from the cached
    # artifact to disk with their modes (vLLM's ~270 MB wheel in well under 200 MB of memory).
    source.sparse = False
    source.extract(tuple(p + "/" for p in engine.packages), dest)


def _make_packages_importable(dest: Path, written: list[str]) -> None:
    """An overlay holds only patched files; a note explains how to use it."""
    (dest / "PATCHCTL_OVERLAY.txt").write_text(
        "Patched files only. Copy them over the installed package, or build the full tree with\n"
        "`patchctl export --full`.\n" + "".join(f"{w}\n" for w in written)
    )


def render(doc: dict, out: Console, err: Console) -> None:
    print_outcomes(out, doc)


@patchctl_command(
    "export",
    render=render,
    example=(
        "patchctl export vllm@0.23.0 /tmp/overlay          only the patched files",
        "patchctl export vllm@0.23.0 /tmp/vllm --full      the whole patched package",
    ),
)
@click.argument("spec", metavar="ENGINE@VERSION")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--full", is_flag=True, help="Write the whole patched package, not only the patched files.")
@store_option
@source_options
@apply_options
def command(spec: str, dest: Path, full: bool, store: Store, ctx: SourceContext, options: Options) -> tuple[dict, int]:
    """Write the patched files (or with --full the patched package) of ENGINE@VERSION to DEST."""
    return run(spec, dest, store, ctx, options, full=full)
