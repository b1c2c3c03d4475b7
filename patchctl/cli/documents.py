"""The JSON document every command prints with --json: one envelope (schema, command, ok, exit_code,
warnings, error) and one shape per command, written down here as TypedDicts and in docs/json-schema.md.

Commands build these as plain dicts; this module knows nothing of the terminal.
"""
from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, TypedDict

from patchctl.core.errors import PatchctlError

if TYPE_CHECKING:  # the apply engine is not imported by `status` and `revert`
    from patchctl.patching.evaluate import PatchOutcome, SeriesResult

SCHEMA = "patchctl/1"


class ErrorDoc(TypedDict):
    kind: str  # a PatchctlError's kind (errors.py); `internal` for a bug, whose document adds `crash_log`
    message: str
    hint: str | None


class Envelope(TypedDict):
    """Every document starts with these keys."""

    schema: str
    command: str
    ok: bool
    exit_code: int
    warnings: list[str]
    error: ErrorDoc | None


class HunkDoc(TypedDict):
    file: str
    index: int
    status: str
    offset: int
    fuzz: int
    line: int
    context: str | None


class PatchDoc(TypedDict):
    name: str
    outcome: str
    variant: str | None
    reason: str
    files: list[str]
    hunks: list[HunkDoc]


class SourceDoc(TypedDict, total=False):
    kind: str
    description: str
    sha256: str | None
    bytes_fetched: int
    read: str  # a release: "ranges", "whole", "ranges+whole" or "cache" (nothing fetched)
    why: str  # a release: which artifact, and why (by the bytes each would cost)


class BuildDoc(TypedDict):
    """Which build of an engine: a nightly's version and commit, and where it was installed from."""

    kind: str  # wheel, git, release, file, installed
    version: str
    commit: str | None
    url: str | None
    artifact: str | None
    sha256: str | None
    record_sha256: str | None
    index_url: str | None
    spec: str | None
    installer: str | None  # uv, pip (null: not installed by patchctl)


class SeriesDoc(Envelope, total=False):
    """check, apply, ensure, export: the outcome of every patch of the series."""

    engine: str
    version: str
    source: SourceDoc
    patches: list[PatchDoc]
    target: str
    written: list[str]
    also: list[dict]
    note: str | None
    state_before: str
    destination: str
    build: BuildDoc | None  # apply/ensure: the build patched (what --install installed)


class StatusDoc(Envelope, total=False):
    engine: str
    version: str
    target: str
    state: str
    message: str
    applied_version: str | None
    applied_at: float | None
    applied: list[dict]
    build: BuildDoc | None  # the build the record says was patched
    installed_build: BuildDoc | None  # what the tree's dist-info says now
    files: list[dict]


class RevertDoc(Envelope, total=False):
    engine: str
    version: str
    target: str
    restored: list[str]
    skipped: list[str]
    message: str


class ListDoc(Envelope, total=False):
    engine: str | None
    version: str | None
    series: list[dict]


class LintDoc(Envelope, total=False):
    problems: list[dict]
    message: str


class PinDoc(Envelope, total=False):
    changed: list[str]
    message: str


class SmokeDoc(Envelope, total=False):
    engine: str
    version: str
    tier: str
    source: SourceDoc
    results: list[dict]


class RebaseDoc(Envelope, total=False):
    engine: str
    old: str
    new: str
    workdir: str | None
    items: list[dict]
    message: str


class ResolveDoc(Envelope, total=False):
    engine: str
    patch: str
    written: str
    message: str


class BisectDoc(Envelope, total=False):
    engine: str
    patch: str
    first_bad: str | None
    last_good: str | None
    steps: list[dict]
    message: str


class DroppableDoc(Envelope, total=False):
    patches: list[dict]
    message: str


class MatrixDoc(Envelope, total=False):
    output: str
    versions: dict[str, int]
    diff: dict
    message: str


class ValidateDoc(Envelope, total=False):
    """validate (and the deprecated `smoke --serve/--start`): one server's coherence, throughput, baseline."""

    engine: str
    url: str  # the server validated
    started: bool  # patchctl started it (--start) and stopped it again
    patch_set_from: str  # where the baseline key's patch set came from: option | target | unknown
    target: str | None  # the engine tree whose state record named the patch set (--python/--target)
    report: dict  # the serve report (patchctl/validate/report.py, format 1): what --out writes as JSON
    files: dict[str, str | None] | None  # --out: {"json": path, "png": path or null}; null without --out


class CaptureDoc(Envelope, total=False):
    """new, diff, refresh: the hand edits of an installed engine, and the patch made from them."""

    engine: str
    version: str
    target: str
    store: str
    patch: str
    variant: str
    previous_variant: str | None
    sha256: str
    outcome: str
    compared_with: str
    files: list[dict]
    on_top: list[dict]
    dropped: list[str]
    recorded: bool
    unfinished: list[str]
    diff: str
    summary: str
    message: str


def outcome_json(o: PatchOutcome) -> PatchDoc:
    return {
        "name": o.name,
        "outcome": o.outcome,
        "variant": o.variant,
        "reason": o.reason,
        "files": list(o.files),
        "hunks": [h._asdict() for h in o.hunks],  # type: ignore[misc]
    }


def series_json(result: SeriesResult) -> list[PatchDoc]:
    return [outcome_json(o) for o in result.outcomes]


def document(command: str, exit_code: int, **fields: Any) -> dict:
    doc: dict[str, Any] = {"schema": SCHEMA, "command": command, "ok": exit_code == 0, "exit_code": exit_code}
    doc.update(fields)
    doc.setdefault("warnings", [])
    doc.setdefault("error", None)
    return doc


def error_json(exc: PatchctlError) -> ErrorDoc:
    return {"kind": exc.kind, "message": exc.message, "hint": exc.hint}


def error_document(command: str, exc: PatchctlError, **fields: Any) -> dict:
    return document(command, exc.exit_code, error=error_json(exc), **fields)


def emit_json(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False) + "\n")
