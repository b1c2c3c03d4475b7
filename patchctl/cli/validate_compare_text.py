"""`patchctl validate`'s text for what issue 37 added: `--compare`'s verdict, and the line that says
what a report measured (its provenance). Apart from validate_text.py so that each stays short."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from patchctl.cli.commands.text import coloured, print_lines

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console


def render_compare(doc: dict, out: Console) -> None:
    c = doc["compare"]
    lines = [f"validate --compare: {c['b']} ({c['b_started_at']}) against {c['a']} ({c['a_started_at']})"]
    for d in c["differences"]:
        lines.append(f"  allowed to differ: {d['field']} {d['then']!r} -> {d['now']!r}")
    lines += ["  " + _check(ch).describe(c["threshold"]) for ch in c["checks"]]
    lines += [f"  c={n['concurrency']} not compared: {n['reason']}" for n in c["not_compared"]]
    print_lines(out, lines)
    if c["regressions"]:
        out.print(coloured(f"REGRESSED: {c['regressions']} figure(s) significantly worse beyond the threshold", "bold red"))
    else:
        out.print(coloured("no regression", "green"))


def _check(obj: dict[str, Any]) -> Any:
    from patchctl.validate.baseline import BaselineCheck

    counts = obj.get("samples")
    return BaselineCheck(**{**obj, "samples": None if counts is None else tuple(counts)})


def provenance_line(prov: dict | None) -> str | None:
    """ "  measured: patch set 1a2b (target: 3 patches), engine build g1a2b3c4, max_model_len 32768,
    GPU 8 x NVIDIA H200 (driver 550.54), prompts unique" with each unknown field's reason."""
    if prov is None:
        return None
    why = prov.get("unknown") or {}

    def said(field: str, value: Any) -> str:
        return str(value) if value is not None else f"unknown ({why.get(field, 'not said')})"

    patches = prov.get("patches")
    origin = prov.get("patch_set_from")
    if prov.get("patch_set") == "unknown":
        source = f" ({why.get('patch_set', 'not said')})"
    else:
        source = f" (from {origin}: {len(patches)} patches)" if patches is not None else f" (from {origin})"
    gpu = said("gpu_name", prov.get("gpu_name"))
    if prov.get("gpu_driver"):
        gpu += f" (driver {prov['gpu_driver']})"
    parts = [
        f"patch set {prov.get('patch_set')}{source}",
        f"engine build {said('engine_build', prov.get('engine_build'))}",
        f"max_model_len {said('max_model_len', prov.get('max_model_len'))}",
        f"GPU {gpu}",
    ]
    if prov.get("prompts"):
        parts.append(f"prompts {prov['prompts']}")
    return "  measured: " + ", ".join(parts)
