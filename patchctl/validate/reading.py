"""Reading a server's reply within its limits: the body's bytes as they arrive (Arrivals) up to the
reply's cap, a whole body (read_capped), the start of an error's; what one timed request has read
(Reading), and the usage figure judged (sane_usage). The client (client.py) sends; this reads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from patchctl.core.errors import BadServerReply, HTTPError, TruncatedStream
from patchctl.validate.sse import Delta, delta_from_object, iter_sse_data, load_json, parse_event, usage_problem

if TYPE_CHECKING:
    from patchctl.sources.http import Response

# A whole reply: 2 MiB (two lines at their cap, so that a line too long is named as such), and 4 KiB
# per token max_tokens allows (a streamed chunk carrying one token is ~300 bytes; one with top-20
# logprobs a few KiB). Past it the request fails (BadServerReply).
REPLY_BASE_BYTES = 2 << 20
REPLY_PER_TOKEN_BYTES = 4 << 10
SMALL_REPLY_BYTES = 1 << 20  # /v1/models, /version, the part of an error's body that is read


def reply_cap(max_tokens: int) -> int:
    return REPLY_BASE_BYTES + max(0, max_tokens) * REPLY_PER_TOKEN_BYTES


class Reading:
    """What one timed request has read so far (kept when it fails half way)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.chunk_times: list[float] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.usage: int | None = None
        self.usage_rejected: str | None = None
        self.finish: str | None = None
        self.reasoning_chunks = self.content_chunks = 0
        self.last_kind = ""
        self.reads: set[int] = set()

    def read(self, resp: Response, stream: bool) -> None:
        if resp.status_code >= 400:
            raise HTTPError(f"HTTP {resp.status_code}: {error_text(resp)}")
        cap = reply_cap(self.max_tokens)
        if not stream:
            self._take(delta_from_object(load_json(read_capped(resp, cap))), time.perf_counter())
            return
        arrivals = Arrivals(resp, cap)
        for event, payload in enumerate(iter_sse_data(arrivals), start=1):
            now = time.perf_counter()
            try:
                delta = parse_event(payload)
            except BadServerReply as exc:
                raise BadServerReply(f"event {event}: {exc}") from None
            if delta is None:
                break
            if delta.has_output:
                self.chunk_times.append(now)
                self.reads.add(arrivals.count)
            self._take(delta, now)
        if self.finish is None:
            # Every complete OpenAI stream carries a finish_reason. A dropped one may still send
            # [DONE]: llama-cpp-python, interrupting a stream for a newer request, sends the role
            # chunk, [DONE], and nothing else. Counting that as a request would report short, fast
            # "successes".
            raise TruncatedStream(f"stream ended without a finish_reason after {len(self.chunk_times)} chunks")

    def _take(self, delta: Delta, now: float) -> None:
        if delta.content or delta.reasoning:
            self.content.append(delta.content)
            self.reasoning.append(delta.reasoning)
            self.reasoning_chunks += bool(delta.reasoning)
            self.content_chunks += bool(delta.content)
            self.last_kind = "content" if delta.content else "reasoning"
        usage, rejected = sane_usage(delta, self.max_tokens)
        if usage is not None or rejected is not None:
            self.usage, self.usage_rejected = usage, rejected
        self.finish = delta.finish_reason or self.finish


def sane_usage(delta: Delta, max_tokens: int) -> tuple[int | None, str | None]:
    """(the server's completion_tokens if they make sense, why not otherwise)."""
    if delta.usage_not_integer is not None:
        return None, delta.usage_not_integer
    if delta.completion_tokens is None:
        return None, None
    problem = usage_problem(delta.completion_tokens, max_tokens)
    return (None, problem) if problem else (delta.completion_tokens, None)


def read_capped(resp: Response, cap: int) -> bytes:
    """The whole body, BadServerReply past `cap` bytes (a Content-Length above it: before reading)."""
    declared = resp.headers.get("Content-Length", "")
    if declared.strip().isdigit() and int(declared) > cap:
        raise BadServerReply(f"the reply declares {declared.strip()[:20]} bytes, over the cap of {cap} bytes")
    got = bytearray()
    for piece in resp.iter_content(Arrivals.READ):
        got += piece
        if len(got) > cap:
            raise BadServerReply(f"the reply passed {cap} bytes (the cap of a reply: {_cap_words()})")
    return bytes(got)


def error_text(resp: Response, limit: int = 300) -> str:
    """The start of an error reply's body: only that much is read."""
    got = bytearray()
    for piece in resp.iter_content(4096):
        got += piece
        if len(got) >= limit:
            break
    return bytes(got[:limit]).decode("utf-8", errors="replace")


def _cap_words() -> str:
    return f"{REPLY_BASE_BYTES >> 20} MiB + {REPLY_PER_TOKEN_BYTES >> 10} KiB per max_tokens"


class Arrivals:
    """The bytes of a streamed body, handed over as they arrive; `count` is how many reads so far,
    `received` how many bytes (BadServerReply past `cap`).

    A chunked body comes as its chunks arrive (http.client decodes the framing), any other one as
    each read from the socket gives it: never a sized read, which would wait until that many bytes
    came and make every token seem to arrive at once.
    """

    READ = 65536

    def __init__(self, resp: Response, cap: int | None = None) -> None:
        self.resp = resp
        self.count = 0
        self.received = 0
        self.cap = cap

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.resp.iter_content(self.READ):
            if piece:
                self.count += 1
                self.received += len(piece)
                if self.cap is not None and self.received > self.cap:
                    raise BadServerReply(f"the reply passed {self.cap} bytes (the cap of a reply: {_cap_words()})")
                yield piece
