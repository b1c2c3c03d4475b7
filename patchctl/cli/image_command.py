"""`apply --image REF --to REF2` and `status --image REF`: the commands' image branch. Each runs the
command's own tree operation (`apply.run` / `status.run` on `--target DIR`) on the tree read out of
the image (image/patch.py), and adds the `image` section to the command's document."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

from patchctl.cli.image_options import ImageOptions
from patchctl.core.errors import EXIT_OK
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.options import WriteRules as Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.series import Store
    from patchctl.tree.journal import Selection


def series_paths(store: Store, engine: str, allow_modified: bool) -> list[str]:
    """Every file any variant of the engine's series touches: what is read out of the layers before
    the image's version is known (the variant choice itself is apply's, on the tree read out)."""
    from patchctl.patching.evaluate import load_variant

    paths: list[str] = []
    for patch in store.series(engine).patches:
        for variant in patch.variants:
            paths.extend(load_variant(variant, allow_modified).paths)
    return list(dict.fromkeys(paths))


# A command's own run on a tree (commands/apply.run, commands/status.run), handed in by the command:
# this module never imports the command modules that import it.
TreeRun = Callable[..., tuple[dict, int]]


def apply(tree_run: TreeRun, spec: str, image: ImageOptions, store: Store, ctx: SourceContext, options: Options, *,
          keep_going: bool, dry_run: bool, force: bool, wait: float,
          selection: Selection | None = None) -> tuple[dict, int]:
    from patchctl import __version__
    from patchctl.cli.progress import progress_for
    from patchctl.image.reference import parse_reference
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.image import apply_image

    ref = parse_spec(spec)
    source = parse_reference(image.ref)
    assert image.to is not None  # image_options(writes=True) requires it
    dest = parse_reference(image.to)
    paths = series_paths(store, ref.engine.name, options.allow_modified)
    docs: list[dict] = []

    def operation(root: Path, _version: Version | None) -> tuple[dict, int]:
        doc, code = tree_run(spec, store, ctx, options, TargetSpec(target_dir=str(root)),
                            keep_going=keep_going, dry_run=dry_run, wait=wait, force=force, selection=selection)
        docs.append(doc)
        return doc, code

    section, code = apply_image(source, dest, ref.engine, paths, operation, insecure=image.insecure,
                                progress=progress_for(), dry_run=dry_run, patchctl_version=__version__)
    doc = _combined(docs, section, code)
    return doc, code


def status(tree_run: TreeRun, spec: str, image: ImageOptions, *, wait: float) -> tuple[dict, int]:
    from patchctl.cli.progress import progress_for
    from patchctl.image.reference import parse_reference
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.image import status_image

    ref = parse_spec(spec)
    source = parse_reference(image.ref)
    docs: list[dict] = []

    def operation(root: Path, version: Version | None) -> tuple[dict, int]:
        doc, code = tree_run(spec, TargetSpec(target_dir=str(root), as_version=version), wait=wait)
        docs.append(doc)
        return doc, code

    section, code = status_image(source, ref.engine, operation, insecure=image.insecure, progress=progress_for())
    if docs:
        doc = _combined(docs, section, code)
    else:
        from patchctl.cli.documents import document

        doc = document("status", code, engine=ref.engine.name, state="not-applied",
                       message=f"no patches applied to {source}: no patchctl layer in its history", image=section)
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
        doc.setdefault("warnings", []).extend(
            f"platform {x['platform']} left out: {x['reason']}" for x in section["left_out"])
    return doc


def revert(spec: str, image: ImageOptions) -> tuple[dict, int]:
    from patchctl.cli.documents import document
    from patchctl.cli.progress import progress_for
    from patchctl.image.reference import parse_reference
    from patchctl.tree.image import revert_image

    ref = parse_spec(spec)
    assert image.to is not None  # image_options(writes=True) requires it
    section, code = revert_image(parse_reference(image.ref), parse_reference(image.to), insecure=image.insecure,
                                 progress=progress_for())
    reverted = [p["platform"] for p in section["platforms"] if p["state"] == "reverted"]
    message = (f"pushed {section['to']}: the image{'s' if len(reverted) > 1 else ''} patchctl patched "
               f"({', '.join(reverted)}), byte for byte" if reverted else f"{section['from']} carries no patchctl layer: "
               f"pushed as it is")
    return document("revert", code, engine=ref.engine.name, target=section["from"], message=message,
                    restored=[], image=section), code
