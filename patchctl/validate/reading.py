"""Reading a server's reply within its limits: a stream's bytes fed as they arrive (Reading.feed) up to
the reply's cap, a whole body (read_capped), the start of an error's; what one timed request has read
(Reading), and the usage figure judged (sane_usage). The client (client.py) sends; this reads."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from patchctl.core.errors import BadServerReply, HTTPError, TruncatedStream
from patchctl.validate.metrics import RequestRecord
from patchctl.validate.sse import Delta, SSEParser, delta_from_object, load_json, parse_event, usage_problem

if TYPE_CHECKING:
    from patchctl.sources.http import Response

# A whole reply: 2 MiB (two lines at their cap, so that a line too long is named as such), and 4 KiB
# per token max_tokens allows (a streamed chunk carrying one token is ~300 bytes; one with top-20
# logprobs a few KiB). Past it the request fails (BadServerReply).
REPLY_BASE_BYTES = 2 << 20
REPLY_PER_TOKEN_BYTES = 4 << 10
SMALL_REPLY_BYTES = 1 << 20  # /v1/models, /version, the part of an error's body that is read
# One read of a body: at most this much, and never a sized read that waits for it all (http.py's
# iter_content reads a chunked body chunk by chunk, any other with read1), which would make every
# token of a stream seem to arrive at once.
READ_BYTES = 65536


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
        self.reads: set[int] = set()  # which reads (by their number) brought output
        self.pieces = 0  # reads so far

    def read(self, resp: Response, stream: bool) -> None:
        """The whole reply from a blocking Response (client.py's path)."""
        if resp.status_code >= 400:
            raise HTTPError(f"HTTP {resp.status_code}: {error_text(resp)}")
        cap = reply_cap(self.max_tokens)
        if not stream:
            self.take_whole(read_capped(resp, cap))
            return
        self.start_stream()
        for piece in resp.iter_content(READ_BYTES):
            if piece and self.feed(piece, time.perf_counter()):
                break
        self.end_stream()

    # -- a stream, fed as it arrives (the blocking read above and loadgen.py's protocol) --------

    def start_stream(self) -> None:
        self.cap = reply_cap(self.max_tokens)
        self.received = 0
        self.events = 0
        self.done = False  # [DONE] came: what follows is not read
        self.parser = SSEParser()

    def feed(self, piece: bytes, now: float) -> bool:
        """One read's bytes, which arrived at `now` (every event in them did): True once [DONE]
        came. BadServerReply past the reply's cap or for an event not of OpenAI's shape."""
        self.received += len(piece)
        if self.received > self.cap:
            raise BadServerReply(f"the reply passed {self.cap} bytes (the cap of a reply: {_cap_words()})")
        self.pieces += 1
        return self._events(self.parser.feed(piece), now)

    def end_stream(self) -> None:
        """The body ended (or [DONE] came): TruncatedStream for a stream with no finish_reason."""
        if not self.done:
            self._events(self.parser.close(), time.perf_counter())
        if self.finish is None:
            # Every complete OpenAI stream carries a finish_reason. A dropped one may still send
            # [DONE]: llama-cpp-python, interrupting a stream for a newer request, sends the role
            # chunk, [DONE], and nothing else. Counting that as a request would report short, fast
            # "successes".
            raise TruncatedStream(f"stream ended without a finish_reason after {len(self.chunk_times)} chunks")

    def _events(self, payloads: list[str], now: float) -> bool:
        for payload in payloads:
            self.events += 1
            try:
                delta = parse_event(payload)
            except BadServerReply as exc:
                raise BadServerReply(f"event {self.events}: {exc}") from None
            if delta is None:
                self.done = True
                return True
            if delta.has_output:
                self.chunk_times.append(now)
                self.reads.add(self.pieces)
            self._take(delta, now)
        return False

    def take_whole(self, body: bytes) -> None:
        """A non-streamed reply's whole body (read within the reply's cap)."""
        self._take(delta_from_object(load_json(body)), time.perf_counter())

    def record(self, ok: bool, error: str | None, streamed: bool, start: float, end: float) -> RequestRecord:
        """What this request read, as the record a level aggregates."""
        return RequestRecord(
            ok=ok,
            error=error,
            streamed=streamed,
            start=start,
            end=end,
            chunk_times=tuple(self.chunk_times),
            usage_tokens=self.usage,
            content="".join(self.content),
            reasoning="".join(self.reasoning),
            finish_reason=self.finish,
            reasoning_chunks=self.reasoning_chunks,
            content_chunks=self.content_chunks,
            reads=len(self.reads),
            # max_tokens ran out while the model was still thinking: no answer was reached.
            ended_in_reasoning=self.finish == "length" and self.last_kind == "reasoning",
            usage_rejected=self.usage_rejected,
        )

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
    for piece in resp.iter_content(READ_BYTES):
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
