"""Which HTTP client patchctl should talk through: import cost and streaming behaviour, measured.

    python benchmarks/http_clients.py [-n 7] [--mib 128] [--httpx-path DIR]

Clients: `floor` (a raw socket GET: the least any client can cost), `today` (patchctl.sources.http,
the baseline), `urllib3` alone, `requests`, `httpx` (if importable; --httpx-path adds a folder that
holds it, e.g. one made with `pip install --target DIR httpx`, so the measuring venv stays as it is).

Columns, each measured in a fresh child process against a loopback server started here:
  import ms   `python -X importtime -c "import X"`: the module's cumulative time, median of -n runs
              (today's client imports ssl on its first https request; the others at import)
  stream      MiB/s and the child's peak RSS (MiB) reading a --mib body in 64 KiB pieces
  range       a `Range: bytes=100-199` read: 100 bytes with 206 (ok), else what came
  conns       TCP connections the server saw for 20 GETs in a row (1 = kept alive and reused)
  drip s      a 40-byte answer sent a byte every 0.1 s (4 s in all) with a 1 s timeout: when the
              client gave up (1 s: a wall deadline; ~4 s: only a per-read timeout, which a drip resets)
  sse lag ms  20 SSE events 50 ms apart over a chunked body: the mean delay from the server's write
              to the client having the line (what validate times as token arrival)
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ("floor", "today", "urllib3", "requests", "httpx")
IMPORT = {"floor": "socket", "today": "patchctl.sources.http", "urllib3": "urllib3", "requests": "requests", "httpx": "httpx"}
BLOCK = b"x" * (1 << 20)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    big = 128 << 20

    def setup(self) -> None:
        super().setup()
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.connections += 1  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        if self.path == "/big":
            self._head(200, self.big)
            for _ in range(self.big >> 20):
                self.wfile.write(BLOCK)
        elif self.path == "/file":
            data = bytes(range(256)) * 16
            wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if wanted:
                a, b = int(wanted[1]), int(wanted[2])
                self._head(206, b - a + 1, {"Content-Range": f"bytes {a}-{b}/{len(data)}"})
                self.wfile.write(data[a : b + 1])
            else:
                self._head(200, len(data))
                self.wfile.write(data)
        elif self.path == "/small":
            self._head(200, 2)
            self.wfile.write(b"ok")
        elif self.path == "/drip":
            self._head(200, 40)
            try:
                for _ in range(40):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass
        elif self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(20):
                line = f"data: {time.time():.6f}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")

    def _head(self, status: int, length: int, extra: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    connections = 0
    lock = threading.Lock()


# -- the child: one client, one case ------------------------------------------------------------


def raw_get(port: int, path: str, sock: socket.socket | None = None) -> tuple[socket.socket, bytes, bytes]:
    """The floor: one GET on a plain socket, the head and the start of the body."""
    sock = sock or socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, rest = buf.partition(b"\r\n\r\n")
    return sock, head, rest


def child(client: str, case: str, port: int) -> dict:
    base = f"http://127.0.0.1:{port}"
    if client == "today":
        from patchctl.sources import http as today

        today.set_timeout(1.0 if case == "drip" else 60.0)
    elif client == "urllib3":
        import urllib3

        pool = urllib3.PoolManager()
    elif client == "requests":
        import requests

        session = requests.Session()
    elif client == "httpx":
        import httpx

        hx = httpx.Client(timeout=1.0 if case == "drip" else 60.0)

    held: list = []

    def body_pieces(path: str, timeout: float = 60.0):
        """(the status, an iterator over the body in pieces as they arrive)."""
        if client == "floor":
            sock, head, rest = raw_get(port, path)
            sock.settimeout(timeout)
            end = time.monotonic() + timeout  # the floor's own wall deadline: a few lines

            length = re.search(rb"(?i)content-length: *(\d+)", head)
            left = [int(length[1]) if length else -1]
            last = [rest]  # a chunked body ends with its zero-length chunk

            def pieces():
                if rest:
                    left[0] -= len(rest)
                    yield rest
                while left[0] != 0 and not (left[0] < 0 and last[0].endswith(b"0\r\n\r\n")):
                    if time.monotonic() >= end:
                        raise TimeoutError("deadline")
                    sock.settimeout(max(0.001, end - time.monotonic()))
                    data = sock.recv(65536)
                    if not data:
                        return
                    left[0] -= len(data)
                    last[0] = data
                    yield data

            return int(head.split()[1]), pieces()
        if client == "today":
            r = today.get(base + path, stream=True)
            return r.status_code, r.iter_content(65536)
        if client == "urllib3":
            r = pool.request("GET", base + path, preload_content=False, timeout=urllib3.Timeout(connect=timeout, read=timeout))
            return r.status, r.stream(65536)
        if client == "requests":
            r = session.get(base + path, stream=True, timeout=timeout)
            return r.status_code, r.iter_content(65536)
        cm = hx.stream("GET", base + path)
        held.append(cm)  # the stream closes when its context manager is collected
        r = cm.__enter__()
        return r.status_code, r.iter_raw()  # (a chunk_size makes httpx hold pieces until it has that many bytes)

    if case == "stream":
        start = time.perf_counter()
        total = sum(len(p) for p in body_pieces("/big")[1])
        seconds = time.perf_counter() - start
        import resource

        return {"mib_s": total / (1 << 20) / seconds, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if case == "range":
        headers = {"Range": "bytes=100-199"}
        if client == "floor":
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /file HTTP/1.1\r\nHost: x\r\nRange: bytes=100-199\r\n\r\n")
            data = b""
            while len(data.partition(b"\r\n\r\n")[2]) < 100:
                data += sock.recv(65536)
            head, _, got = data.partition(b"\r\n\r\n")
            status = int(head.split()[1])
        elif client == "today":
            from patchctl.sources import ranges

            got, status = ranges.get_range(base + "/file", 100, 199), 206
        elif client == "urllib3":
            r = pool.request("GET", base + "/file", headers=headers)
            got, status = r.data, r.status
        elif client == "requests":
            r = session.get(base + "/file", headers=headers)
            got, status = r.content, r.status_code
        else:
            r = hx.get(base + "/file", headers=headers)
            got, status = r.content, r.status_code
        return {"ok": status == 206 and got == (bytes(range(256)) * 16)[100:200], "status": status}
    if case == "conns":
        sock = None
        for _ in range(20):
            if client == "floor":
                sock, _head, rest = raw_get(port, "/small", sock)
                while len(rest) < 2:
                    rest += sock.recv(10)
            else:
                for _piece in body_pieces("/small")[1]:
                    pass
        return {}
    if case == "drip":
        start = time.monotonic()
        try:
            for _piece in body_pieces("/drip", 1.0)[1]:
                pass
            how = "read it all"
        except Exception as exc:  # noqa: BLE001 (each library names its timeout its own way)
            how = type(exc).__name__
        return {"seconds": time.monotonic() - start, "how": how}
    if case == "sse":
        lags: list[float] = []
        buf = b""
        for piece in body_pieces("/sse")[1]:
            now = time.time()
            buf += piece
            while b"\n\n" in buf:
                event, _, buf = buf.partition(b"\n\n")
                found = re.search(rb"data: ([0-9.]+)", event)  # (the floor sees the chunks' framing too)
                if found:
                    lags.append(now - float(found[1]))
        return {"lag_ms": 1000 * statistics.mean(lags), "events": len(lags)}
    raise SystemExit(f"unknown case {case}")


# -- the parent ---------------------------------------------------------------------------------


def env_with(extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), extra, env.get("PYTHONPATH", "")) if p)
    return env


def import_ms(module: str, runs: int, env: dict) -> float | None:
    times = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, env=env
        )
        if proc.returncode != 0:
            return None
        for line in proc.stderr.splitlines():
            parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
            if len(parts) == 3 and parts[2] == module:
                times.append(int(parts[1]) / 1000)
    return statistics.median(times) if times else None


def run_child(client: str, case: str, port: int, env: dict) -> dict | None:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", client, case, str(port)], capture_output=True, text=True, env=env, timeout=300
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1][:60] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=7)
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--httpx-path", default="")
    parser.add_argument("--child", nargs=3)
    args = parser.parse_args()
    if args.child:
        client, case, port = args.child
        Handler.big = args.mib << 20
        print(json.dumps(child(client, case, int(port))))
        return
    Handler.big = args.mib << 20
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    env = env_with(args.httpx_path)
    rows = []
    for client in CLIENTS:
        ms = import_ms(IMPORT[client], args.n, env)
        if ms is None:
            rows.append([client, "not installed"])
            continue
        stream = run_child(client, "stream", port, env) or {}
        rng = run_child(client, "range", port, env) or {}
        with server.lock:
            server.connections = 0
        conns = run_child(client, "conns", port, env)
        with server.lock:
            opened = server.connections if conns is not None and "error" not in conns else "-"
        drip = run_child(client, "drip", port, env) or {}
        sse = run_child(client, "sse", port, env) or {}
        rows.append(
            [
                client,
                f"{ms:.1f}",
                f"{stream['mib_s']:.0f}" if "mib_s" in stream else stream.get("error", "-"),
                f"{stream['rss_mib']:.0f}" if "rss_mib" in stream else "-",
                "ok" if rng.get("ok") else str(rng.get("status", rng.get("error", "-"))),
                str(opened),
                f"{drip['seconds']:.1f} ({drip['how']})" if "seconds" in drip else drip.get("error", "-"),
                f"{sse['lag_ms']:.1f}" if "lag_ms" in sse else sse.get("error", "-"),
            ]
        )
    server.shutdown()
    head = ["client", "import ms", "stream MiB/s", "peak RSS MiB", "range", "conns/20", "drip s (1 s timeout)", "sse lag ms"]
    widths = [max(len(str(r[i])) if i < len(r) else 0 for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))
    print(f"(median import of {args.n} runs; a {args.mib} MiB body; python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
