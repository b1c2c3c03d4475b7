"""`patchctl export`: a release's patched files (an overlay for PYTHONPATH) or, with --full, the whole
patched package, written to a directory — for reading, for a patch's checks, or to copy onto a box."""
from __future__ import annotations

from pathlib import Path

import click

from patchctl.commands.base import patchctl_command
from patchctl.commands.text import print_outcomes
from patchctl.documents import document, series_json
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED, UsageError
from patchctl.options import apply_options, source_options, store_option
from patchctl.spec import parse_spec


def run(spec: str, dest: Path, store, ctx, options, *, full: bool = False) -> tuple[dict, int]:
    from patchctl.engine.evaluate import evaluate
    from patchctl.sources import fetch
    from patchctl.sources.base import DirectorySource
    from patchctl.sources.release import ReleaseSource

    ref = parse_spec(spec)
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest} exists and is not empty")
    upstream = fetch.open_upstream(ref, ctx)
    if full and not isinstance(upstream.source, (ReleaseSource, DirectorySource)):
        raise UsageError("--full needs a release or a directory as the source")
    result = evaluate(store.series(ref.engine.name).patches, upstream.version, upstream.source,
                      options=options, base_files=fetch.base_files_for(ref.engine, ctx))
    fields = dict(engine=ref.engine.name, version=str(upstream.version),
                  source=upstream.source.provenance()._asdict(), patches=series_json(result),
                  destination=str(dest))
    if not result.ok:
        return document("export", EXIT_PATCH_FAILED, written=[], **fields), EXIT_PATCH_FAILED
    dest.mkdir(parents=True, exist_ok=True)
    if full:
        _copy_tree(upstream.source, ref.engine, dest)
    written = []
    for change in result.changes:
        path = dest / change.path
        if change.after is None:
            path.unlink(missing_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(change.after)
        written.append(change.path)
    if not full:
        _make_packages_importable(dest, written)
    return document("export", EXIT_OK, written=written, note=f"wrote {len(written)} patched file(s) to {dest}",
                    **fields), EXIT_OK


def _copy_tree(source, engine, dest: Path) -> None:
    import shutil

    from patchctl.sources.base import DirectorySource

    if isinstance(source, DirectorySource):
        for package in engine.packages:
            shutil.copytree(source.root / package, dest / package, dirs_exist_ok=True)
        return
    source.sparse = False  # a whole tree: one download beats thousands of range reads
    archive_paths = source.files_under(engine.packages[0] + "/")
    source.prefetch(archive_paths)
    for rel in archive_paths:
        data = source.read(rel)
        if data is not None:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)


def _make_packages_importable(dest: Path, written: list[str]) -> None:
    """An overlay holds only patched files; a note explains how to use it."""
    (dest / "PATCHCTL_OVERLAY.txt").write_text(
        "Patched files only. Copy them over the installed package, or build the full tree with\n"
        "`patchctl export --full`.\n" + "".join(f"{w}\n" for w in written)
    )


def render(doc: dict, out, err) -> None:
    print_outcomes(out, doc)


@patchctl_command("export", render=render, example=(
    "patchctl export vllm@0.23.0 /tmp/overlay          only the patched files",
    "patchctl export vllm@0.23.0 /tmp/vllm --full      the whole patched package",
))
@click.argument("spec", metavar="ENGINE@VERSION")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--full", is_flag=True, help="Write the whole patched package, not only the patched files.")
@store_option
@source_options
@apply_options
def command(spec, dest, full, store, ctx, options):
    """Write the patched files (or with --full the patched package) of ENGINE@VERSION to DEST."""
    return run(spec, dest, store, ctx, options, full=full)
