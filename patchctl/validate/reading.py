"""Reading a server's reply within its limits: the body's bytes as they arrive (Arrivals) up to the
reply's cap, a whole body (read_capped), the start of an error's; what one timed request has read
(Reading), the usage figure judged (sane_usage), and the body's socket handed to the deadline's
watchdog (watch_body). The client (client.py) sends; this reads."""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING

import requests

from patchctl.core.errors import BadServerReply, TruncatedStream
from patchctl.validate.sse import Delta, delta_from_object, iter_sse_data, load_json, parse_event, usage_problem

if TYPE_CHECKING:
    from patchctl.image.deadline import Watch

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

    def read(self, resp: requests.Response, stream: bool) -> None:
        if resp.status_code >= 400:
            raise requests.HTTPError(f"HTTP {resp.status_code}: {error_text(resp)}")
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


def watch_body(watch: Watch, resp: requests.Response) -> None:
    """Have the deadline's watchdog shut the body's socket down too: http.client hands a reply that
    will close (close-delimited, `Connection: close`) its socket and drops it from the connection,
    where the watchdog looks (image/deadline.py), so such a stream would otherwise read on for ever."""
    fp = getattr(getattr(resp.raw, "_fp", None), "fp", None)  # http.client's socket file
    sock = getattr(getattr(fp, "raw", None), "_sock", None)
    if sock is not None:
        watch.add(SimpleNamespace(sock=sock))


def read_capped(resp: requests.Response, cap: int) -> bytes:
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


def error_text(resp: requests.Response, limit: int = 300) -> str:
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

    A chunked body comes one HTTP chunk at a time (urllib3 decodes the framing). A body without
    chunks (close-delimited, or with a Content-Length) must not be read with a size: a sized read
    waits until that many bytes came, and iter_content(None) on such a body reads it to the end, so
    every token would seem to arrive at once. read1 returns whatever one read from the socket gave.
    """

    READ = 65536

    def __init__(self, resp: requests.Response, cap: int | None = None) -> None:
        self.resp = resp
        self.count = 0
        self.received = 0
        self.cap = cap

    def __iter__(self) -> Iterator[bytes]:
        raw = self.resp.raw
        read1 = getattr(raw, "read1", None)  # urllib3 >= 2
        if getattr(raw, "chunked", False) or read1 is None:
            pieces: Iterable[bytes] = self.resp.iter_content(chunk_size=None)
        else:
            pieces = iter(lambda: read1(self.READ, decode_content=True), b"")
        for piece in pieces:
            if piece:
                self.count += 1
                self.received += len(piece)
                if self.cap is not None and self.received > self.cap:
                    raise BadServerReply(f"the reply passed {self.cap} bytes (the cap of a reply: {_cap_words()})")
                yield piece
