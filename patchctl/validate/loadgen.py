"""A level's requests on one asyncio loop: the load generator, so that the client is not what is measured.

Why not sources/http.py, the house's one HTTP client, as every other request validate makes: it is
blocking, so a level needed a thread per request in flight (256 at c=256), each woken by its socket
and queued for the GIL whenever a token arrives on every stream at once. Issue 37 measured TTFT 12%
high at c=128 that way. Against benchmarks/paced_server.py on a quiet 16-core machine (2026-12-05,
docs/benchmarks.md), with the server keeping time, both this loop and the threads read TTFT and ITL
within 1% of the truth and of a minimal asyncio client up to c=256, but the threads spent 45-61 us of
CPU per token against this loop's 34-38 (c=32-256): one core saturates ~25% sooner. aiohttp read
the same at about the same cost (36-59 us), so no reason for a dependency; httpx fell behind from
c=128 (TTFT 2.1 s against 0.3). Here one thread reads every stream: each read's bytes go through an
asyncio Protocol's data_received (no coroutine per chunk), are unframed, and fed to the same Reading
(reading.py) the blocking client uses: the same SSE parser, the same caps and checks, the same
records.

What the blocking client guarantees, this keeps: one wall deadline per request, connect to last
byte, that a server dripping bytes cannot extend (asyncio.wait_for around the whole exchange; the
connection is closed at it); a cap on the response head (HEAD_MAX_BYTES), on a chunk-size line, and
reading.py's on the reply and on every SSE line; a compressed reply refused; bad replies noted on the
client (`bad_replies`) and answered/unanswered counted the same; the proxy pip or the environment
names (sources/connection.py's choice: plain http through it with the absolute URL, https tunnelled
with CONNECT) and TLS against the same trust store (connection.context()).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from patchctl.core.errors import (
    BadServerReply,
    HTTPError,
    RequestDeadline,
    RequestFailed,
    ServerError,
    TruncatedStream,
    plain_network_reason,
)
from patchctl.sources.connection import context, pool_key
from patchctl.validate.metrics import RequestRecord
from patchctl.validate.reading import Reading, reply_cap

if TYPE_CHECKING:
    from patchctl.validate.client import OpenAIClient

OnHead = Callable[[int, dict[str, str]], None]  # (status, headers with lower-case names)
OnBody = Callable[[bytes, float], bool]  # (a read's body bytes, when it arrived) -> stop reading
HEAD_MAX_BYTES = 64 << 10  # a response's status line and headers, at most
SIZE_LINE_MAX = 1024  # one chunk-size line (hex digits and extensions)
_HEX = re.compile(rb"[0-9a-fA-F]{1,16}")  # a chunk's size: hex digits, not int()'s "0x", "_" or sign
ERROR_TEXT_BYTES = 300  # of an error reply's body, what is read and quoted
# How long a slot waits for the end of a body that stopped at [DONE] (its terminating chunk) before
# its next request, so as to reuse the connection: engines send it right after [DONE].
DRAIN_S = 0.05


class Exchange(asyncio.Protocol):
    """One kept-alive connection: HTTP/1.1 responses unframed (Content-Length, chunked, or to the
    connection's end) and each read's body bytes handed to `on_body(piece, now)` at once, `now`
    being when that read arrived. A request's `done` future ends with None or an exception."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.done: asyncio.Future[None] | None = None
        self.buf = bytearray()
        self.requests = 0  # sent on this connection: a reused one the server closed is sent again
        self.head_only = False  # a proxy's answer to CONNECT: a head and no body
        # Set while the rest of a body that stopped at [DONE] is read (its terminating chunk, which
        # may come in a read of its own): done once the body ended, and the connection is reusable
        # if it ended cleanly (`keep`).
        self.drained: asyncio.Future[None] | None = None
        self.got_bytes = False

    # -- asyncio's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._drained()
        if self.done is not None and not self.done.done():
            try:
                self._eof()
            except Exception as err:  # noqa: BLE001  (the request's failure, handed to its awaiter)
                self._fail(err)

    def eof_received(self) -> bool:
        return False  # close our side too: nothing more comes

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.done is None or self.done.done() and self.drained is None:
            return  # bytes after a request ended and was not left draining: the connection is not reused
        self.got_bytes = True
        try:
            self.buf += data
            self._parse(now)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    # -- one request ---------------------------------------------------------------------------

    def send(self, data: bytes, on_head: OnHead, on_body: OnBody) -> asyncio.Future[None]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.on_head, self.on_body = on_head, on_body
        self.state = "head"
        self.keep = False
        self.left = 0  # bytes of the current chunk, or of a Content-Length body, still to come
        self.chunked = False
        self.got_bytes = False
        self.buf.clear()
        self.requests += 1
        self.transport.write(data)
        return self.done

    def _finish(self, keep: bool) -> None:
        self.keep = keep
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.keep = False
        self._drained()
        if self.transport is not None:
            self.transport.close()
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _parse(self, now: float) -> None:
        if self.state == "head":
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > HEAD_MAX_BYTES:
                    raise BadServerReply(f"the reply's status line and headers pass {HEAD_MAX_BYTES} bytes")
                return
            if end > HEAD_MAX_BYTES:
                raise BadServerReply(f"the reply's status line and headers pass {HEAD_MAX_BYTES} bytes")
            head = bytes(self.buf[:end]).decode("latin-1")
            del self.buf[: end + 4]
            self._head(head)
        piece = self._body()
        if self.drained is not None:  # the request is done: only its body's end is awaited
            if self.state == "end":
                self.keep = not self.buf and self.keep_alive
                self._drained()
            return
        if piece or self.state == "end":
            stop = bool(piece) and self.on_body(piece, now)
            if self.state == "end":
                # the connection is reused only when the body ended exactly there
                self._finish(keep=not self.buf and self.keep_alive)
            elif stop:
                # [DONE] read before the body's end (its terminating chunk comes just after): the
                # request is done now; the rest is read while it lasts, for the connection's sake
                self._finish(keep=False)
                if self.keep_alive:
                    self.drained = asyncio.get_running_loop().create_future()

    def _drained(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    def _head(self, head: str) -> None:
        status_line, *lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise BadServerReply(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadServerReply(f"a header line with no colon: {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        self.status = int(parts[1])
        self.keep_alive = parts[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length", "")
        if self.head_only:
            self.state = "end"
        elif self.chunked:
            self.state = "size"
        elif length:
            if not length.isdigit() or len(length) > 16:
                raise BadServerReply(f"the reply's Content-Length is not a byte count: {length[:40]!r}")
            self.left = int(length)
            self.state = "length" if self.left else "end"
        else:
            self.state, self.keep_alive = "close", False  # the body runs to the connection's end
        self.on_head(self.status, headers)

    def _body(self) -> bytes:
        """The body bytes that arrived in the buffer, unframed; the state says what comes next."""
        if self.state in ("length", "close"):
            take = len(self.buf) if self.state == "close" else min(self.left, len(self.buf))
            piece = bytes(self.buf[:take])
            del self.buf[:take]
            if self.state == "length":
                self.left -= take
                if self.left == 0:
                    self.state = "end"
            return piece
        out = bytearray()
        while self.state not in ("end", "head"):
            if self.state == "size":
                nl = self.buf.find(b"\r\n")
                if nl < 0:
                    if len(self.buf) > SIZE_LINE_MAX:
                        raise BadServerReply(f"a chunk-size line longer than {SIZE_LINE_MAX} bytes")
                    break
                line = bytes(self.buf[:nl]).split(b";", 1)[0].strip()
                del self.buf[: nl + 2]
                if not _HEX.fullmatch(line):
                    raise BadServerReply(f"not a chunk size: {line[:40]!r}")
                self.left = int(line, 16)
                self.state = "data" if self.left else "trailer"
            elif self.state == "data":
                take = min(self.left, len(self.buf))
                if not take:
                    break
                out += self.buf[:take]
                del self.buf[:take]
                self.left -= take
                if self.left == 0:
                    self.state = "crlf"
            elif self.state == "crlf":
                if len(self.buf) < 2:
                    break
                if self.buf[:2] != b"\r\n":
                    raise BadServerReply("a chunk not followed by CRLF")
                del self.buf[:2]
                self.state = "size"
            else:  # trailer: header lines until an empty one
                nl = self.buf.find(b"\r\n")
                if nl < 0:
                    if len(self.buf) > HEAD_MAX_BYTES:
                        raise BadServerReply(f"the reply's trailers pass {HEAD_MAX_BYTES} bytes")
                    break
                del self.buf[: nl + 2]
                if nl == 0:
                    self.state = "end"
        return bytes(out)

    def _eof(self) -> None:
        """The connection closed during a request: the end of a close-delimited body, else a reply cut short."""
        if self.state == "close":
            self.state = "end"
            self.on_body(b"", time.perf_counter())
            self._finish(keep=False)
            return
        if self.state == "head" and not self.got_bytes:
            raise ConnectionResetError("the server closed the connection before answering")
        where = "in its head" if self.state == "head" else "mid-body"
        raise RequestFailed(f"the reply was cut short (the connection closed {where})")


class Target:
    """Where a level's requests go: the server's address, or the proxy's (connection.py's choice)."""

    def __init__(self, base_url: str) -> None:
        parts, (scheme, host, port, proxy) = pool_key(base_url)
        self.scheme, self.host, self.port, self.proxy = scheme, host, port, proxy
        self.host_header = host if port == (443 if scheme == "https" else 80) else f"{host}:{port}"
        self.base_url = base_url

    def path(self, url: str) -> str:
        """The request target: the absolute URL to a proxy for plain http, else the path."""
        if self.proxy and self.scheme == "http":
            return url
        parts = urllib.parse.urlsplit(url)
        return urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))

    async def connect(self) -> Exchange:
        loop = asyncio.get_running_loop()
        tls = context() if self.scheme == "https" else None
        if not self.proxy:
            name = self.host if tls else None
            _, proto = await loop.create_connection(Exchange, self.host, self.port, ssl=tls, server_hostname=name)
            return proto
        p = urllib.parse.urlsplit(self.proxy)
        transport, proto = await loop.create_connection(Exchange, p.hostname or "", p.port or 80)
        if tls is None:
            return proto
        await _tunnel(proto, self.host, self.port)
        tls_transport = await loop.start_tls(transport, proto, tls, server_hostname=self.host)
        if tls_transport is None:
            raise OSError(f"TLS to {self.host} through the proxy did not start")
        proto.transport = tls_transport
        return proto


async def _tunnel(proto: Exchange, host: str, port: int) -> None:
    """CONNECT host:port through the proxy; its answer's head is all it may send (HEAD_MAX_BYTES)."""
    status: list[int] = []
    proto.head_only = True
    done = proto.send(
        f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode("ascii"),
        lambda code, headers: status.append(code),
        lambda piece, now: True,
    )
    try:
        await done
    finally:
        proto.head_only = False
        proto.requests = 0  # the first request through the tunnel is its first
    if status != [200]:
        raise OSError(f"the proxy refused CONNECT {host}:{port}: HTTP {status[0] if status else '?'}")


def request_bytes(target: Target, method: str, url: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"{method} {target.path(url)} HTTP/1.1", f"Host: {target.host_header}", "User-Agent: patchctl"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Slot:
    """One concurrency slot: its kept-alive connection, opened again when the server closed it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conn: Exchange | None = None

    async def settle(self) -> None:
        """The previous request's body read to its end (DRAIN_S at most, not the next request's
        time): its connection is then reused; otherwise dropped, and open() opens another."""
        conn = self.conn
        if conn is None or conn.drained is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(conn.drained), DRAIN_S)
        except asyncio.TimeoutError:
            pass
        if conn.drained is not None or not conn.keep or conn.lost:
            self.drop()

    async def open(self) -> None:
        if self.conn is None or self.conn.lost:
            self.conn = await self.target.connect()

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class _Reply:
    """What came back for one request, as the callbacks see it."""

    def __init__(self) -> None:
        self.answered = False
        self.status = 0
        self.body = bytearray()  # a whole non-streamed reply, or the start of an error's

    def http_error(self) -> HTTPError:
        return HTTPError(f"HTTP {self.status}: {self.body.decode('utf-8', errors='replace')}")


async def timed_request(
    client: OpenAIClient,
    slot: Slot,
    api: str,
    body: dict[str, Any],
    stream: bool,
    max_tokens: int,
    *,
    label: str,
    seconds: float,
    why: str | None,
) -> RequestRecord:
    """client.timed_request's record, on this loop: the same Reading, errors and accounting."""
    url = client.url(api)
    data = request_bytes(slot.target, "POST", url, client.headers, json.dumps(body).encode())
    got = Reading(max_tokens)
    reply = _Reply()
    cap = reply_cap(max_tokens)

    def on_head(status: int, headers: dict[str, str]) -> None:
        reply.answered = True
        client.count_answer(True)
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            raise BadServerReply(
                f"the reply is compressed (Content-Encoding {encoding[:40]}) though identity was asked: "
                "its size could not be capped as it is read"
            )
        reply.status = status
        if status < 400 and stream:
            got.start_stream()

    def on_body(piece: bytes, now: float) -> bool:
        if reply.status >= 400:  # the start of an error's body is read, no more
            reply.body.extend(piece[: ERROR_TEXT_BYTES - len(reply.body)])
            if len(reply.body) >= ERROR_TEXT_BYTES:
                raise reply.http_error()
            return False
        if stream:
            return got.feed(piece, now) if piece else False
        reply.body.extend(piece)
        if len(reply.body) > cap:
            raise BadServerReply(f"the reply passed {cap} bytes (the cap of a reply)")
        return False

    async def exchange() -> None:
        for attempt in (0, 1):
            await slot.open()
            assert slot.conn is not None
            reused = slot.conn.requests > 0
            try:
                await slot.conn.send(data, on_head, on_body)
                break
            except ConnectionResetError:
                slot.drop()
                if not reused or attempt:  # a kept-alive connection the server had closed: once more
                    raise
        if reply.status >= 400:
            raise reply.http_error()
        if stream:
            got.end_stream()
        else:
            got.take_whole(bytes(reply.body))

    error: str | None = None
    await slot.settle()
    start = time.perf_counter()  # as the blocking client's: before a connection that must be opened again
    try:
        # One wall deadline, connect to last byte: wait_for cancels the exchange at it, whatever arrived.
        await asyncio.wait_for(exchange(), seconds)
        if not slot.conn or not (slot.conn.keep or slot.conn.drained is not None):
            slot.drop()
    except asyncio.TimeoutError:
        slot.drop()
        what = "the reply was not complete" if reply.answered else "no answer"
        named = why or f"--timeout {client.timeout_s:g} s"
        exc = RequestDeadline(f"{what} within {seconds:.3g} s ({named}) from {url}", reply.answered)
        if not reply.answered:
            client.count_answer(False, str(exc))
        error = f"{type(exc).__name__}: {exc}"[:300]
    except BadServerReply as exc:
        slot.drop()
        client.note_bad_reply(label, exc)
        error = f"BadServerReply: {exc}"[:300]
    except (RequestFailed, ServerError, TruncatedStream, ValueError, HTTPError) as exc:
        slot.drop()
        error = f"{type(exc).__name__}: {exc}"[:300]
    except OSError as exc:
        slot.drop()
        failed = RequestFailed(f"cannot reach {url}: {exc or type(exc).__name__}")
        if not reply.answered:
            client.count_answer(False, plain_network_reason(str(exc) or type(exc).__name__))
        error = f"{type(failed).__name__}: {failed}"[:300]
    end = time.perf_counter()
    return got.record(ok=error is None, error=error, streamed=stream, start=start, end=end)
