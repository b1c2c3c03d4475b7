"""The JSON document every command prints with --json: one envelope (schema, command, ok, exit_code,
warnings, error) and one shape per command. The shapes are written down once, as JSON schemas in
patchctl/core/schemas/output/ (docs/json-schema.md is generated from them; tests/test_output_schemas.py
validates every command's documents against them), so there are no TypedDicts here to drift from them.

Commands build these as plain dicts; this module knows nothing of the terminal.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from patchctl.cli import interrupt
from patchctl.core.errors import PatchctlError

if TYPE_CHECKING:  # the apply engine is not imported by `status` and `revert`
    from patchctl.patching.evaluate import PatchOutcome, SeriesResult

SCHEMA = "patchctl/1"


def outcome_json(o: PatchOutcome) -> dict[str, Any]:
    """One entry of `patches` (envelope.json#/$defs/patch)."""
    return {
        "name": o.name,
        "outcome": o.outcome,
        "variant": o.variant,
        "reason": o.reason,
        "files": list(o.files),
        "hunks": [h._asdict() for h in o.hunks],
    }


def series_json(result: SeriesResult) -> list[dict[str, Any]]:
    return [outcome_json(o) for o in result.outcomes]


def document(command: str, exit_code: int, **fields: Any) -> dict:
    doc: dict[str, Any] = {"schema": SCHEMA, "command": command, "ok": exit_code == 0, "exit_code": exit_code}
    doc.update(fields)
    doc.setdefault("warnings", [])
    doc.setdefault("error", None)
    return doc


def error_json(exc: PatchctlError) -> dict[str, Any]:
    """A document's `error` (envelope.json#/$defs/error)."""
    return {"kind": exc.kind, "message": exc.message, "hint": exc.hint}


def error_document(command: str, exc: PatchctlError, **fields: Any) -> dict:
    return document(command, exc.exit_code, error=error_json(exc), **fields)


def emit_json(doc: dict) -> None:
    """Print the document: a command's last act. A Ctrl-C while it is written is held until it is
    whole (cli/interrupt.py), so stdout holds one document or, interrupted before, none."""
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    with interrupt.output():
        sys.stdout.write(text)
        sys.stdout.flush()
