"""Server-sent events as OpenAI-compatible engines stream them, and the deltas inside.

Pure functions over bytes and dicts, so the parsing is tested without a socket. What a server sends
is checked, not trusted: a line longer than LINE_MAX_BYTES, an event that is not a JSON object of
the shape OpenAI's streams have (`choices` a list of objects, `content` a string or null, ...) is a
BadServerReply naming what is wrong, never a crash further on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from patchctl.core.errors import BadServerReply, ServerError

DONE = "[DONE]"
# One SSE line, and one event's data lines together: a vLLM or SGLang chunk carrying a token is
# ~300 bytes (a long model name included), one with top-20 logprobs a few KiB. A server that sends
# a line with no newline would otherwise be buffered for ever (1.27 GB and growing, before this cap).
LINE_MAX_BYTES = 1 << 20


def iter_sse_data(chunks: Iterable[bytes], line_max: int = LINE_MAX_BYTES) -> Iterator[str]:
    """Yield the payload of every `data:` field, in arrival order (SSEParser over an iterable)."""
    parser = SSEParser(line_max)
    for chunk in chunks:
        yield from parser.feed(chunk)
    yield from parser.close()


class SSEParser:
    """The payloads of `data:` fields, fed bytes as they arrive (`feed` returns the events a piece
    completed; `close` those the end of the body completes). Push-style, so the asyncio client
    (loadgen.py) and the blocking one (reading.Reading) parse the same way.

    Chunks may split a line anywhere (TCP does not respect event boundaries), so bytes are kept
    until a newline: at most line_max of them (BadServerReply past it). Each chunk is scanned once
    (a server dripping one byte at a time costs linear time, not quadratic). Multi-line data fields
    are joined with newlines, as the SSE spec says; comments (`:`) and other fields are ignored.
    """

    __slots__ = ("line_max", "pending", "data_lines", "event_bytes")

    def __init__(self, line_max: int = LINE_MAX_BYTES) -> None:
        self.line_max = line_max
        self.pending = bytearray()
        self.data_lines: list[str] = []
        self.event_bytes = 0

    def feed(self, chunk: bytes) -> list[str]:
        line_max, pending = self.line_max, self.pending
        events: list[str] = []
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            if pending:
                if len(pending) + nl - start > line_max:
                    raise _line_too_long(line_max)
                raw = bytes(pending) + chunk[start:nl]
                pending.clear()
            else:
                raw = chunk[start:nl]
                if len(raw) > line_max:
                    raise _line_too_long(line_max)
            start = nl + 1
            if raw.startswith(b"data:"):
                self.event_bytes += len(raw)
                if self.event_bytes > line_max:
                    raise BadServerReply(f"an event's data lines come to more than {line_max} bytes (the cap of one SSE event)")
                value = raw[5:].rstrip(b"\r").decode("utf-8", errors="replace")
                self.data_lines.append(value[1:] if value.startswith(" ") else value)
            elif raw == b"" or raw == b"\r":
                if self.data_lines:
                    events.append("\n".join(self.data_lines))
                    self.data_lines, self.event_bytes = [], 0
        if len(pending) + len(chunk) - start > line_max:
            raise _line_too_long(line_max)
        pending += chunk[start:]
        return events

    def close(self) -> list[str]:
        tail = bytes(self.pending).rstrip(b"\r").decode("utf-8", errors="replace")
        self.pending.clear()
        if tail.startswith("data:"):
            value = tail[5:]
            self.data_lines.append(value[1:] if value.startswith(" ") else value)
        events = ["\n".join(self.data_lines)] if self.data_lines else []
        self.data_lines, self.event_bytes = [], 0
        return events


def _line_too_long(line_max: int) -> BadServerReply:
    return BadServerReply(f"an SSE line longer than {line_max} bytes with no newline (the cap of one line)")


class Delta(NamedTuple):
    """What one streamed event carries that the serve tier cares about."""

    content: str
    reasoning: str
    completion_tokens: int | None  # from `usage`, when the event carries a JSON integer there
    finish_reason: str | None
    # `usage.completion_tokens` present but not a JSON integer (12.7, "12", true): why, for the
    # report's warning; the figure is then not used (usage_problem says the same of one out of range).
    usage_not_integer: str | None = None

    @property
    def has_output(self) -> bool:
        return bool(self.content or self.reasoning)


def parse_event(payload: str) -> Delta | None:
    """Parse one `data:` payload; None for the `[DONE]` sentinel. BadServerReply for one that is not
    a chunk of OpenAI's shape, ServerError for the error object a server sends instead of one."""
    if payload.strip() == DONE:
        return None
    obj = load_json(payload)
    if isinstance(obj, dict) and "error" in obj and "choices" not in obj:
        raise ServerError(str(obj["error"])[:300])
    return delta_from_object(obj)


def load_json(text: str | bytes) -> Any:
    """json.loads, its failures a BadServerReply: not JSON, an integer of more digits than Python
    reads, or nesting deeper than the parser's recursion allows."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and int digits are ValueErrors
        raise BadServerReply(f"not JSON ({str(exc)[:80]}): {excerpt(text)}") from None


def excerpt(text: str | bytes, limit: int = 80) -> str:
    """The start of what the server sent, as repr shows it."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _text(holder: dict[str, Any], key: str, where: str) -> str:
    """A string field (null or absent: ""); BadServerReply for anything else."""
    value = holder.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadServerReply(f"{where}.{key} is {_kind(value)} {json.dumps(value)[:40]}, not a string")
    return value


def delta_from_object(obj: Any) -> Delta:
    """The delta of a streamed chunk or a whole reply, checked field by field."""
    if not isinstance(obj, dict):
        raise BadServerReply(f"a JSON {_kind(obj)}, not an object: {excerpt(json.dumps(obj))}")
    choices = obj.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list):
        raise BadServerReply(f"`choices` is {_kind(choices)}, not a list")
    content, reasoning, finish = "", "", None
    for i, choice in enumerate(choices):
        where = f"choices[{i}]"
        if not isinstance(choice, dict):
            raise BadServerReply(f"{where} is {_kind(choice)}, not an object")
        # chat chunks carry `delta`, non-streaming chat `message`, completions `text`.
        key = "delta" if choice.get("delta") is not None else "message"
        part = choice.get(key)
        if part is None:
            part = {}
        if not isinstance(part, dict):
            raise BadServerReply(f"{where}.{key} is {_kind(part)}, not an object")
        # `content: null` is what reasoning models send while they think.
        content += _text(part, "content", f"{where}.{key}")
        content += _text(choice, "text", where)
        # vLLM has used both names for the reasoning channel.
        reasoning += _text(part, "reasoning_content", f"{where}.{key}") or _text(part, "reasoning", f"{where}.{key}")
        finish = _text(choice, "finish_reason", where) or finish
    usage = obj.get("usage")
    if usage is None:
        usage = {}
    if not isinstance(usage, dict):
        raise BadServerReply(f"`usage` is {_kind(usage)}, not an object")
    tokens = usage.get("completion_tokens")
    if tokens is None:
        return Delta(content, reasoning, None, finish)
    if type(tokens) is not int:  # bool is an int to Python, not to JSON
        return Delta(content, reasoning, None, finish, f"usage.completion_tokens {json.dumps(tokens)[:40]} is not an integer")
    return Delta(content, reasoning, tokens, finish)


def usage_problem(tokens: int, max_tokens: int | None) -> str | None:
    """Why the server's completion_tokens cannot be this request's output tokens, or None.

    Negative, or more than the max_tokens the request allowed (every engine stops there; an
    OpenAI-compatible server counts the tokens it generated, reasoning included). The text streamed
    is no bound: a server may pack several tokens into a chunk, strip special tokens (end of text,
    the think tags) from the text while counting them, or keep the reasoning to itself."""
    if tokens < 0:
        return f"usage.completion_tokens {tokens} is negative"
    if max_tokens is not None and tokens > max_tokens:
        return f"usage.completion_tokens {tokens} is more than the max_tokens {max_tokens} the request allowed"
    return None
