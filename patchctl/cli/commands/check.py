"""`patchctl check`: dry-run the series on the pristine files of one upstream version (nothing installed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import moved_warnings, print_outcomes
from patchctl.cli.documents import document, series_json
from patchctl.cli.options import apply_options, only_option, source_options, store_option
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.patching.evaluate import Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store


def run(spec: str, store: Store, ctx: SourceContext, options: Options, *, only: tuple[str, ...] = ()) -> tuple[dict, int]:
    from patchctl.patching.evaluate import evaluate, needed_paths
    from patchctl.sources import fetch, registry
    from patchctl.store.selection import unknown_names

    ref = parse_spec(spec)
    series = store.series(ref.engine.name).patches
    unknown_names(series, only, ref.engine.name)  # as apply and smoke: a misspelt --patch is no empty pass
    # The index answers (its connection's handshakes included) while the series and its variants are
    # read here: the two are independent, and a cold check is its round trips plus this CPU.
    upstream_when_ready = registry.open_upstream_soon(ref, ctx)
    patches = tuple(p for p in series if not only or p.name in only)
    if ref.version is not None:
        needed_paths(patches, ref.version, options.allow_modified)  # parses (and keeps) the variants
    upstream = upstream_when_ready()
    result = evaluate(
        patches, upstream.version, upstream.source, options=options, base_files=fetch.base_files_for(ref.engine, ctx)
    )
    code = EXIT_OK if result.ok else EXIT_PATCH_FAILED
    source = upstream.source.provenance()._asdict()
    return document(
        "check",
        code,
        engine=ref.engine.name,
        version=str(upstream.version),
        source=source,
        patches=series_json(result),
        # cache files that were not what they claimed, read again (source.refetched): said here too
        warnings=moved_warnings(ref.engine, upstream.version) + list(source.get("refetched", [])),
    ), code


def render(doc: dict, out: Console, err: Console) -> None:
    print_outcomes(out, doc)


@patchctl_command(
    "check",
    render=render,
    example=(
        "patchctl check vllm@0.23.0              every vLLM patch against the 0.23.0 release",
        "patchctl check vllm@latest --patch gguf-glm-dsa",
        "patchctl check sglang@nightly --json    SGLang's main branch, as one JSON document",
        "patchctl check vllm@./my-checkout       a local tree",
    ),
)
@click.argument("spec", metavar="ENGINE@VERSION")
@only_option
@store_option
@source_options
@apply_options
def command(spec: str, only: tuple[str, ...], store: Store, ctx: SourceContext, options: Options) -> tuple[dict, int]:
    """Dry-run the patch series on the pristine files of ENGINE@VERSION (no install, no GPU).

    VERSION is X.Y.Z, latest, nightly, commit:SHA, git:REF, file:PATH (a wheel or sdist) or a directory.
    """
    return run(spec, store, ctx, options, only=only)
