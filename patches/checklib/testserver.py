"""The one HTTP server on 127.0.0.1 that tests talk to, built from composable responders.

A responder is a function from a `Request` to a `Reply` (or None: not mine); a `TestServer` asks
its responders in turn and sends the first reply. This module owns everything the fakes used to
repeat: the threads, the shutdown, the headers and framing (Content-Length, chunked, close-delimited,
or a stream that a buffering proxy held back), Range parsing, package pages (PEP 503 HTML and PEP 691
JSON), ETag/Last-Modified validators and server-sent events with known timings. A hostile server is
built of the same parts: a `RAW` reply writes its bytes exactly as given (status line and headers
included, or none at all), with `raw_head`, `zero_stream` (a body of N bytes, or endless up to a
cap) and `drip` (a byte at a time) to make them; a streamed raw reply stops when the server does,
so that a test never waits on a client that has stopped reading. The index servers
(`index_server`, `nightly_index`) and the OpenAI-style model (`reasoner`) are responders over it.

Only the standard library is imported: the bundled checks' smoke environments import it too.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

LENGTH = "length"  # Content-Length, the whole body at once
CHUNKED = "chunked"  # Transfer-Encoding: chunked, one chunk per event, each sent when it is due
CLOSE = "close"  # no length, no chunks: the body ends when the connection closes (HTTP/1.0 style)
BUFFERED = "buffered"  # the events' delays pass, then the whole body at once: what a buffering proxy does
FRAMINGS = (LENGTH, CHUNKED, CLOSE, BUFFERED)
# Not one of FRAMINGS (a body framed for a client): nothing of the server's own, `body` then the
# events' bytes exactly as given (a status line, headers and framing are the reply's to write, or
# to get wrong), then the connection closes. A hostile server's answers.
RAW = "raw"


@dataclass
class Request:
    method: str
    path: str  # without the query string
    query: str
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"{}")


@dataclass
class Reply:
    """What to send. `events` (delay in seconds before it, bytes) make a streamed body; `body` otherwise.
    A Content-Length among `headers` is sent as stated (in its place), not computed from the body."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    events: Iterable[tuple[float, bytes]] | None = None
    framing: str = LENGTH


Responder = Callable[[Request], "Reply | None"]


@dataclass
class Logged:
    method: str
    path: str  # as requested, query included
    range: str | None  # the Range header
    status: int
    sent: int = 0  # body bytes written: set once the reply is written


class TestServer:
    """`with TestServer([responder, ...]) as server:` serves on `server.root` until the block ends.
    `log` has one `Logged` per request answered, entered before its reply is written: a client that
    has its reply finds the request there (entered after, a loaded machine let a test read the log
    before the handler's thread got to it). `protocol` is the HTTP version the handler speaks
    (HTTP/1.1 keeps connections open and is needed for chunked streams)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, responders: Sequence[Responder] = (), *, port: int = 0, protocol: str = "HTTP/1.1") -> None:
        self.responders: list[Responder] = list(responders)
        self.log: list[Logged] = []
        self.stopping = threading.Event()  # set by stop(): raw streams end at their next event
        handler = type("Handler", (_Handler,), {"owner": self, "protocol_version": protocol})
        self.httpd = _Server(("127.0.0.1", port), handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, responder: Responder) -> None:
        self.responders.append(responder)

    def answer(self, request: Request) -> Reply:
        for responder in self.responders:
            reply = responder(request)
            if reply is not None:
                return reply
        return json_reply({"error": "not found"}, 404)

    def start(self) -> TestServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def serve_forever(self) -> None:
        """In the foreground, for a server run as its own process."""
        self.httpd.serve_forever()

    def __enter__(self) -> TestServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # a benchmark at concurrency 128 opens that many connections at once

    def get_request(self) -> tuple[Any, Any]:
        conn, addr = super().get_request()
        # As the engines' servers (uvicorn, aiohttp) do: each small SSE write goes out at once. With
        # Nagle's algorithm on, a stream on a reused connection waits for the client's delayed ACK
        # (40 ms on Linux) after its headers, and then every event arrives in one burst.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients close streams right after [DONE], before the terminating chunk; the kernel then
        # answers with RST. Not an error worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: TestServer

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path, _, query = self.path.partition("?")
        reply = self.owner.answer(Request(self.command, path, query, self.headers, body))
        logged = Logged(self.command, self.path, self.headers.get("Range"), reply.status)
        self.owner.log.append(logged)
        logged.sent = self._send(reply, head=self.command == "HEAD")

    def _send(self, reply: Reply, head: bool) -> int:
        if reply.framing == RAW:
            return self._send_raw(reply)
        framing = reply.framing if reply.events is not None else LENGTH
        if framing not in FRAMINGS:
            raise ValueError(f"unknown framing {framing!r}")
        self.send_response(reply.status)
        stated = any(name.lower() == "content-length" for name in reply.headers)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if framing in (LENGTH, BUFFERED):
            if reply.events is not None:  # buffered: wait for every event, then send them as one body
                parts = []
                for delay, data in reply.events:
                    time.sleep(delay)
                    parts.append(data)
                body = b"".join(parts)
            else:
                body = reply.body
            if not stated:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if head:
                return 0
            self.wfile.write(body)
            return len(body)
        if framing == CHUNKED:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        sent = 0
        # Each event at its due time (the delays summed from the first), not a delay after the
        # previous write: on a loaded machine every sleep overshoots, and summed overshoots would
        # make the stream's known timings (a test's truth) slower than they were set. But never
        # less than half its delay after the previous one, and a stream far behind forgets its
        # debt: catching up in a burst would look like a buffered stream.
        due = time.perf_counter()
        for delay, data in reply.events or ():
            now = time.perf_counter()
            due = max(due + delay, now - delay)
            if (wait := max(due - now, delay / 2)) > 0:
                time.sleep(wait)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if framing == CHUNKED else data)
            self.wfile.flush()
            sent += len(data)
        if framing == CHUNKED:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        return sent

    def _send_raw(self, reply: Reply) -> int:
        """`body`, then each event's bytes once its delay has passed, unless the server stops first;
        the bytes written, all counted (the reply's head is among them)."""
        self.close_connection = True
        self.wfile.write(reply.body)
        self.wfile.flush()
        sent = len(reply.body)
        for delay, data in reply.events or ():
            if self.owner.stopping.wait(delay):
                break
            self.wfile.write(data)
            self.wfile.flush()
            sent += len(data)
        return sent


# Replies -----------------------------------------------------------------------------------------


def json_reply(obj: Any, status: int = 200, content_type: str = "application/json") -> Reply:
    return Reply(status, json.dumps(obj).encode(), {"Content-Type": content_type})


def redirect(location: str, status: int = 301) -> Reply:
    return Reply(status, b"", {"Location": location})


def raw_head(status: str, headers: dict[str, str], version: str = "HTTP/1.1") -> bytes:
    """A status line (`status` as in "206 Partial Content") and header block, written as given and
    ended by the blank line: the start of a `RAW` reply."""
    lines = [f"{version} {status}"] + [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def zero_stream(
    total: int | None, *, cap: int, chunked: bool = False, piece: int = 1 << 20, on_sent: Callable[[int], None] | None = None
) -> Iterator[tuple[float, bytes]]:
    """Events of a body of `total` zero bytes (None: endless), never more than `cap`, `piece` bytes an
    event, chunk-framed (and then ended by the last chunk) if `chunked`. `on_sent` is told each piece's
    body bytes once they were written (a server counting what it sent before the client left)."""
    zeros = bytes(piece)
    left = cap if total is None else min(total, cap)
    while left > 0:
        n = min(left, piece)
        yield 0.0, (b"%x\r\n" % n + zeros[:n] + b"\r\n") if chunked else zeros[:n]
        # (resumed only when the server has written that piece)
        if on_sent is not None:
            on_sent(n)
        left -= n
    if chunked:
        yield 0.0, b"0\r\n\r\n"


def drip(data: bytes, every: float) -> Iterator[tuple[float, bytes]]:
    """Events of `data` one byte at a time, each `every` seconds after the one before."""
    return ((every, data[i : i + 1]) for i in range(len(data)))


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end) of a `Range: bytes=START-[END]` or `bytes=-LENGTH` (the last LENGTH bytes) header,
    clipped to the file; None without one."""
    suffix = re.match(r"bytes=-(\d+)$", header or "")
    if suffix:
        return max(0, size - int(suffix.group(1))), size - 1
    m = re.match(r"bytes=(\d+)-(\d+)?$", header or "")
    if not m:
        return None
    return int(m.group(1)), min(int(m.group(2)) if m.group(2) else size - 1, size - 1)


def file_reply(
    data: bytes, request: Request, *, honour_range: bool = True, content_type: str = "application/octet-stream"
) -> Reply:
    """The file, or the part its Range asks for (206 with Content-Range), as a real index serves it;
    a server that ignores Range (`honour_range=False`) answers 200 with all of it."""
    span = byte_range(request.headers.get("Range"), len(data)) if honour_range else None
    headers = {"Content-Type": content_type}
    if honour_range:
        headers["Accept-Ranges"] = "bytes"
    if span is None:
        return Reply(200, data, headers)
    start, end = span
    headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
    return Reply(206, data[start : end + 1], headers)


PEP691 = "application/vnd.pypi.simple.v1+json"


def pep691_page(name: str, files: list[dict[str, Any]]) -> Reply:
    """A PEP 691 project page; `files` are its entries (filename, url, hashes, size, ...)."""
    return json_reply({"meta": {"api-version": "1.0"}, "name": name, "files": files}, content_type=PEP691)


def pep503_page(name: str, links: Iterable[tuple[str, str]]) -> Reply:
    """A PEP 503 project page of (href, text) anchors, written as given (quoting is the caller's)."""
    anchors = "".join(f'    <a href="{href}">{text}</a><br/>\n' for href, text in links)
    html = f"<!DOCTYPE html>\n<html>\n  <body>\n    <h1>Links for {name}</h1>\n{anchors}  </body>\n</html>\n"
    return Reply(200, html.encode(), {"Content-Type": "text/html"})


def with_validators(reply: Reply, request: Request, last_modified: str) -> Reply:
    """The reply with an ETag (of its body) and Last-Modified, or 304 when the request's
    If-None-Match / If-Modified-Since says the client has it already (as an index's CDN answers)."""
    etag = '"' + hashlib.sha256(reply.body).hexdigest()[:20] + '"'
    if request.headers.get("If-None-Match") == etag or (
        request.headers.get("If-Modified-Since") == last_modified and request.headers.get("If-None-Match") is None
    ):
        return Reply(304, b"", {"ETag": etag})
    return Reply(reply.status, reply.body, {"ETag": etag, "Last-Modified": last_modified, **reply.headers})


def sse_event(payload: str | dict[str, Any]) -> bytes:
    """One server-sent event: `data: PAYLOAD` and the blank line that ends it."""
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {text}\n\n".encode()


def sse_reply(events: Iterable[tuple[float, str | dict[str, Any]]], framing: str = CHUNKED) -> Reply:
    """A text/event-stream of (delay before it, payload) events, framed as `framing` says."""
    return Reply(
        200,
        b"",
        {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
        events=((delay, sse_event(payload)) for delay, payload in events),
        framing=framing,
    )


def route(method: str, pattern: str, make: Callable[[Request, re.Match[str]], Reply | None]) -> Responder:
    """A responder for requests whose method is `method` and whose path matches `pattern` (fully)."""
    compiled = re.compile(pattern)

    def respond(request: Request) -> Reply | None:
        if request.method != method and not (method == "GET" and request.method == "HEAD"):
            return None
        m = compiled.fullmatch(request.path)
        return make(request, m) if m else None

    return respond
