"""What a server says about its own context limit, engine by engine, with where it was read.

- vLLM and SGLang: `max_model_len` of the model's entry in GET /v1/models.
- llama.cpp's llama-server: GET /props, `default_generation_settings.n_ctx` (per slot: what one
  request may use).
- llama-cpp-python says it nowhere but in the error of a prompt that is too long ("This model's
  maximum context length is N tokens"), as vLLM does too; llama-server's error says "exceeds the
  available context size (N tokens)" and SGLang's "the model's context length (N tokens)":
  limit_from_error reads each.
- Else `--max-context`, which also overrides what the server says.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from patchctl.core.errors import BadServerReply, RequestFailed
from patchctl.validate.client import OpenAIClient


class ContextLimit(NamedTuple):
    tokens: int | None
    source: str  # where it was read: "/v1/models max_model_len", "/props n_ctx", "--max-context", "its error", "unknown"


UNKNOWN = ContextLimit(None, "unknown")

_ERROR_PATTERNS = (
    re.compile(r"maximum context length is (\d+) tokens"),  # vLLM, llama-cpp-python (OpenAI's wording)
    re.compile(r"context size \((\d+) tokens\)"),  # llama-server
    re.compile(r"context length \((\d+) tokens\)"),  # SGLang
    re.compile(r"exceed context window of (\d+)"),  # llama-cpp-python's own ValueError
)


def limit_from_error(text: str) -> int | None:
    """The limit an error reply states, in any of the engines' wordings; None when it states none."""
    for pattern in _ERROR_PATTERNS:
        m = pattern.search(text)
        if m:
            return int(m.group(1))
    return None


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_limit(client: OpenAIClient, override: int | None = None) -> ContextLimit:
    """The most tokens (prompt and output) one request may hold, as the server states it."""
    if override is not None:
        return ContextLimit(override, "--max-context")
    model = client.resolve_model()
    try:
        status, obj = client.side_request("GET", "/v1/models")
        entries = obj.get("data") if status == 200 and isinstance(obj, dict) else None
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and entry.get("id") == model and _positive_int(entry.get("max_model_len")):
                return ContextLimit(entry["max_model_len"], "/v1/models max_model_len")
        status, obj = client.side_request("GET", "/props")
        settings = obj.get("default_generation_settings") if status == 200 and isinstance(obj, dict) else None
        n_ctx = _positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
        if n_ctx:
            return ContextLimit(n_ctx, "/props n_ctx")
    except (RequestFailed, BadServerReply):
        pass
    return UNKNOWN
