"""`patchctl show`: one patch whole — what it fixes and why, where upstream tracks it, the versions it
claims, the variant a version gets and why, what its evidence proves and does not, and its store.
Everything a user would otherwise read from the YAML inside site-packages."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import Literal
from patchctl.cli.documents import document
from patchctl.cli.options import source_options, store_option
from patchctl.core.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.cli.commands.text import Console
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.spec import EngineRef
    from patchctl.store.layered import Store
    from patchctl.store.series import Patch


def run(store: Store, name: str, spec: str | None, ctx: SourceContext) -> tuple[dict, int]:
    from patchctl.sources.spec import parse_spec
    from patchctl.store.series import choose_variant, drop_rule_met

    ref = parse_spec(spec) if spec else None
    patch = _find(store, name, ref.engine.name if ref else None)
    version = _version_of(ref, ctx) if ref else None
    info: dict = {
        "engine": patch.engine,
        "name": patch.name,
        "title": patch.title,
        "why": patch.why.strip(),
        "upstream": list(patch.upstream),
        "applies_to": str(patch.applies_to),
        "upstreamed_in": str(patch.upstreamed_in) if patch.upstreamed_in is not None else None,
        "drop_when": patch.drop_when,
        "requires": list(patch.requires),
        "depends_on": list(patch.depends_on),
        "variants": [v.filename for v in patch.variants],
        "evidence": {"proven": _strings(patch.evidence.get("proven")), "not_proven": _strings(patch.evidence.get("not_proven"))},
        "store": str(store.store_of(patch)),
        "version": str(version) if version is not None else None,
        "chosen_variant": None,
        "chosen_why": None,
        "drop_rule_met": None,
    }
    if version is not None:
        from patchctl.core.engines import get_engine

        choice = choose_variant(patch, version)
        info["chosen_variant"] = choice.variant.filename if choice.variant else None
        info["chosen_why"] = choice.reason
        info["drop_rule_met"] = drop_rule_met(patch, get_engine(patch.engine).dist, version)
    return document("show", EXIT_OK, patch=info), EXIT_OK


def _find(store: Store, name: str, engine: str | None) -> Patch:
    engines = [engine] if engine else store.engines()
    found = [p for e in engines for p in store.series(e).patches if p.name == name]
    if not found:
        known = sorted(p.name for e in engines for p in store.series(e).patches)
        raise UsageError(
            f"no patch named {name!r}" + (f" for {engine}" if engine else ""),
            hint=f"patchctl list{' ' + engine if engine else ''} names them: {', '.join(known)}",
        )
    if len(found) > 1:
        raise UsageError(
            f"{name!r} names a patch of {' and '.join(p.engine for p in found)}",
            hint=f"name the engine: patchctl show {name} {found[0].engine}@VERSION",
        )
    return found[0]


def _version_of(ref: EngineRef, ctx: SourceContext) -> Version | None:
    if ref.kind == "installed":
        return None
    if ref.kind == "exact":
        return ref.version
    if ref.kind == "latest":
        from patchctl.sources.fetch import latest_release

        return latest_release(ref.engine, ctx)
    raise UsageError(
        f"show takes ENGINE, ENGINE@VERSION or ENGINE@latest, not {ref}",
        hint=f"patchctl check {ref} says which variant that upstream gets",
    )


def _strings(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


def render(doc: dict, out: Console, err: Console) -> None:
    p = doc["patch"]
    out.print(f"[bold]{p['engine']}/{p['name']}[/]: {Literal(p['title'])}", markup=True)
    out.print(p["why"], markup=False)
    rows = [
        ("applies to", p["applies_to"]),
        ("upstreamed in", p["upstreamed_in"]),
        ("drop when", p["drop_when"]),
        ("upstream", " ".join(p["upstream"]) or "-"),
        ("depends on", " ".join(p["depends_on"]) or "-"),
        ("variants", " ".join(p["variants"])),
        ("store", p["store"]),
    ]
    if p["version"]:
        rows.append((f"on {p['version']}", f"{p['chosen_variant'] or 'no variant'} ({p['chosen_why']})"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        if value is not None:
            out.print(f"  {key.ljust(width)}  {value}", markup=False)
    for title, key in (("proven", "proven"), ("not proven", "not_proven")):
        out.print(f"{title}:", markup=False)
        for line in p["evidence"][key] or ["(nothing recorded)"]:
            out.print(f"  - {line}", markup=False)


@patchctl_command(
    "show",
    render=render,
    example=(
        "patchctl show bench-chat-content-null               the patch whole: why, links, evidence",
        "patchctl show triton-sparse-mla vllm@0.23.0         and which variant 0.23.0 gets, and why",
        "patchctl show nsa-sm120-trtllm-default sglang@latest --json",
    ),
)
@click.argument("name", metavar="PATCH")
@click.argument("spec", metavar="[ENGINE[@VERSION]]", required=False)
@store_option
@source_options
def command(name: str, spec: str | None, store: Store, ctx: SourceContext) -> tuple[dict, int]:
    """One patch whole: title, why, upstream links, applies_to, the variant ENGINE@VERSION gets and
    why, what its evidence proves and does not, and its store."""
    return run(store, name, spec, ctx)
