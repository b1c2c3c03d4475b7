"""compat_matrix.yaml as one self-contained HTML page: a coloured version × patch grid per engine.

The page carries its CSS inline and loads nothing, so it can be uploaded as a CI artifact, mailed,
or opened from disk. Every value from the document is escaped: patch names, variants, error
messages and smoke reasons come from upstream trees and patch metadata, not from us.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

from patchctl.core import outcomes as O

ERROR = "error"  # a row the matrix could not evaluate (`row["error"]`), or a cell saying so
UNKNOWN = "unknown"  # an outcome this renderer does not know: still shown, never dropped

# (background, text colour, label). Families share a hue so the grid reads at a glance; shades
# within a family keep each outcome distinguishable.
STYLE: dict[str, tuple[str, str, str]] = {
    O.CLEAN: ("#2da44e", "#ffffff", "clean"),
    O.OFFSET: ("#8fd19e", "#0b2e13", "offset"),
    O.FUZZ: ("#f5c000", "#3b2a00", "fuzz"),
    O.THREE_WAY: ("#e08a00", "#2b1800", "three-way"),
    O.ALREADY_APPLIED: ("#8cc8ff", "#032a4d", "already applied"),
    O.UPSTREAMED: ("#0969da", "#ffffff", "upstreamed"),
    O.OBSOLETE: ("#afb8c1", "#1f2328", "obsolete"),
    O.CONFLICT: ("#e5322d", "#ffffff", "conflict"),
    ERROR: ("#7a0b0b", "#ffffff", "error"),
    UNKNOWN: ("#ffffff", "#1f2328", "unknown"),
}

SMOKE_MARK = {"passed": "✔", "failed": "✘", "error": "✘", "skipped": "–", "not-run": "·"}

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #1f2328;
       background: #ffffff; }
h1 { font-size: 20px; margin: 0 0 8px; }
h2 { font-size: 17px; margin: 24px 0 6px; }
.meta, .summary { color: #57606a; margin: 0 0 8px; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 8px 0 4px; padding: 0; list-style: none; }
.legend li { display: flex; align-items: center; gap: 6px; }
.swatch { display: inline-block; width: 18px; height: 18px; border: 1px solid #8c959f; border-radius: 3px; }
.wrap { overflow-x: auto; }
table.grid { border-collapse: separate; border-spacing: 3px; }
.grid th { background: #f6f8fa; text-align: left; padding: 6px 8px; font-weight: 600; white-space: nowrap; }
.grid thead th { position: sticky; top: 0; z-index: 1; }
.grid th.version { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; cursor: help; }
.grid td { min-width: 150px; height: 44px; padding: 6px 8px; vertical-align: top; border-radius: 4px; }
.cell .outcome { font-weight: 600; }
.cell .variant, .cell .note { display: block; font-size: 12px; opacity: .9; }
.cell .smoke { display: inline-block; margin-top: 3px; font-size: 12px; padding: 0 5px; border-radius: 8px;
               background: rgba(255, 255, 255, .85); color: #1f2328; }
.cell .smoke.bad { background: #ffebe9; color: #82071e; font-weight: 600; }
.cell details { font-size: 12px; margin-top: 3px; }
.cell details pre { white-space: pre-wrap; margin: 2px 0 0; font: 11px/1.3 ui-monospace, monospace; }
td.unknown { border: 1px dashed #8c959f; }
td.row-error { font-size: 12px; }
main { max-width: 1560px; }
.report { margin: 12px 0; padding: 8px 12px; border: 1px solid #d0d7de; border-radius: 6px; background: #f6f8fa; }
.report h2 { margin: 4px 0 6px; }
.report h3, .engine h3 { font-size: 15px; margin: 10px 0 4px; }
.report ul, .caveats ul, .firstbad ul { margin: 2px 0 6px; padding-left: 20px; }
.report .bad { color: #82071e; font-weight: 600; }
.caveats, .firstbad { font-size: 13px; }
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def style_key(outcome: object) -> str:
    if outcome in STYLE:
        return outcome
    return UNKNOWN


def css_class(key: str) -> str:
    return "o-" + key.replace("-", "_")


def outcome_css() -> str:
    return "\n".join(
        f"td.{css_class(k)}, .swatch.{css_class(k)} {{ background: {bg}; color: {fg}; }}" for k, (bg, fg, _) in STYLE.items()
    )


def _text(value: object) -> str:
    """Evidence or details may be a string or any YAML structure; show structures as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=1, sort_keys=True, default=str)


def render_cell(entry: dict | None) -> str:
    if not entry:
        return f'<td class="{css_class(UNKNOWN)} unknown" title="not evaluated">—</td>'
    outcome = entry.get("outcome")
    key = style_key(outcome)
    label = STYLE[key][2] if key != UNKNOWN else str(outcome)
    title = [f"outcome: {outcome}"]
    parts = [f'<span class="outcome">{esc(label)}</span>']
    variant = entry.get("variant")
    if variant:
        parts.append(f'<span class="variant">{esc(str(variant).removesuffix(".patch"))}</span>')
        title.append(f"variant: {variant}")
    if entry.get("hunks_moved"):
        parts.append(f'<span class="note">{esc(entry["hunks_moved"])} hunk(s) moved</span>')
        title.append(f"hunks moved: {entry['hunks_moved']}")
    if entry.get("drop"):
        parts.append(f'<span class="note">drop: {esc(entry["drop"])}</span>')
        title.append(f"drop: {entry['drop']}")
    if entry.get("error"):
        parts.append(f'<span class="note">{esc(entry["error"])}</span>')
        title.append(f"error: {entry['error']}")
    smoke = entry.get("smoke")
    if isinstance(smoke, dict):
        status = str(smoke.get("status", "?"))
        reason = smoke.get("reason") or ""
        bad = " bad" if status in ("failed", "error") else ""
        mark = SMOKE_MARK.get(status, "?")
        parts.append(f'<span class="smoke{bad}" title="{esc(reason)}">smoke {esc(mark)} {esc(status)}</span>')
        title.append(f"smoke: {status}" + (f" ({reason})" if reason else ""))
    elif smoke is not None:
        parts.append(f'<span class="smoke">smoke {esc(smoke)}</span>')
        title.append(f"smoke: {smoke}")
    evidence = entry.get("evidence")
    if isinstance(evidence, str) and evidence:
        # matrix.build writes a short phrase ("applies + CPU checks passed"): show it in the cell.
        parts.append(f'<span class="note evidence">{esc(evidence)}</span>')
        title.append(f"evidence: {evidence}")
    elif evidence:
        parts.append(f"<details><summary>evidence</summary><pre>{esc(_text(evidence))}</pre></details>")
    return f'<td class="cell {css_class(key)}" title="{esc(chr(10).join(title))}">{"".join(parts)}</td>'


def render_version_header(version: str, row: dict) -> str:
    title = []
    if row.get("nightly_of"):
        title.append(f"nightly: {row['nightly_of']}")
    if row.get("version") and row["version"] != version:
        title.append(f"version: {row['version']}")
    if row.get("sha256"):
        title.append(f"sha256: {row['sha256']}")
    if row.get("artifact"):
        title.append(f"artifact: {row['artifact']}")
    if row.get("bytes_fetched") is not None:
        title.append(f"bytes fetched: {row['bytes_fetched']}")
    if row.get("seconds") is not None:
        title.append(f"seconds: {row['seconds']}")
    return f'<th class="version" scope="row" title="{esc(chr(10).join(title) or "no artifact recorded")}">{esc(version)}</th>'


def render_engine(engine: str, data: dict) -> str:
    patches = list(data.get("patches") or [])
    versions = data.get("versions") or {}
    # A row may name a patch the series no longer lists (an older document): keep it visible.
    for row in versions.values():
        for name in row.get("patches") or {}:
            if name not in patches:
                patches.append(name)
    counts: dict[str, int] = {}
    body = []
    # Newest first: the nightly, then releases from the newest down (a nightly report is read top down).
    from patchctl.matrix.build import _version_key

    def newest_first(version: str) -> tuple[int, object]:
        try:
            return _version_key(version)
        except Exception:
            return (-1, version)

    for version in sorted(versions, key=newest_first, reverse=True):
        row = versions[version] or {}
        cells = [render_version_header(version, row)]
        if row.get("error"):
            counts[ERROR] = counts.get(ERROR, 0) + 1
            cells.append(
                f'<td class="cell {css_class(ERROR)} row-error" colspan="{max(len(patches), 1)}" '
                f'title="{esc(row["error"])}"><span class="outcome">error</span> '
                f'<span class="note">{esc(row["error"])}</span></td>'
            )
        else:
            for name in patches:
                entry = (row.get("patches") or {}).get(name)
                key = style_key(entry.get("outcome")) if entry else UNKNOWN
                counts[key] = counts.get(key, 0) + 1
                cells.append(render_cell(entry))
        body.append("<tr>" + "".join(cells) + "</tr>")
    head = "<tr><th>version</th>" + "".join(f'<th scope="col">{esc(p)}</th>' for p in patches) + "</tr>"
    summary = ", ".join(f"{n} {STYLE[k][2]}" for k, n in counts.items()) or "no versions"
    # matrix.build says whether the nightly build ran, and why not: a missing row is never silent.
    nightly = ""
    if data.get("nightly"):
        bad = " bad" if str(data["nightly"]).startswith("failed") else ""
        nightly = f'<p class="summary{bad}">nightly: {esc(data["nightly"])}</p>'
    return (
        f'<section class="engine" id="engine-{esc(engine)}"><h2>{esc(engine)}</h2>'
        f'<p class="summary">{len(versions)} version(s) × {len(patches)} patch(es): {esc(summary)}</p>{nightly}'
        f"{render_first_bad(engine, data, patches)}{render_caveats(data, patches)}"
        f'<div class="wrap"><table class="grid"><thead>{head}</thead><tbody>{"".join(body)}</tbody>'
        f"</table></div></section>"
    )


def render_first_bad(engine: str, data: dict, patches: list[str]) -> str:
    from patchctl.matrix.course import courses

    known = courses(data)
    items = []
    for p in patches:
        course = known.get(p)
        if course is None:
            continue
        parts = [f'<span class="bad">first bad {esc(course.first_bad)}</span>'] if course.first_bad else []
        parts += [esc(course.words)] if course.words else []
        items.append(f"<li><code>{esc(p)}</code>: " + "; ".join(parts) + "</li>")
    return f'<div class="firstbad"><h3>First bad version per patch</h3><ul>{"".join(items)}</ul></div>'


def render_caveats(data: dict, patches: list[str]) -> str:
    evidence = data.get("evidence") or {}
    items = []
    for patch in patches:
        not_proven = (evidence.get(patch) or {}).get("not_proven") or []
        if not_proven:
            items.append(f"<li><code>{esc(patch)}</code> does not prove: " + "; ".join(esc(n) for n in not_proven) + "</li>")
    if not items:
        return ""
    return f'<div class="caveats"><h3>Not proven here</h3><ul>{"".join(items)}</ul></div>'


def _change_line(item: dict) -> str:
    what = f"{esc(item['engine'])} {esc(item['version'])}"
    if item.get("patch"):
        what += f" <code>{esc(item['patch'])}</code>"
    if item.get("error"):
        return f"<li>{what}: error: {esc(item['error'])}</li>"
    return f"<li>{what}: {esc(item.get('before') or 'new')} → {esc(item['after'])}</li>"


def render_changes(previous: dict, doc: dict) -> str:
    from patchctl.matrix.build import changes_since

    changes = changes_since(previous, doc)
    parts = ['<section class="report" id="changes"><h2>Since the previous matrix</h2>']
    for key, heading, css in (
        ("new_releases", "New releases", ""),
        ("newly_failing", "Newly failing", " bad"),
        ("newly_upstreamed", "Newly upstreamed", ""),
    ):
        items = changes[key]
        if key == "new_releases":
            lines = "".join(f"<li>{esc(i['engine'])} {esc(i['version'])}</li>" for i in items)
        else:
            lines = "".join(_change_line(i) for i in items)
        parts.append(
            f'<h3 class="{css.strip()}">{heading} ({len(items)})</h3>' + (f"<ul>{lines}</ul>" if items else "<p>none</p>")
        )
    parts.append("</section>")
    return "".join(parts)


def render_legend() -> str:
    items = "".join(f'<li><span class="swatch {css_class(k)}"></span>{esc(label)}</li>' for k, (_, _, label) in STYLE.items())
    return f'<ul class="legend" aria-label="legend">{items}</ul>'


def render_html(doc: dict, title: str = "patchctl compatibility matrix", previous: dict | None = None) -> str:
    """The nightly report: what changed since PREVIOUS (when given), then per engine the first bad
    version of each patch, what its checks do not prove, and the grid, newest version first."""
    engines = (doc or {}).get("engines") or {}
    changes = render_changes(previous, doc) if previous is not None else ""
    sections = "".join(render_engine(e, d or {}) for e, d in engines.items()) or "<p>No engines in this matrix.</p>"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{CSS}{outcome_css()}</style></head><body>"
        f"<h1>{esc(title)}</h1>"
        f'<p class="meta">schema {esc((doc or {}).get("schema", "?"))}; hover a version for its artifact '
        f"sha256, a cell for its details.</p>"
        f"<main>{changes}{render_legend()}{sections}</main></body></html>\n"
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m patchctl.matrix.html_page compat_matrix.yaml -o matrix.html` (usable before the CLI grows --html)."""
    from patchctl.matrix import build as matrix

    parser = argparse.ArgumentParser(prog="python -m patchctl.matrix.html_page", description=main.__doc__)
    parser.add_argument("matrix", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--previous", type=Path, help="the previous matrix: lead with what changed since")
    args = parser.parse_args(argv)
    previous = matrix.load(args.previous) if args.previous else None
    from patchctl.core.atomic import write_atomic

    write_atomic(args.output, render_html(matrix.load(args.matrix), previous=previous).encode("utf-8"))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
