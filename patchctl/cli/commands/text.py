"""Text output for people, shared by the command renderers: consoles, tables, the outcome table.

On a terminal the output is rich's (colour, boxed tables); anywhere else — a pipe, a log, systemd's
journal for `ensure` in ExecStartPre= — it is plain aligned text, and rich is never imported.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TextIO

from patchctl.core import outcomes as O

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.core.engines import Engine

# The only markup the renderers write; stripped for plain output.
_MARKUP = re.compile(r"\[(?:/|bold red|bold|green|yellow|cyan|dim)\]")

STYLE = {
    O.CLEAN: "green",
    O.OFFSET: "green",
    O.FUZZ: "yellow",
    O.THREE_WAY: "yellow",
    O.ALREADY_APPLIED: "cyan",
    O.UPSTREAMED: "cyan",
    O.OBSOLETE: "dim",
    O.CONFLICT: "bold red",
}


class Literal(str):
    """A table cell or line shown as it is: never read as markup (model replies, file contents)."""


class Table:
    """Rows to show under a title; rendered by whichever console prints it."""

    def __init__(self, title: str, columns: list[str]):
        self.title, self.columns = title, columns
        self.rows: list[tuple[str, ...]] = []

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)


class Console:
    """print(text | Table, markup=..., highlight=..., end=...) on a stream, rich or plain."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._rich: Any = None
        if stream.isatty():
            from rich.console import Console as RichConsole

            self._rich = RichConsole(file=stream, highlight=False, soft_wrap=True)

    def print(self, obj: Any, *, markup: bool = True, highlight: bool = False, end: str = "\n") -> None:
        if self._rich is not None:
            self._rich.print(_rich_table(obj) if isinstance(obj, Table) else obj, markup=markup, highlight=highlight, end=end)
            return
        text = _plain_table(obj) if isinstance(obj, Table) else str(obj)
        self.stream.write((_MARKUP.sub("", text) if markup else text) + end)


def _rich_table(t: Table) -> Any:
    from rich.table import Table as RichTable

    rt = RichTable(title=t.title, title_justify="left")
    for col in t.columns:
        rt.add_column(col, overflow="fold")
    for row in t.rows:
        rt.add_row(*(_rich_text(cell) if isinstance(cell, Literal) else cell for cell in row))
    return rt


def _rich_text(cell: str) -> Any:
    from rich.text import Text

    return Text(cell)


def _plain_table(t: Table) -> str:
    rows = [list(t.columns)] + [[cell if isinstance(cell, Literal) else _MARKUP.sub("", cell) for cell in row] for row in t.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(t.columns))]
    lines = [t.title] + ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)).rstrip() for r in rows]
    return "\n".join(lines)


def console(stderr: bool = False) -> Console:
    return Console(sys.stderr if stderr else sys.stdout)


def table(title: str, columns: list[str]) -> Table:
    return Table(title, columns)


def coloured(text: str, style: str | None) -> str:
    return f"[{style}]{text}[/]" if style else text


def moved_warnings(engine: Engine, version: Version) -> list[str]:
    """Code that moved to another distribution at this version (vLLM's GGUF → vllm-gguf-plugin):
    said by check, apply and ensure (here, so that ensure does not import the check command)."""
    return [
        f"from {m.since} {engine.name}'s {m.what} lives in {m.engine}; its patches are in the "
        f"{m.engine} series (`patchctl check {m.engine}@VERSION`)"
        for m in engine.moves_at(version)
    ]


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
        t.add_row(p["name"], coloured(p["outcome"], STYLE.get(p["outcome"])), p["variant"] or "-", Literal(detail))
    out.print(t)
    for p in patches:
        for h in p["hunks"]:
            if h["status"] == "failed" and h.get("context"):
                out.print(f"[bold red]{p['name']}[/]: {h['file']} hunk {h['index']}")
                out.print(with_moved_hint(h["context"], doc), markup=False, highlight=False)


def with_moved_hint(context: str, doc: dict) -> str:
    """A failed hunk's context whose "upstream near line N:" has no lines under it (the file is
    shorter there: the code moved) says where to look: `rebase` finds where it went."""
    if context.rstrip("\n").endswith(":") and context.rstrip("\n").rsplit("\n", 1)[-1].startswith("upstream near line"):
        return (
            context.rstrip("\n") + f" (no lines there: the file is shorter, the code moved; "
            f"`patchctl rebase {doc.get('engine')} --onto {doc.get('version')}` finds where it went)\n"
        )
    return context


def print_lines(out: Console, lines: Iterable[str]) -> None:
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
