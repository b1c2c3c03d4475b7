from __future__ import annotations

from pathlib import Path

from patchctl import report
from patchctl.matrix import build as matrix
from patchctl.sources import fetch
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED, UsageError
from patchctl.store import Store


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


def smoke_runner(store: Store, ctx: fetch.SourceContext, python: str | None):
    """(engine, version) -> {patch: smoke result}, for matrix cells that claim more than 'applies'."""
    from patchctl.commands import smoke as smoke_cmd
    from patchctl.engines import get_engine
    from patchctl.spec import EngineRef

    def run_smoke(engine, version):
        doc, _ = smoke_cmd.smoke_checks(EngineRef(get_engine(engine), "exact", version), store, ctx,
                                        only=(), tier="cpu", python=python)
        if doc.get("error"):
            raise UsageError(doc["error"]["message"])
        return {r["patch"]: r for r in doc["results"]}

    return run_smoke


def run(store: Store, ctx: fetch.SourceContext, *, engines: tuple[str, ...], output: Path, shard: str | None,
        previous: Path | None, markdown: Path | None, workers: int, smoke: bool = False,
        python: str | None = None, nightly: bool = True, html: Path | None = None,
        versions: tuple[str, ...] = ()) -> tuple[dict, int]:
    doc = matrix.build(store, ctx, engines=list(engines) or None, shard=parse_shard(shard), workers=workers,
                       smoke=smoke_runner(store, ctx, python) if smoke else None, nightly=nightly,
                       only_versions=set(versions) or None)
    output.write_text(matrix.dump(doc))
    _renderings(doc, markdown, html)
    fields = {"output": str(output), "versions": {e: len(d["versions"]) for e, d in doc["engines"].items()}}
    code = EXIT_OK
    if previous:
        changes = matrix.diff(matrix.load(previous), doc)
        fields["diff"] = changes
        if changes["regressions"]:
            code = EXIT_PATCH_FAILED
    conflicts = sum(1 for d in doc["engines"].values() for r in d["versions"].values()
                    for p in r["patches"].values() if p["outcome"] == "conflict")
    fields["message"] = (f"wrote {output}: " + ", ".join(f"{e} {n} versions" for e, n in fields["versions"].items())
                         + f"; {conflicts} conflict cell(s)")
    return report.document("matrix", code, **fields), code


def merge(inputs: tuple[Path, ...], output: Path, markdown: Path | None = None,
          html: Path | None = None) -> tuple[dict, int]:
    merged = matrix.merge([matrix.load(p) for p in inputs])
    output.write_text(matrix.dump(merged))
    _renderings(merged, markdown, html)
    return report.document("matrix-merge", EXIT_OK, output=str(output),
                           message=f"merged {len(inputs)} shard(s) into {output}"), EXIT_OK


def diff(previous: Path, current: Path) -> tuple[dict, int]:
    changes = matrix.diff(matrix.load(previous), matrix.load(current))
    code = EXIT_PATCH_FAILED if changes["regressions"] else EXIT_OK
    lines = [f"regression: {r['engine']} {r['version']} {r['patch']} {r['before']} -> {r['after']} "
             f"(first bad {r['first_bad_version']})" for r in changes["regressions"]]
    lines += [f"fixed: {r['engine']} {r['version']} {r['patch']} {r['before']} -> {r['after']}" for r in changes["fixes"]]
    return report.document("matrix-diff", code, diff=changes, message="\n".join(lines) or "no changes"), code


def _renderings(doc: dict, markdown: Path | None, html: Path | None) -> None:
    if markdown:
        markdown.write_text(matrix.markdown(doc))
    if html:
        from patchctl.matrix.html_page import render_html

        html.write_text(render_html(doc), encoding="utf-8")
