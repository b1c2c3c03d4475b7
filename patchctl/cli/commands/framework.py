"""What every command shares (pip's base_command): `--json`, turning errors into documents with their
exit code, and rendering — the document as JSON on stdout, or the command's own text renderer.

The catch-all lives here too: an exception nobody anticipated (a bug) becomes one `internal` error
document (exit 4) whose message names a crash log with the traceback, written to the data dir, and
where to report it; the user never sees a traceback.

A command module defines `run(...) -> (document, exit code)`, a `render(doc, out, err)` for people,
and its click command built with `@patchctl_command(...)`, whose callback returns what `run` returns.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from patchctl import __version__
from patchctl.cli.documents import document, emit_json, error_document
from patchctl.cli.options import json_option
from patchctl.core.errors import EXIT_ENVIRONMENT, EXIT_INTERNAL, ISSUES_URL, PatchctlError

Renderer = Callable[[dict, Any, Any], None]


def run_and_exit(name: str, as_json: bool, fn: Callable[[], tuple[dict, int]], render: Renderer | None) -> None:
    try:
        doc, code = fn()
    except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
        raise  # click's own control flow (a usage error, ctx.exit): cli.py's Registry.main renders it
    except Exception as exc:  # KeyboardInterrupt and SystemExit pass: cli.py makes Ctrl-C exit 130
        doc, code = failure_document(name, exc)
    click_ctx = click.get_current_context(silent=True)
    used = click_ctx.meta.get("patchctl.cli.deployment") if click_ctx is not None else None  # cli.DEPLOYMENT_KEY
    if used:  # the document says which deployment file filled the command's options
        doc.setdefault("deployment", used)
    if _names_a_command(doc):  # most documents (ensure on an intact tree) hold no hint: nothing to import
        from patchctl.cli.hints import complete

        complete(doc, click_ctx)  # its hints carry the user's --python/--target/--store: they run as printed
    if as_json:
        emit_json(doc)
    else:
        render_text(doc, render)
    sys.exit(code)


def _names_a_command(value: Any) -> bool:
    """Whether any text in the document holds a backticked `patchctl ...` (a hint to complete)."""
    if isinstance(value, str):
        return "`patchctl " in value
    if isinstance(value, dict):
        return any(_names_a_command(v) for v in value.values())
    if isinstance(value, list):
        return any(_names_a_command(v) for v in value)
    return False


def failure_document(name: str, exc: Exception) -> tuple[dict, int]:
    """The document and exit code for an exception a command raised: its own for a PatchctlError,
    `environment` (3) for a disk or permission problem the core did not anticipate, and `internal`
    (4) with a crash log for anything else."""
    if isinstance(exc, PatchctlError):
        return error_document(name, exc), exc.exit_code
    if isinstance(exc, OSError):
        return document(
            name, EXIT_ENVIRONMENT, error={"kind": "environment", "message": str(exc), "hint": None}
        ), EXIT_ENVIRONMENT
    return internal_error_document(name, exc), EXIT_INTERNAL


def internal_error_document(name: str, exc: BaseException) -> dict:
    """A bug: the traceback goes to a crash log, the document says where it is and where to report it."""
    what = f"{type(exc).__name__}: {_shorten(str(exc))}" if str(exc) else type(exc).__name__
    try:
        log: str | None = str(write_crash_log(exc))
        where = f"the traceback is in {log}"
    except OSError as write_exc:
        log = None
        where = f"the crash log could not be written ({write_exc})"
    message = f"internal error in patchctl {__version__} ({what}): this is a bug; {where}"
    hint = f"please report it at {ISSUES_URL}" + (", attaching the crash log" if log else "")
    return document(name, EXIT_INTERNAL, error={"kind": "internal", "message": message, "hint": hint}, crash_log=log)


def crash_dir() -> Path:
    from patchctl.core import config

    return config.data_dir() / "crash"


def write_crash_log(exc: BaseException) -> Path:
    """<data dir>/crash/<UTC time>-<pid>.log: what ran, on what, and the traceback (written whole)."""
    from patchctl.core.atomic import write_atomic

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = crash_dir() / f"{stamp}-{os.getpid()}.log"
    body = "\n".join(
        [
            f"patchctl {__version__} crashed at {stamp}",
            f"command: {' '.join(_redact(a) for a in sys.argv)}",
            f"python: {sys.version.split()[0]} ({sys.executable}) on {platform.platform()}",
            f"report: {ISSUES_URL}",
            "",
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        ]
    )
    write_atomic(path, body.encode("utf-8", "backslashreplace"))
    return path


def _redact(arg: str) -> str:
    """A URL's user and password (an index URL with a token) stay out of the log people attach."""
    return re.sub(r"(://)[^/@\s]+@", r"\1***@", arg)


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= 300 else text[:300] + "…"


def render_text(doc: dict, render: Renderer | None) -> None:
    from patchctl.cli.commands import text

    out, err = text.console(), text.console(stderr=True)
    text.print_error(doc, err)
    # An error document carries no command fields (the renderer has nothing to show), except a
    # conflict's: apply/ensure keep the outcome table and the failing hunks (`patches`).
    if render is not None and (not doc.get("error") or doc.get("patches")):
        render(doc, out, err)
    text.print_envelope(doc, out, err)


def examples(*lines: str) -> str:
    """The epilog of a command's --help: one example per line, each with what it does."""
    body = "\n".join(f"  {line}" for line in lines)
    return f"\b\nExamples:\n{body}"


def patchctl_command(
    name: str,
    *,
    render: Renderer | None = None,
    example: tuple[str, ...] = (),
    document_name: str | None = None,
    **click_kwargs: Any,
) -> Callable[[Callable[..., tuple[dict, int]]], click.Command]:
    """A click command whose callback returns (document, exit code); adds --json and the examples.
    document_name: the `command` field of its documents, where it differs (`matrix merge` → matrix-merge)."""

    def decorate(f: Callable[..., tuple[dict, int]]) -> click.Command:
        @functools.wraps(f)
        def callback(*args: Any, as_json: bool = False, **kwargs: Any) -> None:
            run_and_exit(document_name or name, as_json, lambda: f(*args, **kwargs), render)

        click_kwargs.setdefault("context_settings", {"help_option_names": ["-h", "--help"]})
        return click.command(name=name, epilog=examples(*example) if example else None, **click_kwargs)(json_option(callback))

    return decorate
