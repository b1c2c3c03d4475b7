"""One deadline per HTTP request (sources/http.py): connect to last byte, redirects and retries
included, that a server dripping a byte at a time cannot extend. Its allowance is fixed: the
--timeout, plus, once the answer's headers say how much it may carry, that size at MIN_RATE (the
Content-Length, or the size the caller or the index states, all capped by the download cap). Bytes
received never move it (a drip of 10^12 bytes with no Content-Length once ran for as long as it
dripped). A watchdog thread shuts the request's socket down at the deadline, so a read blocked on a
slow server returns at once; every read checks `expired` after it."""

from __future__ import annotations

import http.client
import socket
import threading
import time

from patchctl.core.errors import NetworkError

MIN_RATE = 256 << 10  # bytes/s: a larger answer's allowance grows by its size at this rate (2 Mbit/s)


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


class Deadline:
    """When one request must be done: `timeout` seconds after it began, plus `expected` bytes at
    MIN_RATE. `expected` is the caller's (a range's length) until `allow` fixes it from the answer's
    headers, once; nothing received changes it."""

    def __init__(self, url: str, what: str, timeout: float, expected: int = 0):
        self.url, self.what = url, what
        self.start = time.monotonic()
        self.timeout = timeout
        self.expected = expected
        self.expired = False
        self.conn: http.client.HTTPConnection | None = None  # the connection, from before it connects
        self.sock: socket.socket | None = None  # its socket, still shut when an answer took it from conn

    def allow(self, size: int) -> None:
        """The answer may carry `size` bytes (already capped by the caller): its allowance, once."""
        self.expected = max(self.expected, size)  # (later, never sooner: the watchdog's wait stays right)

    def at(self) -> float:
        return self.start + self.timeout + self.expected / MIN_RATE

    def remaining(self) -> float:
        return self.at() - time.monotonic()

    def expire(self) -> None:
        self.expired = True
        for sock in (self.sock, getattr(self.conn, "sock", None)):
            if sock is not None:
                try:  # the plain socket's shutdown, also under TLS: a blocked recv() returns at once
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass

    def check(self) -> None:
        if self.expired or self.remaining() <= 0:
            raise self.error()

    def error(self) -> NetworkError:
        grown = self.expected
        budget = f"{self.timeout:g} s" + (f" + {size_text(grown)} at {size_text(MIN_RATE)}/s" if grown else "")
        return NetworkError(
            f"{self.what or self.url}: no complete answer from {self.url} within {budget} (the deadline of a request)",
            hint="a slow or stalled server; pass a larger --timeout SECONDS on a slow link",
        )


_watched: set[Deadline] = set()
_watch_cond = threading.Condition()
_watcher: threading.Thread | None = None


def watch(deadline: Deadline) -> None:
    global _watcher
    with _watch_cond:
        _watched.add(deadline)
        if _watcher is None:
            _watcher = threading.Thread(target=_watchdog, name="http-deadline", daemon=True)
            _watcher.start()
        _watch_cond.notify()


def unwatch(deadline: Deadline | None) -> None:
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
