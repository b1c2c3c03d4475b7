"""One deadline per registry request, connect to last byte, as patchctl's index reads have
(sources/http.py, README "Limits"): python-dxf hands requests only a per-read timeout, which a
registry sending a byte now and then extends for ever. The requests session dxf is given notes each
connection its pools hand out while a request of this thread is being watched; at the deadline a
timer shuts those sockets down, so a blocked read returns at once and the request fails. A larger
answer's deadline grows with its size at http.MIN_RATE, as a download's does."""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import requests

_current = threading.local()
_RESHUT = 0.5  # seconds: after the deadline, sockets still connecting are shut as they appear


class Watch:
    """The connections one request used, and whether its deadline passed."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._conns: list[Any] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def add(self, conn: Any) -> None:
        with self._lock:
            self._conns.append(conn)

    def run(self) -> None:
        """The timer thread: waits out the deadline, then shuts every noted socket until the
        request ends (a connection still connecting at the deadline gets its socket later)."""
        if self._done.wait(self.seconds):
            return
        self.expired = True
        while True:
            with self._lock:
                for conn in self._conns:
                    sock = getattr(conn, "sock", None)
                    if sock is not None:
                        try:  # the plain socket's shutdown, also under TLS: a blocked recv() returns
                            socket.socket.shutdown(sock, socket.SHUT_RDWR)
                        except OSError:
                            pass
            if self._done.wait(_RESHUT):
                return

    def close(self) -> None:
        self._done.set()


@contextmanager
def watched(seconds: float) -> Iterator[Watch]:
    """Every request this thread makes inside the block shares one deadline, seconds from now."""
    watch = Watch(seconds)
    timer = threading.Thread(target=watch.run, name="registry-deadline", daemon=True)
    previous = getattr(_current, "watch", None)
    _current.watch = watch
    timer.start()
    try:
        yield watch
    finally:
        _current.watch = previous
        watch.close()


def session() -> requests.Session:
    """A requests session whose connection pools (direct and through a proxy) note the connections
    they hand out to the watched request of the calling thread."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class Pool(HTTPConnectionPool):
        def _get_conn(self, timeout: float | None = None) -> Any:
            return _noted(super()._get_conn(timeout))

    class TLSPool(HTTPSConnectionPool):
        def _get_conn(self, timeout: float | None = None) -> Any:
            return _noted(super()._get_conn(timeout))

    pools = {"http": Pool, "https": TLSPool}

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = dict(pools)

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            manager = super().proxy_manager_for(proxy, **kwargs)
            manager.pool_classes_by_scheme = dict(pools)
            return manager

    s = requests.Session()
    adapter = Adapter()
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s


def _noted(conn: Any) -> Any:
    watch = getattr(_current, "watch", None)
    if watch is not None:
        watch.add(conn)
    return conn
