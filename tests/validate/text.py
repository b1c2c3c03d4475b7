"""The text a person sees for a serve report: validate's renderer on patchctl's console, captured."""

from __future__ import annotations

import contextlib
import io


def validate_text(report, files: dict | None = None) -> str:
    from patchctl.cli.commands import text, validate

    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        out = text.console()
        validate.render({"engine": "vllm", "report": report.to_json(), "files": files}, out, out)
    return captured.getvalue()
