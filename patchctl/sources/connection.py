"""How http.py's connections reach a server: the host looked up once per process, the environment's
proxy (a CONNECT tunnel for https), TLS against requests' and pip's trust store. http.client frames
the requests and answers; opening the socket is done here, in `Connection.connect`, the method
http.client has its subclasses override (HTTPSConnection does), so no private part of it is
replaced, and the socket is known from its first moment: a request's deadline (deadline.py) can
shut it down while a proxy or a TLS handshake is still dripping."""

from __future__ import annotations

import http.client
import os
import socket
import threading
import urllib.parse
from typing import TYPE_CHECKING

from patchctl.core.errors import NetworkError

if TYPE_CHECKING:
    import ssl

# (scheme, host, port, proxy URL or None): what a connection is for, and the pool it goes back to.
Key = tuple[str, str, int, "str | None"]

_lock = threading.Lock()
_addresses: dict[tuple[str, int], list[tuple]] = {}
_ssl_context: ssl.SSLContext | None = None
_TUNNEL_HEAD_MAX = 64 << 10  # a proxy's answer to CONNECT: its status line and headers, at most


def create_connection(address: tuple[str, int], timeout: float | None = None) -> socket.socket:
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
            return socket.create_connection(sockaddr[:2], timeout)
        except OSError as exc:
            error = exc
    raise error or OSError(f"{host} resolves to no address")


def context() -> ssl.SSLContext:
    """The trust store pip uses for the index: its `cert` ($PIP_CERT or its configuration), else
    $REQUESTS_CA_BUNDLE or $CURL_CA_BUNDLE (as requests reads them), else certifi's."""
    global _ssl_context
    if _ssl_context is None:
        import ssl

        from patchctl.sources.pip_config import network_setting

        cafile = network_setting("cert") or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
        if not cafile:
            try:
                import certifi

                cafile = certifi.where()
            except ImportError:
                cafile = None
        _ssl_context = ssl.create_default_context(cafile=cafile)
    return _ssl_context


def proxy_for(scheme: str, host: str) -> str | None:
    """The proxy for scheme: pip's `proxy` ($PIP_PROXY or its configuration: every scheme, as pip
    uses it), else the one the environment names ($HTTPS_PROXY, $HTTP_PROXY); None for none or a
    host $NO_PROXY bypasses."""
    from patchctl.sources.pip_config import network_setting

    pip_proxy = network_setting("proxy")
    if pip_proxy is None and not any(k.lower().endswith("_proxy") for k in os.environ):
        return None  # (urllib.request, which reads them as requests does, is itself ~30 ms to import)
    import urllib.request

    if urllib.request.proxy_bypass(host):
        return None
    if pip_proxy is not None:
        return pip_proxy if "://" in pip_proxy else f"http://{pip_proxy}"
    return urllib.request.getproxies().get(scheme)


def pool_key(url: str) -> tuple[urllib.parse.SplitResult, Key]:
    """The URL's parts and the pool its connections live in: (scheme, host, port, proxy)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NetworkError(f"cannot fetch {url}: not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts, (parts.scheme, parts.hostname, port, proxy_for(parts.scheme, parts.hostname))


class Connection(http.client.HTTPConnection):
    """One kept-alive connection for a pool key. Plain http through a proxy talks to the proxy (the
    request line then carries the absolute URL); https through one tunnels to the host."""

    def __init__(self, key: Key, timeout: float):
        scheme, host, port, proxy = key
        self.key = key
        if proxy and scheme == "http":
            p = urllib.parse.urlsplit(proxy)
            super().__init__(p.hostname or "", p.port or 80, timeout=timeout)
        else:
            super().__init__(host, port, timeout=timeout)
        if scheme == "https":
            self.default_port = 443  # the Host header leaves the port out for 443, as for 80 on http

    def connect(self) -> None:
        scheme, host, port, proxy = self.key
        if proxy:
            p = urllib.parse.urlsplit(proxy)
            address = (p.hostname or "", p.port or 80)
        else:
            address = (host, port)
        sock = create_connection(address, self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock  # from here on a deadline can shut it down
        if scheme != "https":
            return
        if proxy:
            _tunnel(sock, host, port)
        self.sock = context().wrap_socket(sock, server_hostname=host)


def _tunnel(sock: socket.socket, host: str, port: int) -> None:
    """CONNECT host:port through the proxy sock is connected to; its answer read a byte at a time, so
    that nothing of the TLS that follows is taken with it."""
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode("ascii"))
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise OSError(f"the proxy closed the connection answering CONNECT {host}:{port}")
        head += byte
        if len(head) > _TUNNEL_HEAD_MAX:
            raise OSError(f"the proxy's answer to CONNECT {host}:{port} is over {_TUNNEL_HEAD_MAX} bytes")
    status = head.split(b"\r\n", 1)[0].split(None, 2)
    if len(status) < 2 or status[1] != b"200":
        line = head.split(b"\r\n", 1)[0].decode("latin-1")[:100]
        raise OSError(f"the proxy refused CONNECT {host}:{port}: {line}")
