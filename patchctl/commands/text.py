"""Text output for people, shared by the command renderers: rich consoles and the outcome table.

rich is imported only when a document is rendered as text, never on the --json path or at start-up.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from patchctl import outcomes as O

if TYPE_CHECKING:
    from rich.console import Console

STYLE = {
    O.CLEAN: "green", O.OFFSET: "green", O.FUZZ: "yellow", O.THREE_WAY: "yellow",
    O.ALREADY_APPLIED: "cyan", O.UPSTREAMED: "cyan", O.OBSOLETE: "dim", O.CONFLICT: "bold red",
}


def console(stderr: bool = False) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def table(title: str, columns: list[str]):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col, overflow="fold")
    return t


def coloured(text: str, style: str | None) -> str:
    return f"[{style}]{text}[/]" if style else text


def print_outcomes(out: Console, doc: dict) -> None:
    """The outcome table of check/apply/ensure/export, and the context of each failed hunk."""
    title = f"{doc.get('engine')} {doc.get('version')}"
    if doc.get("source"):
        title += f" — {doc['source']['description']}"
    patches = doc.get("patches")
    if patches is None:
        return
    if not patches:
        out.print(f"{title}: the store has no patches for {doc.get('engine')}", markup=False)
        return
    t = table(title, ["patch", "outcome", "variant", "detail"])
    for p in patches:
        moved = [h for h in p["hunks"] if h["status"] in ("offset", "fuzz")]
        detail = p["reason"]
        if moved:
            detail += "; " + ", ".join(
                f"{h['file'].rsplit('/', 1)[-1]}#{h['index']} "
                + (f"fuzz {h['fuzz']}" if h["status"] == "fuzz" else f"offset {h['offset']:+d}")
                for h in moved
            )
        t.add_row(p["name"], coloured(p["outcome"], STYLE.get(p["outcome"])), p["variant"] or "-", detail)
    out.print(t)
    for p in patches:
        for h in p["hunks"]:
            if h["status"] == "failed" and h.get("context"):
                out.print(f"[bold red]{p['name']}[/]: {h['file']} hunk {h['index']}")
                out.print(h["context"], markup=False, highlight=False)


def print_lines(out: Console, lines) -> None:
    for line in lines:
        out.print(line, markup=False, highlight=False)


def print_envelope(doc: dict, out: Console, err: Console) -> None:
    """What every document may carry: the error (stderr), message/note (stdout), warnings (stderr)."""
    for key in ("message", "note"):
        if doc.get(key):
            out.print(doc[key], markup=False, highlight=False)
    for w in doc.get("warnings", []):
        err.print(f"[yellow]warning[/]: {w}", markup=True, highlight=False)


def print_error(doc: dict, err: Console) -> None:
    e = doc.get("error")
    if e:
        err.print(f"[bold red]error[/] ({e['kind']}): ", end="")
        err.print(e["message"], markup=False, highlight=False)
        if e.get("hint"):
            err.print(f"  hint: {e['hint']}", markup=False, highlight=False)
