"""What every command shares (pip's base_command): `--json`, turning errors into documents with their
exit code, and rendering — the document as JSON on stdout, or the command's own text renderer.

A command module defines `run(...) -> (document, exit code)`, a `render(doc, out, err)` for people,
and its click command built with `@patchctl_command(...)`, whose callback returns what `run` returns.
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from patchctl.documents import document, emit_json, error_document
from patchctl.errors import EXIT_ENVIRONMENT, PatchctlError
from patchctl.options import json_option

Renderer = Callable[[dict, Any, Any], None]


def run_and_exit(name: str, as_json: bool, fn: Callable[[], tuple[dict, int]], render: Renderer | None) -> None:
    try:
        doc, code = fn()
    except PatchctlError as exc:
        doc, code = error_document(name, exc), exc.exit_code
    except KeyboardInterrupt:
        raise
    except OSError as exc:  # a disk or permission problem the core did not anticipate: still a document
        code = EXIT_ENVIRONMENT
        doc = document(name, code, error={"kind": "environment", "message": str(exc), "hint": None})
    if as_json:
        emit_json(doc)
    else:
        render_text(doc, render)
    sys.exit(code)


def render_text(doc: dict, render: Renderer | None) -> None:
    from patchctl.commands import text

    out, err = text.console(), text.console(stderr=True)
    text.print_error(doc, err)
    # An error document carries no command fields: the command's renderer has nothing to show.
    if render is not None and not doc.get("error"):
        render(doc, out, err)
    text.print_envelope(doc, out, err)


def examples(*lines: str) -> str:
    """The epilog of a command's --help: one example per line, each with what it does."""
    body = "\n".join(f"  {line}" for line in lines)
    return f"\b\nExamples:\n{body}"


def patchctl_command(name: str, *, render: Renderer | None = None, example: tuple[str, ...] = (),
            document_name: str | None = None, **click_kwargs: Any) -> Callable[[Callable[..., tuple[dict, int]]], click.Command]:
    """A click command whose callback returns (document, exit code); adds --json and the examples.
    document_name: the `command` field of its documents, where it differs (`matrix merge` → matrix-merge)."""

    def decorate(f: Callable[..., tuple[dict, int]]) -> click.Command:
        @functools.wraps(f)
        def callback(*args: Any, as_json: bool = False, **kwargs: Any) -> None:
            run_and_exit(document_name or name, as_json, lambda: f(*args, **kwargs), render)

        click_kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"]})
        return click.command(name=name, epilog=examples(*example) if example else None,
                             **click_kwargs)(json_option(callback))

    return decorate
