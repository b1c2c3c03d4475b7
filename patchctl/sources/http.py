"""patchctl's one HTTP client: retries, size caps and friendly errors; the only module that talks to
the network. The index's pages (get), range reads (ranges.py), downloads (download.py), registries
(image/distribution.py) and validate's requests to a server (validate/client.py) all go through
send() here, each under one deadline of deadline.py's, its connections opened by connection.py.

On the standard library's http.client, chosen by measurement (benchmarks/http_clients.py): it is
the cheapest to import (urllib3 costs ~2x, requests ~3x, httpx ~4x) and streams at the raw socket's
rate, and none of the libraries has a wall deadline a dripping server cannot extend (each has a
per-read timeout only), so each would still need this watchdog and a way to its socket that they
keep private. What patchctl needs is here: connections kept alive and pooled per host (FETCH_POOL of
them, as many as `release.py` has threads, so that a wheel's members are read over connections that
already did their TCP and TLS handshakes), pip's proxy and the environment's (CONNECT tunnels for
https), pip's trust store, redirects (a login is not carried to another origin), gzip for index
pages, and retries of 429/5xx answers and of a kept-alive connection the server had closed.

Nothing a server sends may cost more than it should (docs/limits.md): every request has one
deadline, connect to last byte, that a server dripping a byte at a time cannot extend (deadline.py:
its allowance is fixed from the size the answer may carry, never from what arrived), and every
answer a cap: a range answer no longer than the range asked, an index page no larger than
PAGE_MAX_BYTES sent or decompressed, a whole download no longer than its Content-Length, the size the
index lists for it, and DOWNLOAD_MAX_BYTES (--max-download) in any case. An answer shorter than its
Content-Length, or a chunked one that breaks off, is an error too, never a shorter page. Past any of
these, a NetworkError (exit 3) names the URL and the limit."""

from __future__ import annotations

import http.client
import io
import re
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import IO

from patchctl.core.errors import AnswerTooLarge, NetworkError, RangeNotSupported  # noqa: F401  (release.py's)
from patchctl.sources.connection import Connection, Key, pool_key
from patchctl.sources.deadline import MIN_RATE, Deadline, size_text, unwatch, watch  # noqa: F401  (MIN_RATE: image/'s)

DEFAULT_TIMEOUT = 60.0  # seconds: one request's deadline, connect to last byte, and the longest wait for a read (--timeout)
TIMEOUT = DEFAULT_TIMEOUT
PAGE_MAX_BYTES = 8 << 20  # an index page (any answer read whole), as sent and as decompressed: ~100x vLLM's
# Any one download (--max-download): twice the largest engine wheel on the index (vllm 0.15.1's
# x86_64 wheel, 509,219,874 bytes), rounded up. An index listing more for a file is refused before
# a byte is fetched; a server sending more is cut off at it.
DEFAULT_DOWNLOAD_MAX_BYTES = 1 << 30
DOWNLOAD_MAX_BYTES = DEFAULT_DOWNLOAD_MAX_BYTES
MAX_SIZE = (1 << 53) - 1  # no byte count a server or an index states may be larger (JSON's exact integers)
FETCH_POOL = 8
RETRIES = 3
RETRY_STATUS = (429, 500, 502, 503, 504)
_REDIRECTS = (301, 302, 303, 307, 308)
Body = bytes | IO[bytes] | None  # a file is streamed (its Content-Length given by the caller)

_idle: dict[Key, list[http.client.HTTPConnection]] = {}
_lock = threading.Lock()
_declared: dict[str, int] = {}  # artifact URL -> the size its index page lists (declare_size)


_before_option: dict[str, float] = {}  # TIMEOUT, DOWNLOAD_MAX_BYTES as they were before an option replaced them


def _set_option(name: str, value: float | None) -> None:
    """A module setting of this command (options.py sets it before any request); None: undo an
    earlier command's option (a second command in the same process must not inherit it), keeping any
    value set otherwise (the hostile-server tests' child processes set them directly)."""
    if value is None:
        if name in _before_option:
            globals()[name] = _before_option.pop(name)
        return
    _before_option.setdefault(name, globals()[name])
    globals()[name] = value


def set_timeout(seconds: float | None) -> None:
    """--timeout: each request's deadline, connect to last byte (None: this command gave none)."""
    _set_option("TIMEOUT", None if seconds is None else float(seconds))


def set_max_download(size: int | None) -> None:
    """--max-download: the most bytes any one download may carry (None: this command gave none)."""
    _set_option("DOWNLOAD_MAX_BYTES", size)


def declare_size(url: str, size: int) -> None:
    """The size an index page lists for url: a whole download of it may be no longer (index.py
    declares every file it reads, so callers that do not pass max_bytes are held to it too)."""
    if size > 0:
        with _lock:
            _declared[url] = size


def _too_large(url: str, limit: int, why: str, got: str = "") -> AnswerTooLarge:
    hint = (
        "a larger download needs a larger --max-download SIZE"
        if why == CAP_WHY
        else "the server sent more than it should; check the index or mirror"
    )
    return AnswerTooLarge(
        f"the answer from {url} is larger than {why} ({size_text(limit)})" + (f": {got}" if got else ""), hint=hint
    )


CAP_WHY = "the download limit (--max-download)"
_BYTE_COUNT = re.compile(r"[0-9]{1,30}")  # ASCII digits only (str.isdigit also takes '²', which int() refuses)


def byte_count(value: str, url: str, header: str) -> int:
    """A byte count a server states in a header; anything but one (a sign, '²', 4000 digits, more
    bytes than MAX_SIZE) is a bad answer naming the URL, never a traceback."""
    value = value.strip()
    if not _BYTE_COUNT.fullmatch(value) or int(value) > MAX_SIZE:
        raise NetworkError(
            f"{url}: the server's {header} is not a byte count in range: {value[:40]!r}",
            hint="a broken or hostile server or proxy; check the index or mirror",
        )
    return int(value)


def _cut_short(url: str, why: str) -> NetworkError:
    return NetworkError(
        f"the answer from {url} was cut short ({why})", hint="the connection broke off; run again, or check the index or mirror"
    )


class Response:
    """The parts of an HTTP answer patchctl reads (named as requests names them)."""

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        raw: http.client.HTTPResponse,
        url: str,
        key: Key,
        deadline: Deadline | None = None,
        keep: int = FETCH_POOL,
        method: str = "GET",
    ):
        self.status_code = raw.status
        self.headers = raw.headers  # case-insensitive get()
        self.url = url
        self._conn: http.client.HTTPConnection | None = conn
        self._raw, self._key, self._keep = raw, key, keep
        self.method = method
        self._content: bytes | None = None
        self._deadline = deadline
        # The most the body may hold (as sent, and decompressed): set by the request's kind.
        self.max_bytes = PAGE_MAX_BYTES
        self.limit_why = "the limit of an index page"

    def length(self) -> int | None:
        """The Content-Length, if the answer states one (a bad one is a NetworkError)."""
        value = self.headers.get("Content-Length")
        if value is None or self.headers.get("Transfer-Encoding"):  # chunked: the length is not the framing
            return None
        return byte_count(value, self.url, "Content-Length")

    def refuse_declared_excess(self) -> None:
        """An answer whose Content-Length is over the cap is refused before a byte of it is read."""
        length = self.length()
        # (a HEAD answer has no body: its Content-Length is what a GET would send)
        if length is not None and length > self.max_bytes and self.method != "HEAD":
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
            self._whole(len(data))
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
                self._whole(received)
                self._release()
                return
            received += len(chunk)
            if received > limit:
                self.close()
                raise _too_large(self.url, limit, self.limit_why)
            yield chunk

    def _io(self, read: Callable[[int], bytes], n: int) -> bytes:
        """One read of the body. Past the deadline (the watchdog shut the socket down, so the read
        failed or looks like a normal end) the request failed, whatever the read said."""
        try:
            data = read(n)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            if self._deadline is not None and self._deadline.expired:
                raise self._deadline.error() from None
            # A chunked body that breaks off (IncompleteRead), a reset connection: no whole answer.
            raise _cut_short(self.url, short(exc)) from None
        if self._deadline is not None and (self._deadline.expired or self._deadline.remaining() <= 0):
            self.close()
            raise self._deadline.error()
        return data

    def _whole(self, received: int) -> None:
        """At the end of the body: http.client's count of the Content-Length still unread is 0, or
        the connection closed early (it says nothing itself: a page cut short read as a shorter one)."""
        missing = self._raw.length
        if missing:
            self.close()
            raise _cut_short(self.url, f"{received} of the {received + missing} bytes its Content-Length states")

    def close(self) -> None:
        unwatch(self._deadline)
        if self._conn is not None:
            self._conn.close()  # the body was not read to its end: the connection cannot be reused
            self._conn = None

    def _release(self) -> None:
        unwatch(self._deadline)
        if self._conn is not None:
            if not self._raw.isclosed() and self._raw.length == 0:
                self._raw.close()  # read1() to the end leaves it open: the connection is free again
            if self._raw.will_close or not self._raw.isclosed() or (self._deadline is not None and self._deadline.expired):
                self._conn.close()
            else:
                with _lock:
                    pool = _idle.setdefault(self._key, [])
                    if len(pool) < self._keep:
                        pool.append(self._conn)
                    else:
                        self._conn.close()
            self._conn = None

    def __enter__(self) -> Response:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()  # (after a body read to its end the connection is back in the pool: nothing to close)


def _connect(key: Key) -> http.client.HTTPConnection:
    return Connection(key, TIMEOUT)


_pool_key = pool_key


def _request(
    method: str, url: str, headers: dict, deadline: Deadline, body: Body = None, retries: int = RETRIES, keep: int = FETCH_POOL
) -> Response:
    for _redirect in range(6):
        parts, key = _pool_key(url)
        proxy = key[3]
        target = (
            url.split("#", 1)[0]
            if proxy and parts.scheme == "http"
            else urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        )
        response = _send(method, key, target, {"User-Agent": "patchctl", **headers}, body, url, deadline, retries, keep)
        if response.status_code in _REDIRECTS and response.headers.get("Location"):
            response.content  # noqa: B018  (read: the connection goes back to the pool)
            url = urllib.parse.urljoin(url, response.headers["Location"])
            if _pool_key(url)[1][:3] != key[:3]:
                # A login is for the server it was meant for: a registry's blob redirected to a
                # storage host goes there without it (as requests and curl do).
                headers = {k: v for k, v in headers.items() if k.lower() not in ("authorization", "cookie")}
            if response.status_code == 303 or response.status_code in (301, 302) and method == "POST":
                method, body = "GET", None  # (as browsers and requests do; 307 and 308 send it again)
            continue
        return response
    raise NetworkError(f"{url}: too many redirects")


def _send(
    method: str, key: Key, target: str, headers: dict, body: Body, url: str, deadline: Deadline, retries: int, keep: int
) -> Response:
    attempt = 0
    while True:
        deadline.check()
        with _lock:
            pool = _idle.get(key) or []
            conn = pool.pop() if pool else None
        reused = conn is not None
        conn = conn or _connect(key)
        # Never wait longer for a connection or a read than the request has left.
        conn.timeout = max(0.001, min(deadline.timeout, deadline.remaining()))
        if conn.sock is not None:
            conn.sock.settimeout(conn.timeout)
        deadline.conn = conn
        try:
            if conn.sock is None:
                conn.connect()
            if isinstance(body, io.IOBase):
                body.seek(0)  # (sent again: the server had closed a kept-alive connection)
            # Held apart from conn: an answer that will close takes the socket from the connection.
            deadline.sock = conn.sock
            conn.request(method, target, body=body, headers=headers)
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
            if raw.status in RETRY_STATUS and attempt < retries:
                conn.close()  # (its body unread: a retry needs no bytes of an error page)
                _pause(0.5 * 2**attempt, deadline)
                attempt += 1
                continue
            return Response(conn, raw, url, key, deadline, keep, method)
        if attempt >= retries or isinstance(exc_to_raise, (TimeoutError, http.client.HTTPException)):
            raise exc_to_raise
        _pause(0.5 * 2**attempt, deadline)
        attempt += 1


def _pause(seconds: float, deadline: Deadline) -> None:
    """The back-off before a retry, never past the deadline."""
    if deadline.remaining() <= seconds:
        raise deadline.error()
    time.sleep(seconds)


def get(
    url: str,
    *,
    headers: dict | None = None,
    stream: bool = False,
    what: str = "",
    max_bytes: int | None = None,
    expected: int = 0,
) -> Response:
    """One GET under one deadline (redirects and retries included). Read whole (stream=False, an
    index page) the body may be at most max_bytes (PAGE_MAX_BYTES) sent and decompressed. Streamed:
    a range (`expected`, its length, given) at most max_bytes; a whole download at most max_bytes or
    else the size the index lists for url, never more than DOWNLOAD_MAX_BYTES (a stated size over it
    is refused before the request), and never longer than its Content-Length. Once the headers are
    in, the deadline allows for the size the answer may carry at MIN_RATE."""
    if stream:
        with _lock:
            declared = _declared.get(url)
        stated = max_bytes or declared
        why = "the size asked for" if max_bytes else "the size the index lists"
        if not expected:  # a whole download: capped, whatever the caller or the index says
            if stated and stated > DOWNLOAD_MAX_BYTES:
                who = "the index lists" if stated == declared else "it is stated as"
                raise _too_large(
                    url, DOWNLOAD_MAX_BYTES, CAP_WHY, f"{who} {stated} bytes ({size_text(stated)}); nothing was fetched"
                )
            if not stated:
                stated, why = DOWNLOAD_MAX_BYTES, CAP_WHY
        limit = stated or DOWNLOAD_MAX_BYTES
    else:
        limit = max_bytes or PAGE_MAX_BYTES
        why = "the size asked for" if max_bytes else "the limit of an index page"
    deadline = Deadline(url, what, TIMEOUT, expected)
    encoding = "identity" if stream or "Range" in (headers or {}) else "gzip"
    response = send("GET", url, deadline, headers={"Accept-Encoding": encoding, **(headers or {})})
    try:
        response.max_bytes, response.limit_why = limit, why
        if stream:
            # The allowance, fixed here once: what the answer may carry, never what it sends.
            length = response.length()
            deadline.allow(limit if length is None else min(length, limit))
        else:
            response.content  # noqa: B018
        return response
    except NetworkError as exc:
        response.close()
        if what and not exc.message.startswith(what):
            exc.message = f"{what}: {exc.message}"
            exc.args = (exc.message,)
        raise


def send(
    method: str,
    url: str,
    deadline: Deadline,
    *,
    body: Body = None,
    headers: dict | None = None,
    retries: int = RETRIES,
    keep: int = FETCH_POOL,
) -> Response:
    """One request under `deadline` (the watchdog shuts its socket down at it), redirects and
    retries (of 429/5xx, and of a refused connection: `retries` times) included; the Response once
    the answer's headers are in, its body unread. A NetworkError names what failed (the deadline's
    own when it passed). `keep`: how many idle connections to the host its pool may hold."""
    watch(deadline)
    what = deadline.what
    try:
        return _request(method, url, dict(headers or {}), deadline, body, retries, keep)
    except NetworkError as exc:
        unwatch(deadline)
        if what and not exc.message.startswith(what):
            exc.message = f"{what}: {exc.message}"
            exc.args = (exc.message,)
        raise
    except (OSError, http.client.HTTPException, EOFError, ValueError) as exc:  # ValueError: a bad port
        unwatch(deadline)
        if deadline.expired:
            raise deadline.error() from None
        raise NetworkError(f"cannot reach {what or url}: {short(exc)}") from None


def short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "…"


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
