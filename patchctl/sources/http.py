"""HTTP with retries, range reads and friendly errors; the only module that talks to the network.

On the standard library's http.client: requests (with urllib3 and charset_normalizer) costs ~0.2 s
of CPU to import, as much as the round trips of a whole `check` on a fast link. What patchctl needs
is here: connections kept alive and pooled per host (FETCH_POOL of them, as many as `release.py` has
threads, so that a wheel's members are read over connections that already did their TCP and TLS
handshakes), the proxies of the environment ($HTTPS_PROXY, $HTTP_PROXY, $NO_PROXY, as requests and
pip honour them: CONNECT tunnels for https), redirects, gzip for index pages, and retries of
429/5xx answers and of a kept-alive connection the server had closed."""
from __future__ import annotations

import http.client
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator

from patchctl.errors import NetworkError, RangeNotSupported

TIMEOUT = 60
FETCH_POOL = 8
RETRIES = 3
RETRY_STATUS = (429, 500, 502, 503, 504)
_REDIRECTS = (301, 302, 303, 307, 308)

_idle: dict[tuple, list[http.client.HTTPConnection]] = {}
_lock = threading.Lock()
_ssl_context = None


class Response:
    """The parts of an HTTP answer patchctl reads (named as requests names them)."""

    def __init__(self, conn: http.client.HTTPConnection, raw: http.client.HTTPResponse, url: str, key: tuple):
        self.status_code = raw.status
        self.headers = raw.headers  # case-insensitive get()
        self.url = url
        self._conn, self._raw, self._key = conn, raw, key
        self._content: bytes | None = None

    @property
    def content(self) -> bytes:
        if self._content is None:
            data = self._raw.read()
            if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                import gzip

                data = gzip.decompress(data)
            self._content = data
            self._release()
        return self._content

    @property
    def text(self) -> str:
        charset = self.headers.get_content_charset() or "utf-8"
        return self.content.decode(charset, errors="replace")

    def iter_content(self, size: int) -> Iterator[bytes]:
        while True:
            chunk = self._raw.read(size)
            if not chunk:
                self._release()
                return
            yield chunk

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()  # the body was not read to its end: the connection cannot be reused
            self._conn = None

    def _release(self) -> None:
        if self._conn is not None:
            if self._raw.will_close:
                self._conn.close()
            else:
                with _lock:
                    pool = _idle.setdefault(self._key, [])
                    if len(pool) < FETCH_POOL:
                        pool.append(self._conn)
                    else:
                        self._conn.close()
            self._conn = None


def _context():
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


def _create_connection(address: tuple[str, int], timeout=None, source_address=None) -> socket.socket:
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
    conn._create_connection = _create_connection  # type: ignore[attr-defined]  (http.client's own seam)
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


def _request(method: str, url: str, headers: dict, stream: bool) -> Response:
    for _redirect in range(6):
        parts, key = _pool_key(url)
        proxy = key[3]
        target = url.split("#", 1)[0] if proxy and parts.scheme == "http" else \
            urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        send = {"User-Agent": "patchctl", "Accept-Encoding": "identity" if stream or "Range" in headers else "gzip",
                **headers}
        response = _send(method, key, target, send, url)
        if response.status_code in _REDIRECTS and response.headers.get("Location"):
            response.content  # noqa: B018  (read: the connection goes back to the pool)
            url = urllib.parse.urljoin(url, response.headers["Location"])
            if response.status_code == 303:
                method = "GET"
            continue
        if not stream:
            response.content  # noqa: B018
        return response
    raise NetworkError(f"{url}: too many redirects")


def _send(method: str, key: tuple, target: str, headers: dict, url: str) -> Response:
    attempt = 0
    while True:
        with _lock:
            pool = _idle.get(key) or []
            conn = pool.pop() if pool else None
        reused = conn is not None
        conn = conn or _connect(key)
        try:
            conn.request(method, target, headers=headers)
            raw = conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            conn.close()
            if reused:  # the server closed a kept-alive connection: again on a new one
                continue
            exc_to_raise: Exception = exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            exc_to_raise = exc
        else:
            if raw.status in RETRY_STATUS and attempt < RETRIES:
                raw.read()
                conn.close()
                time.sleep(0.5 * 2 ** attempt)
                attempt += 1
                continue
            return Response(conn, raw, url, key)
        if attempt >= RETRIES or isinstance(exc_to_raise, (TimeoutError, http.client.HTTPException)):
            raise exc_to_raise
        time.sleep(0.5 * 2 ** attempt)
        attempt += 1


def get(url: str, *, headers: dict | None = None, stream: bool = False, what: str = "") -> Response:
    try:
        return _request("GET", url, dict(headers or {}), stream)
    except (OSError, http.client.HTTPException, EOFError, ValueError) as exc:  # ValueError: a bad port
        raise NetworkError(f"cannot reach {what or url}: {_short(exc)}") from None


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "…"


def _get_partial(url: str, byte_range: str, what: str):
    """The 206 answer to a Range request; RangeNotSupported when the server sends the whole file."""
    response = get(url, headers={"Range": byte_range}, stream=True, what=what)
    if response.status_code == 200:
        response.close()
        raise RangeNotSupported(url)
    if response.status_code != 206:
        response.close()
        raise NetworkError(f"{what or url}: HTTP {response.status_code} for a range request")
    return response


def get_range(url: str, start: int, end: int, *, what: str = "") -> bytes:
    """Bytes [start, end] inclusive; RangeNotSupported when the server ignores Range."""
    response = _get_partial(url, f"bytes={start}-{end}", what)
    data = _read(response, what or url)
    if len(data) != end - start + 1:
        raise NetworkError(f"{what or url}: short range read ({len(data)} of {end - start + 1} bytes)")
    return data


def get_suffix(url: str, length: int, *, what: str = "") -> tuple[int, bytes]:
    """The last `length` bytes and the file's size (from Content-Range), in one request: for a file
    whose size the index did not publish, instead of a HEAD first."""
    response = _get_partial(url, f"bytes=-{length}", what)
    total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
    if not total.isdigit():
        response.close()
        raise NetworkError(f"{what or url}: a range answer without the file's size (Content-Range)")
    return int(total), _read(response, what or url)


def _read(response: Response, what: str) -> bytes:
    try:
        return response.content
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
