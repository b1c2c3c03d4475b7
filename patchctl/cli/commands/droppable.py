"""`patchctl droppable`: which patches' drop_when rules hold on the newest release, so they can be
deleted once no supported deployment runs an older version."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, source_options, store_option
from patchctl.core.errors import EXIT_OK

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store


def run(store: Store, ctx: SourceContext, engines: tuple[str, ...] = ()) -> tuple[dict, int]:
    from patchctl.core.engines import get_engine
    from patchctl.patching.evaluate import evaluate
    from patchctl.sources import fetch
    from patchctl.store.series import drop_rule_met

    rows = []
    for engine in engines or tuple(store.engines()):
        eng = get_engine(engine)
        latest = fetch.latest_release(eng, ctx)
        series = store.series(engine).patches
        outcomes = None
        for patch in series:
            met = drop_rule_met(patch, eng.dist, latest)
            why = f"{patch.drop_when} holds for {latest}" if met else None
            if patch.drop_when == "upstreamed" and patch.upstreamed_at(latest):
                met, why = True, f"upstreamed_in {patch.upstreamed_in} covers {latest}"
            elif patch.drop_when == "upstreamed":
                if outcomes is None:
                    outcomes = evaluate(series, latest, fetch.release(eng, latest, ctx))
                met = outcomes.outcome_of(patch.name).outcome == "upstreamed"
                why = f"upstreamed in {latest} (reverse-apply proof)" if met else None
            rows.append(
                {
                    "engine": engine,
                    "patch": patch.name,
                    "drop_when": patch.drop_when,
                    "latest": str(latest),
                    "droppable": bool(met),
                    "why": why,
                }
            )
    names = [f"{r['engine']}/{r['patch']} ({r['why']})" for r in rows if r["droppable"]]
    message = (
        "can be deleted once no supported deployment runs an older version: " + "; ".join(names)
        if names
        else "no patch can be dropped yet"
    )
    return document("droppable", EXIT_OK, patches=rows, message=message), EXIT_OK


def render(doc: dict, out: Console, err: Console) -> None:
    for row in doc.get("patches", []):
        mark = "drop" if row["droppable"] else "keep"
        out.print(f"  {mark}  {row['engine']}/{row['patch']}  drop_when={row['drop_when']}", markup=False, highlight=False)


@patchctl_command(
    "droppable",
    render=render,
    example=(
        "patchctl droppable                every engine in the store",
        "patchctl droppable vllm --json",
    ),
)
@click.argument("engines", nargs=-1, type=ENGINE, metavar="[ENGINE]...")
@store_option
@source_options
def command(engines: tuple[str, ...], store: Store, ctx: SourceContext) -> tuple[dict, int]:
    """Evaluate drop_when rules on the newest release: which patches can be deleted."""
    return run(store, ctx, engines)
