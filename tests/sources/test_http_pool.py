"""The connection pool's plumbing: the host looked up once per process, warming that returns at once."""

import socket
import time

from patchctl.sources import connection, http


def test_a_hostname_is_resolved_once(monkeypatch):
    """Every connection to a host after the first skips DNS (a resolver that sometimes waits out its
    5 s timeout stalled the matrix)."""
    lookups = []

    def fake(host, port, *args, **kwargs):
        lookups.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(connection, "_addresses", {})
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, *a, **k: fake(host, *a, **k) if host == "index.test" else socket_getaddrinfo(host, *a, **k),
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        for _ in range(3):
            connection.create_connection(("index.test", port), 5).close()
    finally:
        listener.close()
    assert lookups == ["index.test"]


socket_getaddrinfo = socket.getaddrinfo


def test_warming_returns_before_the_connections_are_open(monkeypatch):
    opened = []

    class Slow:
        def connect(self):
            time.sleep(0.5)
            opened.append(self)

        def close(self):
            pass

    monkeypatch.setattr(http, "_connect", lambda key: Slow())
    monkeypatch.setattr(http, "_idle", {})
    start = time.monotonic()
    http.warm("http://index.test/files/x.whl", 3)
    assert time.monotonic() - start < 0.3
    deadline = time.monotonic() + 5
    while len(opened) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(opened) == 3 and len(http._idle[http._pool_key("http://index.test/files/x.whl")[1]]) == 3
