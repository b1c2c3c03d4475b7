"""`patchctl smoke`: run the patches' own checks (cpu or gpu tier) against the patched tree of a release.
The serve tier is `patchctl validate`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import Literal, coloured, table
from patchctl.cli.documents import document
from patchctl.cli.options import checks_python_option, only_option, source_options, store_option
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from collections.abc import Callable

    from patchctl.cli.commands.text import Console
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store


def run(
    spec: str,
    store: Store,
    ctx: SourceContext,
    *,
    only: tuple[str, ...] = (),
    tier: str = "cpu",
    python: str | None = None,
    notify: Callable[[str], None] | None = None,
) -> tuple[dict, int]:
    from patchctl.smoke.suite import run_smoke

    done = run_smoke(parse_spec(spec), store, ctx, only=only, tier=tier, python=python, notify=notify)
    code = EXIT_PATCH_FAILED if done.failed else EXIT_OK
    return document(
        "smoke",
        code,
        engine=done.engine,
        version=done.version,
        tier=done.tier,
        source=done.source,
        results=[r._asdict() for r in done.results],
    ), code


def render(doc: dict, out: Console, err: Console) -> None:
    if doc.get("results") is None:
        return
    t = table(
        f"smoke {doc.get('engine')} {doc.get('version')} ({doc.get('tier')} tier)",
        ["patch", "status", "passed", "failed", "skipped", "seconds", "detail"],
    )
    for r in doc["results"]:
        color = {"passed": "green", "failed": "bold red", "error": "bold red"}.get(r["status"], "yellow")
        t.add_row(
            r["patch"],
            coloured(r["status"], color),
            str(r["passed"]),
            str(r["failed"]),
            str(r["skipped"]),
            f"{r['seconds']:.1f}",
            Literal(r["reason"]),
        )
    out.print(t)
    for r in doc["results"]:
        for f in r.get("failures", []):
            out.print(f"  {r['patch']}: {f}", markup=False, highlight=False)


def _notify(text: str) -> None:
    """Progress lines for long work, on stderr so that --json output stays one document."""
    click.echo(f"patchctl: {text}", err=True)


@patchctl_command(
    "smoke",
    render=render,
    example=(
        "patchctl smoke vllm@0.23.0                        CPU checks of every vLLM patch that applies",
        "patchctl smoke vllm@0.23.0 --patch triton-sparse-mla --tier gpu --python ~/venvs/gpu/bin/python",
        "patchctl smoke vllm@nightly                       the same on the build vLLM published last night",
    ),
)
@click.argument("spec", metavar="ENGINE@VERSION")
@only_option
@click.option(
    "--tier",
    type=click.Choice(["cpu", "gpu"]),
    default="cpu",
    show_default=True,
    help="cpu: checks that run anywhere; gpu: those marked gpu (needs CUDA).",
)
@checks_python_option
@store_option
@source_options
def command(
    spec: str, only: tuple[str, ...], tier: str, python: str | None, store: Store, ctx: SourceContext
) -> tuple[dict, int]:
    """Run the patches' smoke checks against the patched tree of ENGINE@VERSION.

    A running server is validated by `patchctl validate`.
    """
    return run(spec, store, ctx, only=only, tier=tier, python=python, notify=_notify)
