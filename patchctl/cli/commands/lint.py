"""`patchctl lint`: validate the store: schema, pinned hashes, that every variant parses, sane ranges."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import store_option
from patchctl.core.errors import EXIT_OK, EXIT_USAGE, StoreError

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.store.layered import Store
    from patchctl.store.series import Patch


def run(store: Store) -> tuple[dict, int]:
    """Each store on its own, then the layered view (a name in two stores without `overrides`)."""
    problems: list[dict] = []
    checked = 0
    layers = store.single_layers()
    envs = {p.stem for layer in layers for p in (layer.root / "envs").glob("*.txt")}
    for layer in layers:
        doc, _ = _lint_one(layer, envs)
        # With several stores, say which one each problem is in.
        problems += [dict(p, where=f"{layer.root}: {p['where']}") if len(layers) > 1 else p for p in doc["problems"]]
        checked += doc["checked"]
    if len(store.layers) > 1:
        for engine_name in store.engines():
            try:
                store.series(engine_name)
            except StoreError as exc:
                problems.append({"where": f"{engine_name} (layered stores)", "message": exc.message})
    code = EXIT_OK if not problems else EXIT_USAGE
    return document(
        "lint", code, problems=problems, checked=checked, message=f"{checked} variant(s) checked, {len(problems)} problem(s)"
    ), code


def _lint_one(store: Store, envs: set[str]) -> tuple[dict, int]:
    from patchctl.core.engines import get_engine
    from patchctl.patching.hunks import parse_variant

    problems: list[dict] = []
    checked = 0

    def problem(where: str, message: str) -> None:
        problems.append({"where": where, "message": message})

    for engine_name in store.engines():
        engine = get_engine(engine_name)
        try:
            series = store.series(engine_name)
        except StoreError as exc:
            problem(f"{engine_name}/series.yaml", exc.message)
            continue
        listed = {p.name for p in series.patches}
        for folder in sorted(d.name for d in series.directory.iterdir() if d.is_dir() and (d / "patch.yaml").exists()):
            if folder not in listed:
                problem(f"{engine_name}/{folder}", "has a patch.yaml but is not in series.yaml")
        seen: set[str] = set()
        for patch in series.patches:
            where = f"{engine_name}/{patch.name}"
            if not patch.variants:
                problem(where, "has no variant files")
            for dep in patch.depends_on:
                if dep not in seen:
                    problem(where, f"depends_on {dep}, which is not earlier in the series")
            seen.add(patch.name)
            env = patch.smoke.get("env")
            if env and env not in envs:
                problem(where, f"smoke env {env!r} has no patches/envs/{env}.txt")
            for variant in patch.variants:
                checked += 1
                vwhere = f"{where}/{variant.filename}"
                try:
                    data = variant.read_bytes()  # refused past store.PATCH_MAX_BYTES, unread
                except StoreError as exc:
                    problem(vwhere, exc.message)
                    continue
                if variant.pinned_sha256 is None:
                    problem(vwhere, "has no sha256 pin in series.yaml (run `patchctl pin`)")
                elif hashlib.sha256(data).hexdigest() != variant.pinned_sha256:
                    problem(vwhere, "does not match its sha256 pin (modified?)")
                if not patch.in_range(variant.base):
                    problem(vwhere, f"base {variant.base} is outside applies_to {patch.applies_to}")
                try:
                    parsed = parse_variant(data, vwhere)
                except StoreError as exc:
                    problem(vwhere, exc.message)
                    continue
                for path in parsed.paths:
                    if path.split("/", 1)[0] not in engine.packages:
                        problem(vwhere, f"path {path} is not inside {', '.join(engine.packages)}/")
                if not parsed.subject:
                    problem(vwhere, "has no Subject header (export it with git format-patch)")
            if not patch.applies_to or str(patch.applies_to) == "":
                problem(where, "applies_to is empty")
            _unfinished(patch, where, problem)
    code = EXIT_OK if not problems else EXIT_USAGE
    return {"problems": problems, "checked": checked}, code


def _unfinished(patch: Patch, where: str, problem: Callable[[str, str], None]) -> None:
    """The placeholders `patchctl new` writes without --title / --why ("TODO: ..."), in patch.yaml and in
    the variants' subjects: a patch nobody can review yet."""
    from patchctl.patching.capture import is_placeholder
    from patchctl.patching.hunks import parse_variant

    for key in ("title", "why"):
        if is_placeholder(getattr(patch, key)):
            problem(where, f"{key} is the placeholder {getattr(patch, key)!r}: unfinished (write it in patch.yaml)")
    for variant in patch.variants:
        try:
            subject = parse_variant(variant.read_bytes(), variant.filename).subject
        except StoreError:
            continue  # reported above
        if is_placeholder(subject):
            problem(
                f"{where}/{variant.filename}",
                "its subject is a placeholder: unfinished (after writing the "
                f"title, `patchctl refresh {patch.engine} {patch.name}` rewrites it)",
            )


def render(doc: dict, out: Console, err: Console) -> None:
    for p in doc.get("problems", []):
        out.print(f"  {p['where']}: {p['message']}", markup=False, highlight=False)


@patchctl_command(
    "lint",
    render=render,
    example=(
        "patchctl lint                       the bundled store",
        "patchctl lint --store ./my-patches --json",
    ),
)
@store_option
def command(store: Store) -> tuple[dict, int]:
    """Validate the store: schema, pinned hashes, that every variant parses, sane ranges.

    Exit 2 when there is any problem.
    """
    return run(store)
