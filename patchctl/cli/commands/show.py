"""`patchctl show`: one patch — what it fixes and why, where it applies, where upstream tracks it, what
its evidence proves and does not (in short, as the docs site's page of the patch says it; whole with
--evidence), the variant a version gets and why, and its store. Everything a user would otherwise
read from the YAML inside site-packages."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

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
    info = patch_info(patch, str(store.store_of(patch)))
    info["version"] = str(version) if version is not None else None
    if version is not None:
        from patchctl.core.engines import get_engine

        choice = choose_variant(patch, version)
        info["chosen_variant"] = choice.variant.filename if choice.variant else None
        info["chosen_why"] = choice.reason
        info["drop_rule_met"] = drop_rule_met(patch, get_engine(patch.engine).dist, version)
    return document("show", EXIT_OK, patch=info), EXIT_OK


def patch_info(patch: Patch, store: str) -> dict:
    """show's `patch` document, without a version: everything patch.yaml and series.yaml say of it.
    scripts/docs_pages.py builds each bundled patch's page from the same dict."""
    smoke = patch.smoke or {}
    return {
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
        "smoke": {"env": _string(smoke.get("env")), "tiers": _strings(smoke.get("tiers"))} if smoke else None,
        "generated_by": dict(patch.generated_by) if patch.generated_by else None,
        "store": store,
        "version": None,
        "chosen_variant": None,
        "chosen_why": None,
        "drop_rule_met": None,
    }


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


def _string(value: object) -> str | None:
    return None if value is None else str(value)


def _strings(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)]


SHORT = 160  # characters of an evidence bullet in the short form; --evidence prints each whole


def short_item(value: object) -> str:
    """An evidence item cut to its first clause (or SHORT characters at a word)."""
    text = " ".join(str(value).split())
    if len(text) <= SHORT:
        return text
    head = text[:SHORT]
    cut = max(head.rfind(sep) for sep in (". ", "; ", ": "))
    head = head[:cut] if cut >= 60 else head[: head.rfind(" ")]
    if head.count("`") % 2:  # never leave a code span open
        head += "`"
    return head.rstrip(",;:. ") + " …"


_LOWER_FIRST = (">=", ">", "~=", "==", "===", "!=", "<=", "<")


def readable_range(specifiers: str) -> str:
    """`<0.5.13,>=0.5.4` (as packaging prints a set) → `>=0.5.4,<0.5.13`: the lower bound first."""
    parts = [s.strip() for s in specifiers.split(",") if s.strip()]

    def rank(spec: str) -> tuple[int, str]:
        op = next((o for o in sorted(_LOWER_FIRST, key=len, reverse=True) if spec.startswith(o)), "")
        return (_LOWER_FIRST.index(op) if op else len(_LOWER_FIRST), spec)

    return ",".join(sorted(parts, key=rank))


class Section(NamedTuple):
    heading: str
    bullets: tuple[str, ...]  # empty: nothing recorded


def short_form(p: dict) -> tuple[Section, ...]:
    """A patch in short (after its title and why): where it applies, its upstream links, and what is
    proven and what is not as short bullets. What `patchctl show PATCH` prints and what the docs
    site's page of each bundled patch says (scripts/docs_pages.py): one function, so that the two
    cannot drift. p: show's `patch` document (patch_info)."""
    where = [
        f"engine: `{p['engine']}`, applies to `{readable_range(p['applies_to'])}`",
        "variants (the variant for version V is the newest base <= V): " + (", ".join(f"`{v}`" for v in p["variants"]) or "none"),
    ]
    if p["drop_when"]:
        where.append(f"dropped when: `{p['drop_when']}`")
    if p["upstreamed_in"]:
        where.append(f"upstreamed in: `{readable_range(p['upstreamed_in'])}`")
    if p["depends_on"]:
        where.append("depends on: " + ", ".join(f"`{d}`" for d in p["depends_on"]))
    if p["requires"]:
        where.append("requires: " + ", ".join(f"`{r}`" for r in p["requires"]))
    if p["smoke"]:
        where.append(f"smoke checks: environment `{p['smoke']['env']}`, tiers {', '.join(p['smoke']['tiers']) or '-'}")
    if p["generated_by"]:
        made = p["generated_by"]
        sources = ", ".join(f"`{s}`" for s in made["sources"])
        where.append(f"generated by `{made['generator']}` from {sources} (regenerate it, never edit the variants)")
    return (
        Section("Where it applies", tuple(where)),
        Section("Upstream", tuple(p["upstream"])),
        Section("What is proven", tuple(short_item(e) for e in p["evidence"]["proven"])),
        Section("What is not proven", tuple(short_item(e) for e in p["evidence"]["not_proven"])),
    )


def render(doc: dict, out: Console, err: Console) -> None:
    """The short form; with --evidence, every field and each evidence item whole, as show printed
    before it had a short form. The flag is the text's alone: --json always holds everything."""
    p = doc["patch"]
    out.print(f"[bold]{p['engine']}/{p['name']}[/]: {Literal(p['title'])}", markup=True)
    out.print(p["why"], markup=False)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.params.get("evidence"):
        _render_long(p, out)
        return
    for section in short_form(p):
        out.print(f"{section.heading}:", markup=False)
        for line in section.bullets or ("(none recorded)",):
            out.print(f"  - {line}", markup=False)
    out.print(f"store: {p['store']}", markup=False)
    if p["version"]:
        out.print(f"on {p['version']}: {p['chosen_variant'] or 'no variant'} ({p['chosen_why']})", markup=False)
    cut = [e for e in (*p["evidence"]["proven"], *p["evidence"]["not_proven"]) if short_item(e) != " ".join(str(e).split())]
    if cut:
        out.print(f"{len(cut)} evidence item(s) cut short (…): --evidence prints them whole", markup=False)


def _render_long(p: dict, out: Console) -> None:
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
        "patchctl show bench-chat-content-null               why, where it applies, what is proven, in short",
        "patchctl show triton-sparse-mla --evidence          every field, and each evidence item whole",
        "patchctl show triton-sparse-mla vllm@0.23.0         and which variant 0.23.0 gets, and why",
        "patchctl show nsa-sm120-trtllm-default sglang@latest --json",
    ),
)
@click.argument("name", metavar="PATCH")
@click.argument("spec", metavar="[ENGINE[@VERSION]]", required=False)
@click.option(
    "--evidence",
    "evidence",
    is_flag=True,
    help="Print every field and each evidence item whole, not the short form (--json always has everything).",
)
@store_option
@source_options
def command(name: str, spec: str | None, evidence: bool, store: Store, ctx: SourceContext) -> tuple[dict, int]:
    """One patch: its title and why, where it applies, its upstream links, and what its evidence
    proves and does not, as short bullets (what the docs site's page of the patch says); with
    ENGINE@VERSION also the variant that version gets, and why. --evidence prints the long form."""
    return run(store, name, spec, ctx)  # --evidence is read by render
