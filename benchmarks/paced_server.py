"""An OpenAI-compatible chat server with known timings, on asyncio: the truth a load generator is
held to (benchmarks/validate_client_cost.py, tests/validate/test_client_not_bottleneck.py).

Every streamed request gets its response head at once, then the role chunk and the first token
together TTFT seconds after its request arrived, then one token every ITL seconds, each at its due
time from the request's arrival (absolute, never a sleep after the previous write, so that a late
wake-up is not carried on), then a finish chunk, a usage chunk and [DONE], chunked, on a kept-alive
connection. Engines' servers send like this (vLLM and SGLang send the role chunk at the first token).

The threaded test server (checklib.testserver) cannot be the truth at concurrency 128-256: 25,600
events a second from 256 threads under one GIL come late. Here one process is an asyncio loop, and
N of them can serve one port (SO_REUSEPORT: the kernel spreads connections over them).
Each worker keeps how late it wrote its events (GET /stats: p50/p99/max ms since the last
POST /stats/reset; its own connection's worker only: the benchmark opens one per worker), so a
run can show that the server, not the client, kept time.

    python benchmarks/paced_server.py --port 8000 --ttft 0.3 --itl 0.01   (once per worker)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time

MODEL = "paced"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


class Paced:
    def __init__(self, ttft: float, itl: float) -> None:
        self.ttft, self.itl = ttft, itl
        self.late: list[float] = []  # seconds each event was written after its due time

    def event(self, obj: object) -> bytes:
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                arrived = time.perf_counter()
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if method == "GET" and path == "/v1/models":
                    self.reply(writer, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                elif method == "GET" and path == "/stats":
                    ms = [x * 1000 for x in self.late]
                    stats = {"events": len(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": max(ms, default=0)}
                    self.reply(writer, {"pid": os.getpid(), **stats})
                elif method == "POST" and path == "/stats/reset":
                    self.late.clear()
                    self.reply(writer, {"pid": os.getpid()})
                elif method == "POST" and path == "/v1/chat/completions":
                    await self.stream(writer, json.loads(body), arrived)
                else:
                    self.reply(writer, {"error": "not found"}, 404)
        finally:
            writer.close()

    def reply(self, writer: asyncio.StreamWriter, obj: object, status: int = 200) -> None:
        data = json.dumps(obj).encode()
        writer.write(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(data), data)
        )

    async def stream(self, writer: asyncio.StreamWriter, body: dict, arrived: float) -> None:
        n = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = {"id": "x", "object": "chat.completion.chunk", "model": MODEL}
        role = self.event({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(n):
            due = arrived + self.ttft + i * self.itl
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            self.late.append(time.perf_counter() - due)
            token = self.event({**chunk, "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "finish_reason": None}]})
            writer.write(role + token if i == 0 else token)
            if writer.transport.get_write_buffer_size() > 1 << 20:
                await writer.drain()
        usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": n + 8}
        writer.write(
            self.event({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
            + self.event({**chunk, "choices": [], "usage": usage})
            + self.event(b"[DONE]")
            + b"0\r\n\r\n"
        )
        await writer.drain()


async def serve(port: int, ttft: float, itl: float) -> None:
    paced = Paced(ttft, itl)
    server = await asyncio.start_server(paced.handle, "127.0.0.1", port, reuse_port=True, backlog=4096)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ttft", type=float, default=0.3, help="seconds from a request's arrival to its first token")
    p.add_argument("--itl", type=float, default=0.01, help="seconds between tokens")
    args = p.parse_args(argv)
    try:
        asyncio.run(serve(args.port, args.ttft, args.itl))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
