"""`patchctl matrix`: every patch × every release from the oldest any patch claims → compat_matrix.yaml
(with Markdown and HTML renderings), and its `merge` (CI shards) and `diff` (regressions) subcommands."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import examples, run_and_exit
from patchctl.cli.commands.framework import patchctl_command as subcommand
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, checks_python_option, json_option, source_options, store_option
from patchctl.core.atomic import write_atomic
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED, UsageError

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.matrix.build import ImageStatus, SmokeRunner
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.spec import EngineRef
    from patchctl.store.layered import Store


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected I/N, e.g. 2/4") from None
    if not 1 <= i <= n:
        raise UsageError(f"--shard {text!r}: I must be between 1 and N")
    return i, n


def smoke_runner(store: Store, ctx: SourceContext, python: str | None) -> SmokeRunner:
    """(engine, version) -> {patch: smoke result}, for matrix cells that claim more than 'applies'."""
    from patchctl.core.engines import get_engine
    from patchctl.smoke.suite import run_smoke
    from patchctl.sources.spec import EngineRef

    def run_cells(engine: str, version: Version, ref: EngineRef | None = None) -> dict[str, dict]:
        ref = ref or EngineRef(get_engine(engine), "exact", version)
        done = run_smoke(ref, store, ctx, tier="cpu", python=python)
        return {r.patch: r._asdict() for r in done.results}

    return run_cells


def image_status(store: Store, ctx: SourceContext) -> ImageStatus:
    """(engine, image) -> the `image` section of `patchctl status ENGINE --image REF`: the image's
    digest and, per platform, its state and patch-set fingerprint (None where patchctl never
    patched it)."""
    from patchctl.cli.image_command import status as image_status_of
    from patchctl.cli.image_options import ImageOptions

    def one(engine: str, image: str) -> dict:
        doc, _ = image_status_of(engine, ImageOptions(image, None, False), wait=30.0)
        return dict(doc["image"])

    return one


def run(
    store: Store,
    ctx: SourceContext,
    *,
    engines: tuple[str, ...] = (),
    output: Path = Path("compat_matrix.yaml"),
    shard: str | None = None,
    previous: Path | None = None,
    markdown: Path | None = None,
    workers: int = 4,
    smoke: bool = False,
    python: str | None = None,
    nightly: bool = True,
    html: Path | None = None,
    versions: tuple[str, ...] = (),
    images: tuple[str, ...] = (),
) -> tuple[dict, int]:
    from patchctl.matrix import build as matrix

    doc = matrix.build(
        store,
        ctx,
        engines=list(engines) or None,
        shard=parse_shard(shard),
        workers=workers,
        smoke=smoke_runner(store, ctx, python) if smoke else None,
        nightly=nightly,
        only_versions=set(versions) or None,
        images=images,
        image_status=image_status(store, ctx) if images else None,
    )
    write_atomic(output, matrix.dump(doc).encode())
    _renderings(doc, markdown, html)
    fields: dict = {"output": str(output), "versions": {e: len(d["versions"]) for e, d in doc["engines"].items()}}
    code = EXIT_OK
    if previous:
        changes = matrix.diff(matrix.load(previous), doc)
        fields["diff"] = changes
        if changes["regressions"]:
            code = EXIT_PATCH_FAILED
    failed_nightly = matrix.nightly_failed(doc)
    if failed_nightly:
        fields["nightly_failed"] = failed_nightly
        code = EXIT_PATCH_FAILED
    failed_images = matrix.images_failed(doc)
    if failed_images:
        fields["images_failed"] = failed_images
        code = EXIT_PATCH_FAILED
    conflicts = sum(
        1
        for d in doc["engines"].values()
        for r in [*d["versions"].values(), *(d.get("images") or {}).values()]
        for p in r["patches"].values()
        if p["outcome"] == "conflict"
    )
    fields["message"] = (
        f"wrote {output}: "
        + ", ".join(f"{e} {n} versions" for e, n in fields["versions"].items())
        + f"; {conflicts} conflict cell(s)"
        + "".join(f"; {e} nightly FAILED: {doc['engines'][e]['nightly']}" for e in failed_nightly)
        + "".join(f"; image FAILED: {x}" for x in failed_images)
    )
    return document("matrix", code, **fields), code


def merge(inputs: tuple[Path, ...], output: Path, markdown: Path | None = None, html: Path | None = None) -> tuple[dict, int]:
    from patchctl.matrix import build as matrix

    merged = matrix.merge([matrix.load(p) for p in inputs])
    write_atomic(output, matrix.dump(merged).encode())
    _renderings(merged, markdown, html)
    return document("matrix-merge", EXIT_OK, output=str(output), message=f"merged {len(inputs)} shard(s) into {output}"), EXIT_OK


def diff(previous: Path, current: Path) -> tuple[dict, int]:
    from patchctl.matrix import build as matrix

    changes = matrix.diff(matrix.load(previous), matrix.load(current))
    code = EXIT_PATCH_FAILED if changes["regressions"] else EXIT_OK
    lines = [
        f"regression: {r['engine']} {r['version']} {r['patch']} {r['before']} -> {r['after']} "
        f"(first bad {r['first_bad_version']})"
        for r in changes["regressions"]
    ]
    lines += [f"fixed: {r['engine']} {r['version']} {r['patch']} {r['before']} -> {r['after']}" for r in changes["fixes"]]
    return document("matrix-diff", code, diff=changes, message="\n".join(lines) or "no changes"), code


def _renderings(doc: dict, markdown: Path | None, html: Path | None) -> None:
    from patchctl.matrix import build as matrix

    if markdown:
        write_atomic(markdown, matrix.markdown(doc).encode())
    if html:
        from patchctl.matrix.html_page import render_html

        write_atomic(html, render_html(doc).encode("utf-8"))


_OUT = click.Path(dir_okay=False, path_type=Path)
_IN = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group(
    "matrix",
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=examples(
        "patchctl matrix --markdown compat_matrix.md      every engine, every release",
        "patchctl matrix --engine vllm --version 0.23.0 --smoke -o part.yaml",
        "patchctl matrix --diff compat_matrix.yaml -o new.yaml   exit 1 on a regression",
        "patchctl matrix merge shard-*.yaml -o compat_matrix.yaml",
        "patchctl matrix --engine vllm --image vllm/vllm-openai:nightly   an image beside the releases",
    ),
)
# An option, not an argument: positional engine names would swallow the subcommands' names.
@click.option(
    "--engine", "engines", multiple=True, type=ENGINE, help="Only this engine (repeatable; default: every engine in the store)."
)
@click.option("-o", "--output", type=_OUT, default="compat_matrix.yaml", show_default=True)
@click.option("--shard", help="I/N: only every N-th (engine, version) job, starting at I (CI fan-out).")
@click.option("--diff", "previous", type=_IN, help="Compare with a previous matrix; exit 1 on a regression.")
@click.option("--markdown", type=_OUT, help="Also write a Markdown table.")
@click.option("--html", "html_out", type=_OUT, help="Also write a self-contained HTML page with the coloured grid.")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--smoke", is_flag=True, help="Also run each patch's CPU smoke checks per version (slow).")
@click.option("--no-nightly", is_flag=True, help="Leave the nightly build out.")
@click.option(
    "--version",
    "versions",
    multiple=True,
    help="Only these versions (e.g. to add smoke results for a few; merge with a full run).",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="REF",
    help="Also check the engine tree inside this container image (repeatable; REGISTRY/REPO:TAG or "
    "oci:DIR:TAG), with its digest and patch-set fingerprint.",
)
@checks_python_option
@store_option
@source_options
@json_option
@click.pass_context
def command(
    click_ctx: click.Context,
    engines: tuple[str, ...],
    output: Path,
    shard: str | None,
    previous: Path | None,
    markdown: Path | None,
    html_out: Path | None,
    workers: int,
    smoke: bool,
    no_nightly: bool,
    versions: tuple[str, ...],
    images: tuple[str, ...],
    python: str | None,
    store: Store,
    ctx: SourceContext,
    as_json: bool,
) -> None:
    """Every patch x every release from the oldest any patch claims: compat_matrix.yaml."""
    if click_ctx.invoked_subcommand:
        return
    run_and_exit(
        "matrix",
        as_json,
        lambda: run(
            store,
            ctx,
            engines=tuple(engines),
            output=output,
            shard=shard,
            previous=previous,
            markdown=markdown,
            workers=workers,
            smoke=smoke,
            python=python,
            nightly=not no_nightly,
            html=html_out,
            versions=versions,
            images=_checked_images(images),
        ),
        None,
    )


def _checked_images(images: tuple[str, ...]) -> tuple[str, ...]:
    """A malformed reference is exit 2 before any release is fetched."""
    from patchctl.image.reference import parse_reference

    for image in images:
        parse_reference(image)
    return images


@subcommand(
    "merge", document_name="matrix-merge", example=("patchctl matrix merge shard-1.yaml shard-2.yaml -o compat_matrix.yaml",)
)
@click.argument("inputs", nargs=-1, required=True, type=_IN)
@click.option("-o", "--output", type=_OUT, required=True)
@click.option("--markdown", type=_OUT, help="Also write a Markdown table.")
@click.option("--html", "html_out", type=_OUT, help="Also write the HTML grid.")
def merge_command(inputs: tuple[Path, ...], output: Path, markdown: Path | None, html_out: Path | None) -> tuple[dict, int]:
    """Merge shard outputs into one matrix (for a version in several inputs, the later input wins)."""
    return merge(inputs, output, markdown, html_out)


@subcommand("diff", document_name="matrix-diff", example=("patchctl matrix diff old.yaml compat_matrix.yaml",))
@click.argument("previous", type=_IN)
@click.argument("current", type=_IN)
def diff_command(previous: Path, current: Path) -> tuple[dict, int]:
    """Regressions and fixes between two matrices; exit 1 on a regression."""
    return diff(previous, current)


command.add_command(merge_command)
command.add_command(diff_command)
