"""`patchctl list`: the series of each engine, and which variant a given version would get and why."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import table
from patchctl.cli.documents import document
from patchctl.cli.options import source_options, store_option
from patchctl.core.errors import EXIT_OK

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store


def run(store: Store, spec: str | None = None, ctx: SourceContext | None = None) -> tuple[dict, int]:
    from patchctl.sources.spec import parse_spec
    from patchctl.store.series import choose_variant, drop_rule_met

    ref = parse_spec(spec) if spec else None
    engine = ref.engine.name if ref else None
    version = ref.version if ref and ref.kind == "exact" else None
    if ref is not None and ref.kind == "latest":  # was ignored: `list vllm@latest` showed no version
        from patchctl.sources.fetch import SourceContext, latest_release

        version = latest_release(ref.engine, ctx or SourceContext())
    elif ref is not None and ref.kind not in ("exact", "installed"):
        # Any other upstream (nightly, a commit, a file, a directory, an image) is asked for its
        # version through the kinds' registry, as check asks it; list writes nothing either way.
        from patchctl.sources.fetch import SourceContext
        from patchctl.sources.registry import open_upstream

        version = open_upstream(ref, ctx or SourceContext()).version
    from patchctl.store.layered import store_kind

    kinds: dict[Path, str] = {}  # store root -> bundled | user, asked once per store
    rows = []
    for name in [engine] if engine else store.engines():
        dist = ref.engine.dist if ref else _dist(name)
        for position, patch in enumerate(store.series(name).patches, start=1):
            row = {
                "engine": name,
                "position": position,
                "name": patch.name,
                "title": patch.title,
                "applies_to": str(patch.applies_to),
                "drop_when": patch.drop_when,
                "requires": list(patch.requires),
                "depends_on": list(patch.depends_on),
                "upstream": list(patch.upstream),
                "variants": [v.filename for v in patch.variants],
                "store": str(store.store_of(patch)),
                "store_kind": kinds.setdefault(store.store_of(patch), store_kind(store.store_of(patch))),
            }
            if version is not None:
                choice = choose_variant(patch, version)
                row["chosen_variant"] = choice.variant.filename if choice.variant else None
                row["why"] = choice.reason
                row["drop_rule_met"] = drop_rule_met(patch, dist, version)
            rows.append(row)
    return document("list", EXIT_OK, engine=engine, version=str(version) if version else None, series=rows), EXIT_OK


def _dist(engine: str) -> str:
    from patchctl.core.engines import get_engine

    return get_engine(engine).dist


def render(doc: dict, out: Console, err: Console) -> None:
    versioned = bool(doc.get("version"))
    columns = ["engine", "#", "patch", "applies_to", "variants", "store"] + (["chosen", "why"] if versioned else [])
    t = table("series" + (f" for {doc['engine']} {doc['version']}" if versioned else ""), columns)
    for row in doc["series"]:
        # The bundled set by its name (its path is deep in site-packages); a store of yours by its path.
        where = "bundled" if row["store_kind"] == "bundled" else row["store"]
        cells = [row["engine"], str(row["position"]), row["name"], row["applies_to"], " ".join(row["variants"]), where]
        if versioned:
            cells += [row.get("chosen_variant") or "-", row.get("why") or ""]
        t.add_row(*cells)
    out.print(t)


@patchctl_command(
    "list",
    render=render,
    example=(
        "patchctl list                     every engine's series",
        "patchctl list vllm@0.23.0         which variant each vLLM patch uses on 0.23.0, and why",
        "patchctl list sglang@latest       the same for the newest release on the index",
    ),
)
@click.argument("spec", metavar="[ENGINE[@VERSION]]", required=False)
@store_option
@source_options
def command(spec: str | None, store: Store, ctx: SourceContext) -> tuple[dict, int]:
    """The series, and which variant would be chosen for ENGINE@VERSION (or @latest) and why."""
    return run(store, spec, ctx)
