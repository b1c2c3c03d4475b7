from __future__ import annotations

from patchctl.engine import evaluate as engine_apply
from patchctl import report
from patchctl.sources import fetch
from patchctl.commands.common import base_files_for
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.spec import EngineRef
from patchctl.store import Store


def check(ref: EngineRef, store: Store, ctx: fetch.SourceContext, options: engine_apply.Options,
          *, only: tuple[str, ...] = ()) -> tuple[dict, int]:
    """Dry-run the engine's series on the pristine files of one upstream version."""
    upstream = fetch.open_upstream(ref, ctx)
    series = store.series(ref.engine.name)
    patches = tuple(p for p in series.patches if not only or p.name in only)
    result = engine_apply.evaluate(patches, upstream.version, upstream.source, options=options,
                                   base_files=base_files_for(ref.engine, ctx))
    code = EXIT_OK if result.ok else EXIT_PATCH_FAILED
    provenance = upstream.source.provenance()
    return report.document(
        "check", code, engine=ref.engine.name, version=str(upstream.version),
        source=provenance._asdict(), patches=report.series_json(result),
        warnings=moved_warnings(ref.engine, upstream.version),
    ), code


def moved_warnings(engine, version) -> list[str]:
    return [f"from {m.since} {engine.name}'s {m.what} lives in {m.engine}; its patches are in the "
            f"{m.engine} series (`patchctl check {m.engine}@VERSION`)" for m in engine.moves_at(version)]
