"""Hostile OpenAI-compatible servers for `patchctl validate`, and a probe that runs it in a fresh
interpreter, timing it and reading its peak memory.

Each server is the reasoner (tests/support/reasoner.py) with one thing made wrong: the usage it
reports (`BadUsage`), one event of its chat streams (`BadEvent`), or its POST replies replaced by a
raw stream (`raw_posts`: endless content, keep-alive comments only, a line with no newline) or all its
replies by silence (`silent`). They run on the one test server (patches/checklib/testserver.py); a raw
reply stops when the server stops, so a test never waits on a client that has stopped reading.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from checklib.testserver import RAW, Reply, Request, Responder, raw_head, zero_stream
from support.reasoner import Reasoner

SSE_HEAD = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class BadUsage(Reasoner):
    """Reports `value` as every reply's completion_tokens (-1000, 10**12, 12.7, "12", ...)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value

    def _usage(self, n: int) -> dict[str, Any]:
        return {"prompt_tokens": 5, "completion_tokens": self.value, "total_tokens": 5}


class BadEvent(Reasoner):
    """Sends `payload` (the text after `data: `) in place of event `at` (0: the role chunk) of every
    chat stream; non-streamed chat replies are `payload` whole when `whole` is set."""

    def __init__(self, payload: str, at: int = 2, whole: bool = False) -> None:
        super().__init__()
        self.payload, self.at, self.whole = payload, at, whole

    def _chat_events(
        self, pieces: list[tuple[str, str]], body: dict[str, Any], finish: str, delay: float
    ) -> Iterator[tuple[float, str | dict[str, Any]]]:
        for i, (wait, event) in enumerate(super()._chat_events(pieces, body, finish, delay)):
            yield (wait, self.payload) if i == self.at else (wait, event)

    def _chat(self, body: dict[str, Any], max_tokens: int, delay: float) -> Reply:
        if self.whole and not body.get("stream"):
            return Reply(200, self.payload.encode(), {"Content-Type": "application/json"})
        return super()._chat(body, max_tokens, delay)


def chunk(data: bytes) -> bytes:
    """One HTTP chunk of `data`."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def endless(data: bytes, every: float, *, chunked: bool) -> Iterator[tuple[float, bytes]]:
    """`data` every `every` seconds, for ever (until the server stops)."""
    framed = chunk(data) if chunked else data
    return ((every, framed) for _ in itertools.count())


def raw_posts(make_events: Any, *, chunked: bool = True) -> Responder:
    """Every POST answered 200 with an event-stream head and then make_events()'s bytes, raw; GETs
    are left to the next responder (the reasoner: /v1/models, /version)."""

    def respond(request: Request) -> Reply | None:
        if request.method != "POST":
            return None
        head = dict(SSE_HEAD, **({"Transfer-Encoding": "chunked"} if chunked else {"Connection": "close"}))
        return Reply(200, raw_head("200 OK", head), events=make_events(), framing=RAW)

    return respond


def silent(drip: bytes = b"") -> Responder:
    """Every request: the connection is accepted and nothing is said (or `drip`, a byte every 0.3 s,
    the start of a status line that never ends), until the server stops."""

    def respond(request: Request) -> Reply:
        events = ((0.3, drip[i : i + 1]) for i in range(len(drip))) if drip else iter([(3600.0, b"")])
        return Reply(200, b"", events=events, framing=RAW)

    return respond


def no_newline(prefix: bytes, *, chunked: bool, cap: int = 64 << 20) -> Iterator[tuple[float, bytes]]:
    """`prefix` then zero bytes (no newline among them), 64 KiB at a time, up to `cap` bytes: more than
    any line may be, and a bound on what the server sends a client that reads on."""
    yield 0.0, chunk(prefix) if chunked else prefix
    yield from zero_stream(None, cap=cap, chunked=chunked, piece=64 << 10)


def content_event(text: str, finish: str | None = None) -> bytes:
    obj = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    return f"data: {json.dumps(obj)}\n\n".encode()


PROBE = r"""
import json, sys, time
sys.argv = ["patchctl"] + json.loads(sys.argv[1])
code = None
start = time.monotonic()
try:
    from patchctl.cli.main import main
    main()
except SystemExit as exc:
    code = exc.code
sys.stdout.flush()
# This process's own peak: ru_maxrss would count the forking parent's size (kept across exec).
rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) / 1024
sys.stderr.write("\nPROBE " + json.dumps({"exit": code, "rss_mb": rss, "seconds": time.monotonic() - start}) + "\n")
"""


def probe(argv: list[str], wait: float) -> dict[str, Any]:
    """`patchctl ARGV` in a fresh interpreter (patchctl from $PYTHONPATH): {"exit", "rss_mb", "seconds",
    "doc" (its --json document, None if not one), "stderr", "outcome"}; outcome is "hang" when it ran
    past `wait` (then killed), "traceback" when it crashed or printed no document, else "done"."""
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, json.dumps(argv)],
            capture_output=True,
            text=True,
            timeout=wait,
            env=dict(os.environ),
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "seconds": time.monotonic() - start}
    found = next((json.loads(line[6:]) for line in proc.stderr.splitlines() if line.startswith("PROBE ")), None)
    result: dict[str, Any] = dict(found or {"seconds": time.monotonic() - start}, stderr=proc.stderr[-3000:])
    try:
        result["doc"] = json.loads(proc.stdout)
    except ValueError:
        result["doc"] = None
    bad = found is None or "Traceback" in proc.stderr or result["doc"] is None
    result["outcome"] = "traceback" if bad else "done"
    return result
