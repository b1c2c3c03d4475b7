"""Renderers: the JSON document (one stable schema, docs/json-schema.md) and text for people.

Commands build plain dicts; nothing in the core prints.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from patchctl import outcomes as O
from patchctl.engine.evaluate import PatchOutcome, SeriesResult

SCHEMA = "patchctl/1"

STYLE = {
    O.CLEAN: "green", O.OFFSET: "green", O.FUZZ: "yellow", O.THREE_WAY: "yellow",
    O.ALREADY_APPLIED: "cyan", O.UPSTREAMED: "cyan", O.OBSOLETE: "dim", O.CONFLICT: "bold red",
}


def outcome_json(o: PatchOutcome) -> dict:
    return {
        "name": o.name,
        "outcome": o.outcome,
        "variant": o.variant,
        "reason": o.reason,
        "files": list(o.files),
        "hunks": [h._asdict() for h in o.hunks],
    }


def series_json(result: SeriesResult) -> list[dict]:
    return [outcome_json(o) for o in result.outcomes]


def document(command: str, exit_code: int, **fields: Any) -> dict:
    doc = {"schema": SCHEMA, "command": command, "ok": exit_code == 0, "exit_code": exit_code}
    doc.update(fields)
    doc.setdefault("warnings", [])
    doc.setdefault("error", None)
    return doc


def emit_json(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def outcomes_table(patches: list[dict], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("patch")
    table.add_column("outcome")
    table.add_column("variant")
    table.add_column("detail", overflow="fold")
    for p in patches:
        moved = [h for h in p["hunks"] if h["status"] in ("offset", "fuzz")]
        detail = p["reason"]
        if moved:
            detail += "; " + ", ".join(
                f"{h['file'].rsplit('/', 1)[-1]}#{h['index']} " + (f"fuzz {h['fuzz']}" if h["status"] == "fuzz" else f"offset {h['offset']:+d}")
                for h in moved
            )
        style = STYLE.get(p["outcome"], "")
        table.add_row(p["name"], f"[{style}]{p['outcome']}[/]" if style else p["outcome"], p["variant"] or "-", detail)
    return table


def print_conflicts(out: Console, patches: list[dict]) -> None:
    for p in patches:
        for h in p["hunks"]:
            if h["status"] == "failed" and h.get("context"):
                out.print(f"[bold red]{p['name']}[/]: {h['file']} hunk {h['index']}")
                out.print(h["context"], markup=False, highlight=False)


def print_document(doc: dict) -> None:
    """Text rendering of any command's document."""
    out = console()
    err = console(stderr=True)
    command = doc["command"]
    if doc.get("error"):
        e = doc["error"]
        err.print(f"[bold red]error[/] ({e['kind']}): {e['message']}", markup=True)
        if e.get("hint"):
            err.print(f"  hint: {e['hint']}")
    if "patches" in doc and command in ("check", "apply", "ensure", "export"):
        title = f"{doc.get('engine')} {doc.get('version')}"
        if doc.get("source"):
            title += f" — {doc['source']['description']}"
        if doc["patches"]:
            out.print(outcomes_table(doc["patches"], title))
            print_conflicts(out, doc["patches"])
        else:
            out.print(f"{title}: the store has no patches for {doc.get('engine')}")
    if command == "smoke" and doc.get("tier") == "serve":
        from patchctl.serve.cli import render_serve_document

        out.print(render_serve_document(doc), markup=False)
    if command == "smoke" and doc.get("results") is not None:
        table = Table(title=f"smoke {doc.get('engine')} {doc.get('version')} ({doc.get('tier')} tier)", title_justify="left")
        for col in ("patch", "status", "passed", "failed", "skipped", "seconds", "detail"):
            table.add_column(col, overflow="fold")
        for r in doc["results"]:
            color = {"passed": "green", "failed": "bold red", "error": "bold red"}.get(r["status"], "yellow")
            table.add_row(r["patch"], f"[{color}]{r['status']}[/]", str(r["passed"]), str(r["failed"]),
                          str(r["skipped"]), f"{r['seconds']:.1f}", r["reason"])
        out.print(table)
        for r in doc["results"]:
            for f in r.get("failures", []):
                out.print(f"  {r['patch']}: {f}", markup=False)
    if command == "rebase" and doc.get("items") is not None:
        table = Table(title=f"rebase {doc.get('engine')} {doc.get('old')} -> {doc.get('new')}", title_justify="left")
        for col in ("patch", "classification", "old variant", "new variant", "detail"):
            table.add_column(col)
        colors = {"unchanged": "green", "refreshed": "green", "upstreamed": "cyan", "obsolete": "dim",
                  "conflict": "bold red"}
        for item in doc["items"]:
            color = colors.get(item["classification"], "")
            detail = item["reason"] + (f" [resolution {item['resolution']}]" if item.get("resolution") else "")
            table.add_row(item["name"], f"[{color}]{item['classification']}[/]", item["old_variant"] or "-",
                          item["new_variant"] or "-", detail)
        out.print(table)
        for item in doc["items"]:
            for proposal in item.get("relocations") or ():
                out.print(f"relocated proposal for {item['name']} ({proposal['from']} -> {proposal['to']}):")
                out.print(proposal["diff"], markup=False, highlight=False)
    if command == "list":
        table = Table(title="series" + (f" for {doc['engine']} {doc['version']}" if doc.get("version") else ""),
                      title_justify="left")
        columns = ["engine", "#", "patch", "applies_to", "variants"] + (["chosen", "why"] if doc.get("version") else [])
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in doc["series"]:
            cells = [row["engine"], str(row["position"]), row["name"], row["applies_to"], " ".join(row["variants"])]
            if doc.get("version"):
                cells += [row.get("chosen_variant") or "-", row.get("why") or ""]
            table.add_row(*cells)
        out.print(table)
    if command == "status" and doc.get("files"):
        for f in doc["files"]:
            out.print(f"  {f['status']:<9} {f['path']}", markup=False)
    if command in ("lint",) and doc.get("problems"):
        for p in doc["problems"]:
            out.print(f"  {p['where']}: {p['message']}", markup=False)
    if command == "droppable":
        for row in doc.get("patches", []):
            mark = "drop" if row["droppable"] else "keep"
            out.print(f"  {mark}  {row['engine']}/{row['patch']}  drop_when={row['drop_when']}", markup=False)
    if command == "bisect":
        for step in doc.get("steps", []):
            out.print(f"  {'good' if step['good'] else 'bad ':<4} {step['point']}  {step['detail']}", markup=False)
    for key in ("message", "note"):
        if doc.get(key):
            out.print(doc[key], markup=False)
    for w in doc.get("warnings", []):
        err.print(f"[yellow]warning[/]: {w}", markup=True)
