"""HTTP with retries, range reads and friendly errors; the only module that talks to the network.

On the standard library's http.client: requests (with urllib3 and charset_normalizer) costs ~0.2 s
of CPU to import, as much as the round trips of a whole `check` on a fast link. What patchctl needs
is here: connections kept alive and pooled per host (FETCH_POOL of them, as many as `release.py` has
threads, so that a wheel's members are read over connections that already did their TCP and TLS
handshakes), the proxies of the environment ($HTTPS_PROXY, $HTTP_PROXY, $NO_PROXY, as requests and
pip honour them: CONNECT tunnels for https), redirects, gzip for index pages, and retries of
429/5xx answers and of a kept-alive connection the server had closed.

Nothing a server sends may cost more than it should (README, "Limits"): every request has one
deadline, connect to last byte, that a server dripping a byte at a time cannot extend (a watchdog
thread shuts the socket down at it; a whole download's grows with its size at MIN_RATE), and every
answer a cap: a range answer no longer than the range asked, an index page no larger than
PAGE_MAX_BYTES sent or decompressed, a whole download no longer than its Content-Length, the size the
index lists for it or DOWNLOAD_MAX_BYTES. Past either, a NetworkError (exit 3) names the URL and the
limit."""
from __future__ import annotations

import http.client
import os
import socket
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from patchctl.errors import AnswerTooLarge, NetworkError, RangeNotSupported

if TYPE_CHECKING:
    import ssl

DEFAULT_TIMEOUT = 60.0  # seconds: one request's deadline, connect to last byte, and the longest wait for a read (--timeout)
TIMEOUT = DEFAULT_TIMEOUT
MIN_RATE = 256 << 10  # bytes/s: a larger answer's deadline grows by its size at this rate (2 Mbit/s)
PAGE_MAX_BYTES = 8 << 20  # an index page (any answer read whole), as sent and as decompressed: ~100x vLLM's
DOWNLOAD_MAX_BYTES = 2 << 30  # a whole download whose size neither the caller, the index nor Content-Length states
FETCH_POOL = 8
RETRIES = 3
RETRY_STATUS = (429, 500, 502, 503, 504)
_REDIRECTS = (301, 302, 303, 307, 308)

_idle: dict[tuple, list[http.client.HTTPConnection]] = {}
_lock = threading.Lock()
_ssl_context = None
_declared: dict[str, int] = {}  # artifact URL -> the size its index page lists (declare_size)


_before_option: float | None = None  # TIMEOUT as it was before a --timeout replaced it


def set_timeout(seconds: float | None) -> None:
    """The --timeout of this command (options.py sets it before any request); None: undo an earlier
    command's --timeout (a second command in the same process must not inherit it), keeping any
    value set otherwise."""
    global TIMEOUT, _before_option
    if seconds is None:
        if _before_option is not None:
            TIMEOUT, _before_option = _before_option, None
        return
    if _before_option is None:
        _before_option = TIMEOUT
    TIMEOUT = float(seconds)


def declare_size(url: str, size: int) -> None:
    """The size an index page lists for url: a whole download of it may be no longer (index.py
    declares every file it reads, so callers that do not pass max_bytes are held to it too)."""
    if size > 0:
        with _lock:
            _declared[url] = size


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


class _Deadline:
    """When one request (redirects and retries included) must be done: `timeout` seconds after it
    began, plus its size at MIN_RATE (the size expected, or what arrived, whichever is more). The
    watchdog shuts the request's socket down at that moment, so a read blocked on a server that
    sends a byte now and then returns; every read checks `expired` after it."""

    def __init__(self, url: str, what: str, expected: int = 0):
        self.url, self.what = url, what
        self.start = time.monotonic()
        self.timeout = TIMEOUT
        self.expected = expected
        self.received = 0
        self.expired = False
        self.conn: http.client.HTTPConnection | None = None

    def at(self) -> float:
        return self.start + self.timeout + max(self.expected, self.received) / MIN_RATE

    def remaining(self) -> float:
        return self.at() - time.monotonic()

    def expire(self) -> None:
        self.expired = True
        conn = self.conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:  # the plain socket's shutdown, also under TLS: a blocked recv() returns at once
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def check(self) -> None:
        if self.expired or self.remaining() <= 0:
            raise self.error()

    def error(self) -> NetworkError:
        grown = max(self.expected, self.received)
        budget = f"{self.timeout:g} s" + (f" + {_size_text(grown)} at {_size_text(MIN_RATE)}/s" if grown else "")
        return NetworkError(f"{self.what or self.url}: no complete answer from {self.url} within {budget} "
                            "(the deadline of a request)",
                            hint="a slow or stalled server; pass a larger --timeout SECONDS on a slow link")


_watched: set[_Deadline] = set()
_watch_cond = threading.Condition()
_watcher: threading.Thread | None = None


def _watch(deadline: _Deadline) -> None:
    global _watcher
    with _watch_cond:
        _watched.add(deadline)
        if _watcher is None:
            _watcher = threading.Thread(target=_watchdog, name="http-deadline", daemon=True)
            _watcher.start()
        _watch_cond.notify()


def _unwatch(deadline: _Deadline | None) -> None:
    if deadline is not None:
        with _watch_cond:
            _watched.discard(deadline)


def _watchdog() -> None:
    """One thread for every request's deadline: sleeps until the nearest, expires those due."""
    while True:
        with _watch_cond:
            now = time.monotonic()
            for deadline in [d for d in _watched if d.at() <= now]:
                _watched.discard(deadline)
                deadline.expire()
            nearest = min((d.at() for d in _watched), default=None)
            _watch_cond.wait(None if nearest is None else max(0.01, nearest - now))


def _too_large(url: str, limit: int, why: str, got: str = "") -> AnswerTooLarge:
    return AnswerTooLarge(f"the answer from {url} is larger than {why} ({_size_text(limit)})"
                          + (f": {got}" if got else ""),
                          hint="the server sent more than it should; check the index or mirror")


class Response:
    """The parts of an HTTP answer patchctl reads (named as requests names them)."""

    def __init__(self, conn: http.client.HTTPConnection, raw: http.client.HTTPResponse, url: str, key: tuple,
                 deadline: _Deadline | None = None):
        self.status_code = raw.status
        self.headers = raw.headers  # case-insensitive get()
        self.url = url
        self._conn: http.client.HTTPConnection | None = conn
        self._raw, self._key = raw, key
        self._content: bytes | None = None
        self._deadline = deadline
        # The most the body may hold (as sent, and decompressed): set by the request's kind.
        self.max_bytes = PAGE_MAX_BYTES
        self.limit_why = "the limit of an index page"

    def _length(self) -> int | None:
        value = (self.headers.get("Content-Length") or "").strip()
        return int(value) if value.isdigit() else None

    def refuse_declared_excess(self) -> None:
        """An answer whose Content-Length is over the cap is refused before a byte of it is read."""
        length = self._length()
        if length is not None and length > self.max_bytes:
            self.close()
            raise _too_large(self.url, self.max_bytes, self.limit_why, f"its Content-Length is {length}")

    @property
    def content(self) -> bytes:
        if self._content is None:
            self.refuse_declared_excess()
            limit = self.max_bytes
            data = self._io(self._raw.read, limit + 1)  # never more than the cap (and one byte to tell)
            if len(data) > limit:
                self.close()
                raise _too_large(self.url, limit, self.limit_why)
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                # Inflated in one bounded step: a gzip bomb stops at the cap, not at the machine's memory.
                inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
                try:
                    data = inflater.decompress(data, limit + 1)
                except zlib.error as exc:
                    self.close()
                    raise NetworkError(f"{self.url}: the gzip answer is corrupt ({exc})") from None
                if len(data) > limit:
                    self.close()
                    raise _too_large(self.url, limit, self.limit_why, "decompressed")
                if not inflater.eof:
                    self.close()
                    raise NetworkError(f"{self.url}: the gzip answer is cut short")
            self._content = data
            self._release()
        return self._content

    @property
    def text(self) -> str:
        charset = self.headers.get_content_charset() or "utf-8"
        try:
            return self.content.decode(charset, errors="replace")
        except LookupError:  # a charset Python does not know: read as UTF-8, as browsers fall back
            return self.content.decode("utf-8", errors="replace")

    def iter_content(self, size: int) -> Iterator[bytes]:
        """The body in pieces of at most `size` bytes as they arrive, never beyond max_bytes."""
        self.refuse_declared_excess()
        limit = self.max_bytes
        received = 0
        while True:
            chunk = self._io(self._raw.read1, min(size, limit + 1 - received))
            if not chunk:
                self._release()
                return
            received += len(chunk)
            if self._deadline is not None:
                self._deadline.received = received  # an answer of unknown size: its deadline grows with it
            if received > limit:
                self.close()
                raise _too_large(self.url, limit, self.limit_why)
            yield chunk

    def _io(self, read: Callable[[int], bytes], n: int) -> bytes:
        """One read of the body. Past the deadline (the watchdog shut the socket down, so the read
        failed or looks like a normal end) the request failed, whatever the read said."""
        try:
            data = read(n)
        except (OSError, http.client.HTTPException):
            if self._deadline is not None and self._deadline.expired:
                self.close()
                raise self._deadline.error() from None
            raise
        if self._deadline is not None and (self._deadline.expired or self._deadline.remaining() <= 0):
            self.close()
            raise self._deadline.error()
        return data

    def close(self) -> None:
        _unwatch(self._deadline)
        if self._conn is not None:
            self._conn.close()  # the body was not read to its end: the connection cannot be reused
            self._conn = None

    def _release(self) -> None:
        _unwatch(self._deadline)
        if self._conn is not None:
            if not self._raw.isclosed() and self._raw.length == 0:
                self._raw.close()  # read1() to the end leaves it open: the connection is free again
            if self._raw.will_close or not self._raw.isclosed() or (
                    self._deadline is not None and self._deadline.expired):
                self._conn.close()
            else:
                with _lock:
                    pool = _idle.setdefault(self._key, [])
                    if len(pool) < FETCH_POOL:
                        pool.append(self._conn)
                    else:
                        self._conn.close()
            self._conn = None


def _context() -> ssl.SSLContext:
    global _ssl_context
    if _ssl_context is None:
        import ssl

        cafile = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if not cafile:
            try:
                import certifi  # requests' default trust store

                cafile = certifi.where()
            except ImportError:
                cafile = None
        _ssl_context = ssl.create_default_context(cafile=cafile)
    return _ssl_context


def _proxy_for(scheme: str, host: str) -> str | None:
    if not any(k.lower().endswith("_proxy") for k in os.environ):
        return None  # (urllib.request, which reads them as requests does, is itself ~30 ms to import)
    import urllib.request

    if urllib.request.proxy_bypass(host):
        return None
    return urllib.request.getproxies().get(scheme)


_addresses: dict[tuple[str, int], list[tuple]] = {}


def _create_connection(address: tuple[str, int], timeout: float | None = None,
                       source_address: tuple[str, int] | None = None) -> socket.socket:
    """socket.create_connection with the host looked up once per process. A matrix opens dozens of
    connections to one host, and a resolver that now and then waits out its 5 s timeout (as this
    machine's did, about one lookup in sixty) stalled a whole release each time."""
    host, port = address
    with _lock:
        found = _addresses.get((host, port))
    if found is None:
        found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
        with _lock:
            _addresses[(host, port)] = found
    error: OSError | None = None
    for *_, sockaddr in found:
        try:
            return socket.create_connection(sockaddr[:2], timeout, source_address)
        except OSError as exc:
            error = exc
    raise error or OSError(f"{host} resolves to no address")


def _connect(key: tuple) -> http.client.HTTPConnection:
    conn = _new_connection(key)
    setattr(conn, "_create_connection", _create_connection)  # noqa: B010  (http.client's own seam, not in its stubs)
    return conn


def _new_connection(key: tuple) -> http.client.HTTPConnection:
    scheme, host, port, proxy = key
    if proxy:
        p = urllib.parse.urlsplit(proxy)
        if scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                p.hostname, p.port or 80, timeout=TIMEOUT, context=_context())
            conn.set_tunnel(host, port)
            return conn
        return http.client.HTTPConnection(p.hostname, p.port or 80, timeout=TIMEOUT)
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=TIMEOUT, context=_context())
    return http.client.HTTPConnection(host, port, timeout=TIMEOUT)


def _pool_key(url: str) -> tuple[urllib.parse.SplitResult, tuple]:
    """The URL's parts and the pool its connections live in: (scheme, host, port, proxy)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NetworkError(f"cannot fetch {url}: not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts, (parts.scheme, parts.hostname, port, _proxy_for(parts.scheme, parts.hostname))


def _request(method: str, url: str, headers: dict, stream: bool, deadline: _Deadline) -> Response:
    for _redirect in range(6):
        parts, key = _pool_key(url)
        proxy = key[3]
        target = url.split("#", 1)[0] if proxy and parts.scheme == "http" else \
            urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        send = {"User-Agent": "patchctl", "Accept-Encoding": "identity" if stream or "Range" in headers else "gzip",
                **headers}
        response = _send(method, key, target, send, url, deadline)
        if response.status_code in _REDIRECTS and response.headers.get("Location"):
            response.content  # noqa: B018  (read: the connection goes back to the pool)
            url = urllib.parse.urljoin(url, response.headers["Location"])
            if response.status_code == 303:
                method = "GET"
            continue
        return response
    raise NetworkError(f"{url}: too many redirects")


def _send(method: str, key: tuple, target: str, headers: dict, url: str, deadline: _Deadline) -> Response:
    attempt = 0
    while True:
        deadline.check()
        with _lock:
            pool = _idle.get(key) or []
            conn = pool.pop() if pool else None
        reused = conn is not None
        conn = conn or _connect(key)
        # Never wait longer for a connection or a read than the request has left.
        conn.timeout = max(0.001, min(TIMEOUT, deadline.remaining()))
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        deadline.conn = conn
        try:
            conn.request(method, target, headers=headers)
            if deadline.expired:  # shut down before the request was out: nothing will answer
                raise TimeoutError
            raw = conn.getresponse()
            if deadline.expired:
                raise TimeoutError
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            conn.close()
            if deadline.expired:
                raise deadline.error() from None
            if reused:  # the server closed a kept-alive connection: again on a new one
                continue
            exc_to_raise: Exception = exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            if deadline.expired or isinstance(exc, TimeoutError) and deadline.remaining() <= 0:
                raise deadline.error() from None
            exc_to_raise = exc
        else:
            if raw.status in RETRY_STATUS and attempt < RETRIES:
                conn.close()  # (its body unread: a retry needs no bytes of an error page)
                _pause(0.5 * 2 ** attempt, deadline)
                attempt += 1
                continue
            return Response(conn, raw, url, key, deadline)
        if attempt >= RETRIES or isinstance(exc_to_raise, (TimeoutError, http.client.HTTPException)):
            raise exc_to_raise
        _pause(0.5 * 2 ** attempt, deadline)
        attempt += 1


def _pause(seconds: float, deadline: _Deadline) -> None:
    """The back-off before a retry, never past the deadline."""
    if deadline.remaining() <= seconds:
        raise deadline.error()
    time.sleep(seconds)


def get(url: str, *, headers: dict | None = None, stream: bool = False, what: str = "",
        max_bytes: int | None = None, expected: int = 0) -> Response:
    """One GET under one deadline (redirects and retries included). Read whole (stream=False, an
    index page) the body may be at most max_bytes (PAGE_MAX_BYTES) sent and decompressed; streamed
    (a whole download), at most max_bytes, else the size the index lists for url, else
    DOWNLOAD_MAX_BYTES, and never longer than its Content-Length; its deadline grows by that size at
    MIN_RATE. `expected`: bytes the answer should carry, for the deadline (a range's length)."""
    if stream:
        with _lock:
            declared = _declared.get(url)
        limit = max_bytes or declared or DOWNLOAD_MAX_BYTES
        why = ("the size asked for" if max_bytes else "the size the index lists" if declared
               else "the download limit")
    else:
        limit = max_bytes or PAGE_MAX_BYTES
        why = "the size asked for" if max_bytes else "the limit of an index page"
    deadline = _Deadline(url, what, expected)
    _watch(deadline)
    try:
        response = _request("GET", url, dict(headers or {}), stream, deadline)
        response.max_bytes, response.limit_why = limit, why
        if stream:
            length = response._length()
            if length is not None:  # a download's deadline grows with its size
                deadline.expected = max(deadline.expected, min(length, limit))
        else:
            response.content  # noqa: B018
        return response
    except NetworkError as exc:
        _unwatch(deadline)
        if what and not exc.message.startswith(what):
            exc.message = f"{what}: {exc.message}"
            exc.args = (exc.message,)
        raise
    except (OSError, http.client.HTTPException, EOFError, ValueError) as exc:  # ValueError: a bad port
        _unwatch(deadline)
        if deadline.expired:
            raise deadline.error() from None
        raise NetworkError(f"cannot reach {what or url}: {_short(exc)}") from None


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "…"


def _get_partial(url: str, byte_range: str, what: str, length: int) -> Response:
    """The 206 answer to a Range request, which may carry at most `length` bytes (the range asked);
    RangeNotSupported when the server sends the whole file."""
    response = get(url, headers={"Range": byte_range}, stream=True, what=what, max_bytes=length, expected=length)
    if response.status_code == 200:
        response.close()
        raise RangeNotSupported(url)
    if response.status_code != 206:
        response.close()
        raise NetworkError(f"{what or url}: HTTP {response.status_code} for a range request")
    return response


def get_range(url: str, start: int, end: int, *, what: str = "") -> bytes:
    """Bytes [start, end] inclusive; RangeNotSupported when the server ignores Range."""
    length = end - start + 1
    response = _get_partial(url, f"bytes={start}-{end}", what, length)
    answered = (response.headers.get("Content-Range") or "").partition(" ")[2].partition("/")[0]
    if answered and answered != f"{start}-{end}":
        response.close()
        raise NetworkError(f"{what or url}: the server answered bytes {answered[:40]} to a request for {start}-{end}")
    data = _read(response, what or url)
    if len(data) != length:
        raise NetworkError(f"{what or url}: short range read ({len(data)} of {length} bytes)")
    return data


def get_suffix(url: str, length: int, *, what: str = "") -> tuple[int, bytes]:
    """The last `length` bytes and the file's size (from Content-Range), in one request: for a file
    whose size the index did not publish, instead of a HEAD first."""
    response = _get_partial(url, f"bytes=-{length}", what, length)
    total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
    if not total.isdigit():
        response.close()
        raise NetworkError(f"{what or url}: a range answer without the file's size (Content-Range)")
    data = _read(response, what or url)
    if len(data) > int(total):
        raise NetworkError(f"{what or url}: a range answer longer than the file's size ({total} bytes)")
    return int(total), data


def _read(response: Response, what: str) -> bytes:
    try:
        return response.content
    except NetworkError as exc:
        if not exc.message.startswith(what):
            exc.message = f"{what}: {exc.message}"
            exc.args = (exc.message,)
        raise
    except (OSError, http.client.HTTPException) as exc:
        response.close()
        raise NetworkError(f"{what}: the answer broke off ({_short(exc)})") from None


def warm(url: str, connections: int) -> None:
    """Have `connections` pooled connections to url's host, opening the missing ones (TCP, the proxy's
    CONNECT, TLS: no request) on daemon threads, and return at once: the requests that follow find
    them open, or (when a handshake is slow) open their own. Failures are left to those requests."""
    try:
        key = _pool_key(url)[1]
    except (NetworkError, ValueError):
        return
    with _lock:  # connections an earlier read left in the pool need no warming (the matrix)
        connections = min(connections, FETCH_POOL) - len(_idle.get(key) or ())

    def one() -> None:
        conn = _connect(key)
        try:
            conn.connect()
        except (OSError, http.client.HTTPException):
            conn.close()
            return
        with _lock:
            pool = _idle.setdefault(key, [])
            if len(pool) < FETCH_POOL:
                pool.append(conn)
                return
        conn.close()

    for _ in range(max(0, connections)):
        threading.Thread(target=one, name="http-warm", daemon=True).start()
