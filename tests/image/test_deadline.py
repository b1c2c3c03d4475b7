"""A registry that sends its answer a byte at a time never trips a per-read timeout; the request's
one deadline (--timeout, as patchctl's index reads have) still ends it, exit 3 saying so. The server
is a real socket server on loopback."""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from support.invoke import run_json


class Drip(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (the handler's name is the standard library's)
        if self.path.rstrip("/") == "/v2":
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        body = b'{"schemaVersion": 2}' + b" " * 1000
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for byte in body:  # one byte every 0.1 s: 100 s in all, no read waits more than 0.1 s
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def drip():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_dripping_registry_is_cut_at_the_request_deadline(drip):
    start = time.monotonic()
    doc = run_json("check", f"sglang@image:{drip}/test/slow:tag", "--timeout", "2", expect=3)
    elapsed = time.monotonic() - start
    assert "deadline of a request" in doc["error"]["message"], doc["error"]
    assert elapsed < 20, elapsed
