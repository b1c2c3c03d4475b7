from __future__ import annotations

from pathlib import Path

from patchctl.engine import evaluate as engine_apply
from patchctl import report
from patchctl.sources import fetch
from patchctl.commands.common import base_files_for
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED, UsageError
from patchctl.sources.base import DirectorySource
from patchctl.sources.release import ReleaseSource
from patchctl.spec import EngineRef
from patchctl.store import Store


def export(ref: EngineRef, dest: Path, store: Store, ctx: fetch.SourceContext, options: engine_apply.Options,
           *, full: bool) -> tuple[dict, int]:
    """Write the patched files of a release under DEST (an overlay for PYTHONPATH), or with --full
    the whole patched source tree of the release."""
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(f"{dest} exists and is not empty")
    upstream = fetch.open_upstream(ref, ctx)
    if full and not isinstance(upstream.source, (ReleaseSource, DirectorySource)):
        raise UsageError("--full needs a release or a directory as the source")
    result = engine_apply.evaluate(store.series(ref.engine.name).patches, upstream.version, upstream.source,
                                   options=options, base_files=base_files_for(ref.engine, ctx))
    doc_fields = dict(engine=ref.engine.name, version=str(upstream.version),
                      source=upstream.source.provenance()._asdict(), patches=report.series_json(result),
                      destination=str(dest))
    if not result.ok:
        return report.document("export", EXIT_PATCH_FAILED, written=[], **doc_fields), EXIT_PATCH_FAILED
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
    note = f"wrote {len(written)} patched file(s) to {dest}"
    return report.document("export", EXIT_OK, written=written, note=note, **doc_fields), EXIT_OK


def _copy_tree(source, engine, dest: Path) -> None:
    import shutil

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
