"""`apply --image REF --to REF2`, `status --image REF` and `revert --image`: the commands' image
branch. tree/image.py runs the service on the tree read out of the image and returns typed results;
this maps them to the command's document (cli/tree_documents.py, as on a directory) and adds the
`image` section."""

from __future__ import annotations

from typing import TYPE_CHECKING

from patchctl.cli.image_options import ImageOptions
from patchctl.core.errors import EXIT_OK
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.patching.options import Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store
    from patchctl.tree.bookkeeping import Selection
    from patchctl.tree.stores import Stores


def series_paths(store: Store, engine: str, allow_modified: bool) -> list[str]:
    """Every file any variant of the engine's series touches: what is read out of the layers before
    the image's version is known (the variant choice itself is apply's, on the tree read out)."""
    from patchctl.patching.evaluate import load_variant

    paths: list[str] = []
    for patch in store.series(engine).patches:
        for variant in patch.variants:
            paths.extend(load_variant(variant, allow_modified).paths)
    return list(dict.fromkeys(paths))


def apply(
    spec: str,
    image: ImageOptions,
    stores: Stores,
    ctx: SourceContext,
    options: Options,
    *,
    keep_going: bool,
    dry_run: bool,
    force: bool,
    wait: float,
    selection: Selection | None = None,
) -> tuple[dict, int]:
    from patchctl import __version__
    from patchctl.cli.progress import progress_for
    from patchctl.cli.tree_documents import apply_document
    from patchctl.image.reference import parse_reference
    from patchctl.tree import service
    from patchctl.tree.image import apply_image

    ref = parse_spec(spec)
    source = parse_reference(image.ref)
    assert image.to is not None  # image_options(writes=True) requires it
    dest = parse_reference(image.to)
    paths = series_paths(stores.store, ref.engine.name, options.allow_modified)
    request = service.ApplyRequest(stores, options, ctx, service.Mode.APPLY, selection, keep_going, dry_run, force, wait)
    done = apply_image(
        source, dest, ref, paths, request, insecure=image.insecure, progress=progress_for(), patchctl_version=__version__
    )
    docs = [apply_document(run, "apply", dry_run=dry_run)[0] for run in done.runs]
    return _combined(docs, done.section, done.code), done.code


def status(spec: str, image: ImageOptions, *, wait: float) -> tuple[dict, int]:
    from patchctl.cli.documents import document
    from patchctl.cli.progress import progress_for
    from patchctl.cli.tree_documents import status_document
    from patchctl.image.reference import parse_reference
    from patchctl.tree.image import status_image

    ref = parse_spec(spec)
    source = parse_reference(image.ref)
    digest, found = status_image(source, ref, wait=wait, insecure=image.insecure, progress=progress_for())
    docs: list[dict] = []
    platforms: list[dict] = []
    code = EXIT_OK
    for p in found:
        if p.result is None:
            platforms.append(
                {
                    "platform": p.platform,
                    "state": "not-applied",
                    "patch_set": None,
                    "layers_read": 0,
                    "message": "no patchctl layer in the image's history",
                }
            )
            continue
        doc, one = status_document(p.result)
        code = max(code, one)
        # One dict: the platform's entry, and (the first) the document itself, as it always was.
        doc.update(platform=p.platform, patch_set=p.patch_set, layers_read=p.layers_read, root=p.root)
        docs.append(doc)
        platforms.append(doc)
    section = {"from": str(source), "digest": digest, "platforms": platforms}
    if docs:
        doc = _combined(docs, section, code)
    else:
        doc = document(
            "status",
            code,
            engine=ref.engine.name,
            state="not-applied",
            message=f"no patches applied to {source}: no patchctl layer in its history",
            image=section,
        )
    return doc, code


def _combined(docs: list[dict], section: dict, code: int) -> dict:
    """The first platform's document, carrying the image section (every platform's summary) and the
    worst exit code; the staging folders it names are gone, so its target is the image."""
    doc = dict(docs[0])
    doc["image"] = section
    doc["target"] = section["from"]
    doc["exit_code"], doc["ok"] = code, code == EXIT_OK
    if section.get("pushed"):
        doc["note"] = "; ".join(filter(None, [doc.get("note"), f"pushed {section['to']} ({section['digest']})"]))
    if section.get("left_out"):
        doc.setdefault("warnings", []).extend(f"platform {x['platform']} left out: {x['reason']}" for x in section["left_out"])
    return doc


def revert(spec: str, image: ImageOptions) -> tuple[dict, int]:
    from patchctl.cli.documents import document
    from patchctl.cli.progress import progress_for
    from patchctl.image.reference import parse_reference
    from patchctl.tree.image import revert_image

    ref = parse_spec(spec)
    assert image.to is not None  # image_options(writes=True) requires it
    section, code = revert_image(
        parse_reference(image.ref), parse_reference(image.to), insecure=image.insecure, progress=progress_for()
    )
    reverted = [p["platform"] for p in section["platforms"] if p["state"] == "reverted"]
    message = (
        f"pushed {section['to']}: the image{'s' if len(reverted) > 1 else ''} patchctl patched "
        f"({', '.join(reverted)}), byte for byte"
        if reverted
        else f"{section['from']} carries no patchctl layer: pushed as it is"
    )
    return document(
        "revert", code, engine=ref.engine.name, target=section["from"], message=message, restored=[], image=section
    ), code
