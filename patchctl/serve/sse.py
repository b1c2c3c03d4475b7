"""Server-sent events as OpenAI-compatible engines stream them, and the deltas inside.

Pure functions over bytes and dicts, so the parsing is tested without a socket.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from patchctl.errors import ServerError

DONE = "[DONE]"


def iter_sse_data(chunks: Iterable[bytes]) -> Iterator[str]:
    """Yield the payload of every `data:` field, in arrival order.

    Chunks may split a line anywhere (TCP does not respect event boundaries), so
    bytes are buffered until a newline. Multi-line data fields are joined with
    newlines, as the SSE spec says; comments (`:`) and other fields are ignored.
    """
    buf = b""
    data_lines: list[str] = []
    for chunk in chunks:
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            raw, buf = buf[:nl], buf[nl + 1 :]
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if line == "":
                if data_lines:
                    yield "\n".join(data_lines)
                    data_lines = []
                continue
            if line.startswith("data:"):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(" ") else value)
    tail = buf.rstrip(b"\r").decode("utf-8", errors="replace")
    if tail.startswith("data:"):
        value = tail[5:]
        data_lines.append(value[1:] if value.startswith(" ") else value)
    if data_lines:
        yield "\n".join(data_lines)


class Delta(NamedTuple):
    """What one streamed event carries that the serve tier cares about."""

    content: str
    reasoning: str
    completion_tokens: int | None  # from `usage`, when the event carries it
    finish_reason: str | None

    @property
    def has_output(self) -> bool:
        return bool(self.content or self.reasoning)


def parse_event(payload: str) -> Delta | None:
    """Parse one `data:` payload; None for the `[DONE]` sentinel."""
    if payload.strip() == DONE:
        return None
    obj = json.loads(payload)
    if isinstance(obj, dict) and "error" in obj and "choices" not in obj:
        raise ServerError(str(obj["error"]))
    return delta_from_object(obj)


def delta_from_object(obj: dict[str, Any]) -> Delta:
    content, reasoning, finish = "", "", None
    for choice in obj.get("choices") or []:
        # chat chunks carry `delta`, non-streaming chat `message`, completions `text`.
        part = choice.get("delta") or choice.get("message") or {}
        # `content: null` is what reasoning models send while they think.
        content += part.get("content") or ""
        content += choice.get("text") or ""
        # vLLM has used both names for the reasoning channel.
        reasoning += part.get("reasoning_content") or part.get("reasoning") or ""
        finish = choice.get("finish_reason") or finish
    usage = obj.get("usage") or {}
    tokens = usage.get("completion_tokens")
    return Delta(content, reasoning, int(tokens) if tokens is not None else None, finish)
