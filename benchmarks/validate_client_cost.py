"""Is the client the bottleneck? Load generators against benchmarks/paced_server.py (an asyncio server
with known timings: TTFT 300 ms, ITL 10 ms by default; its workers on cores of their own, the clients
pinned to one core), at concurrency 1, 32, 128, 256 (256 requests from c=128 on, 2 x c below): each tool's TTFT and
ITL p50 against the truth and against a minimal asyncio client in the same run, and its CPU per token.

    python benchmarks/validate_client_cost.py [--repeat 3] [--concurrency 1,32,128,256]
        [--client-cpu 0 --server-cpus 2-9] [--peer-python VENV/bin/python --bench-tree TREE]

Tools: `validate` (run_level, the load generator validate uses), `threads` (the blocking client on a
thread per slot, as run_level was before issue 37: kept here as the baseline), `minimal` (the
reference: asyncio streams, a request's bytes written by hand, `data:` lines split and json.loads'd,
nothing checked), and where they import, `aiohttp` and `httpx` streaming into validate's own SSE
parser and event checks. With --peer-python, SGLang's bench_serving too (validate_vs_peers.RUNNER).
CPU per token: the process's user + system time over the level / output tokens (bench_serving's: the
difference of two runs, N and 2N requests). Each figure is the median over --repeat rounds, the tools
interleaved within a round. "server late" is the server's own p99 of how late it wrote an event: a
truth the server did not keep would show there.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from validate_vs_peers import RUNNER, TOKENIZER, free_port  # noqa: E402

from patchctl.validate.client import CHAT, OpenAIClient  # noqa: E402
from patchctl.validate.metrics import RequestRecord, aggregate  # noqa: E402
from patchctl.validate.sse import SSEParser, parse_event  # noqa: E402
from patchctl.validate.throughput import TEMPERATURE, request_prompts, run_level  # noqa: E402

TOLERANCE = 0.05  # of the truth (issue 37: TTFT and ITL p50 within 5%)
REFERENCE_TOLERANCE = 0.02  # of the minimal client's figure in the same round
PROMPT = "Say anything."


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def summary(records: list[RequestRecord], conc: int, cpu: float) -> dict[str, Any]:
    sent = [r for r in records if r.end > r.start] or records
    lv = aggregate(conc, records, max(r.end for r in sent) - min(r.start for r in sent), True)
    tokens = lv.output_tokens or sum(r.chunk_tokens for r in records if r.ok)
    return {
        "ttft": lv.ttft_ms.p50 if lv.ttft_ms else None,
        "itl": lv.itl_ms.p50 if lv.itl_ms else None,
        "tokens": tokens,
        "cpu_us_per_token": cpu / tokens * 1e6 if tokens else None,
        "failed": lv.failed,
    }


def measure_validate(url: str, conc: int, n: int, max_tokens: int) -> dict[str, Any]:
    client = OpenAIClient(url)
    client.resolve_model()
    before = cpu_self()
    lv = run_level(client, conc, n, CHAT, PROMPT, max_tokens)
    cpu = cpu_self() - before
    tokens = lv.output_tokens or 0
    return {
        "ttft": lv.ttft_ms.p50 if lv.ttft_ms else None,
        "itl": lv.itl_ms.p50 if lv.itl_ms else None,
        "tokens": tokens,
        "cpu_us_per_token": cpu / tokens * 1e6 if tokens else None,
        "failed": lv.failed,
    }


def measure_threads(url: str, conc: int, n: int, max_tokens: int) -> dict[str, Any]:
    """run_level as it was before issue 37: a thread per slot on the blocking client (client.py), each
    opening its connection before a barrier, then taking requests from a shared counter."""
    client = OpenAIClient(url)
    client.resolve_model()
    workers = max(1, min(conc, n))
    barrier = threading.Barrier(workers)
    taken = itertools.count()
    records: list[Any] = [None] * n
    prompts = request_prompts(PROMPT, n)

    def work() -> None:
        client.connect()
        barrier.wait(timeout=60)
        while (i := next(taken)) < n:
            records[i] = client.timed_request(CHAT, prompts[i], max_tokens, stream=True, temperature=TEMPERATURE)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    before = cpu_self()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return summary(records, conc, cpu_self() - before)


async def _minimal(host: str, port: int, conc: int, n: int, max_tokens: int) -> list[RequestRecord]:
    conns = await asyncio.gather(*(asyncio.open_connection(host, port) for _ in range(min(conc, n))))
    taken = itertools.count()
    records: list[Any] = [None] * n
    prompts = request_prompts(PROMPT, n)

    async def slot(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (i := next(taken)) < n:
            body = json.dumps(
                {
                    "model": "paced",
                    "messages": [{"role": "user", "content": prompts[i]}],
                    "max_tokens": max_tokens,
                    "stream": True,
                }
            ).encode()
            start = time.perf_counter()
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await reader.readuntil(b"\r\n\r\n")
            times: list[float] = []
            buf = b""
            while not buf.endswith(b"0\r\n\r\n"):
                data = await reader.read(65536)
                now = time.perf_counter()
                buf += data
                *lines, rest = buf.split(b"\n")
                for line in lines:
                    if line.startswith(b"data: {"):
                        choices = json.loads(line[6:])["choices"]
                        if choices and choices[0]["delta"].get("content"):
                            times.append(now)
                buf = rest if not buf.endswith(b"0\r\n\r\n") else buf
            records[i] = RequestRecord(True, None, True, start, time.perf_counter(), tuple(times), None, "", "", "length")
        writer.close()

    await asyncio.gather(*(slot(r, w) for r, w in conns))
    return records


def measure_minimal(url: str, conc: int, n: int, max_tokens: int) -> dict[str, Any]:
    host, port = url.rsplit("//", 1)[1].split(":")
    before = cpu_self()
    records = asyncio.run(_minimal(host, int(port), conc, n, max_tokens))
    return summary(records, conc, cpu_self() - before)


def _feed(parser: SSEParser, piece: bytes, now: float, times: list[float]) -> None:
    for payload in parser.feed(piece):
        delta = parse_event(payload)
        if delta is not None and delta.has_output:
            times.append(now)


def _body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": "paced", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True}


async def _aiohttp(url: str, conc: int, n: int, max_tokens: int) -> tuple[list[RequestRecord], float]:
    import aiohttp

    taken = itertools.count()
    records: list[Any] = [None] * n
    prompts = request_prompts(PROMPT, n)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def warm() -> None:  # one connection per slot opened first, as validate's are
            async with session.get(f"{url}/v1/models") as resp:
                await resp.read()

        await asyncio.gather(*(warm() for _ in range(min(conc, n))))

        async def slot() -> None:
            while (i := next(taken)) < n:
                parser, times = SSEParser(), []
                start = time.perf_counter()
                async with session.post(f"{url}/v1/chat/completions", json=_body(prompts[i], max_tokens)) as resp:
                    async for piece in resp.content.iter_any():
                        _feed(parser, piece, time.perf_counter(), times)
                records[i] = RequestRecord(True, None, True, start, time.perf_counter(), tuple(times), None, "", "", "length")

        before = cpu_self()
        await asyncio.gather(*(slot() for _ in range(min(conc, n))))
        return records, cpu_self() - before


async def _httpx(url: str, conc: int, n: int, max_tokens: int) -> tuple[list[RequestRecord], float]:
    import httpx

    taken = itertools.count()
    records: list[Any] = [None] * n
    prompts = request_prompts(PROMPT, n)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:
        await asyncio.gather(*(client.get(f"{url}/v1/models") for _ in range(min(conc, n))))

        async def slot() -> None:
            while (i := next(taken)) < n:
                parser, times = SSEParser(), []
                start = time.perf_counter()
                async with client.stream("POST", f"{url}/v1/chat/completions", json=_body(prompts[i], max_tokens)) as resp:
                    async for piece in resp.aiter_raw():
                        _feed(parser, piece, time.perf_counter(), times)
                records[i] = RequestRecord(True, None, True, start, time.perf_counter(), tuple(times), None, "", "", "length")

        before = cpu_self()
        await asyncio.gather(*(slot() for _ in range(min(conc, n))))
        return records, cpu_self() - before


def measure_library(run: Any) -> Any:
    def measure(url: str, conc: int, n: int, max_tokens: int) -> dict[str, Any]:
        records, cpu = asyncio.run(run(url, conc, n, max_tokens))
        return summary(records, conc, cpu)

    return measure


def bench_once(
    python: str, tree: Path, url: str, tokenizer: Path, conc: int, n: int, max_tokens: int, out: Path, cpu: str
) -> tuple[dict[str, Any], float]:
    import json

    cmd = [
        "taskset",
        "-c",
        cpu,
        python,
        "-c",
        RUNNER,
        str(tree),
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        url,
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "8",
        "--random-output-len",
        str(max_tokens),
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(conc),
        "--request-rate",
        "inf",
        "--seed",
        "1",
        "--output-file",
        str(out),
        "--disable-tqdm",
        "--tokenizer",
        str(tokenizer),
    ]
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        "PATH": "/usr/bin:/bin",
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"bench_serving failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(json.loads(out.read_text().strip().splitlines()[-1])), used


def measure_bench(
    python: str, tree: Path, url: str, tokenizer: Path, conc: int, n: int, max_tokens: int, tmp: Path, cpu: str
) -> dict[str, Any]:
    small, cpu_small = bench_once(python, tree, url, tokenizer, conc, n, max_tokens, tmp / f"s{conc}.jsonl", cpu)
    big, cpu_big = bench_once(python, tree, url, tokenizer, conc, 2 * n, max_tokens, tmp / f"b{conc}.jsonl", cpu)
    tokens = int(big["total_output_tokens"]) - int(small["total_output_tokens"])
    return {
        "ttft": big["median_ttft_ms"],
        "itl": big["median_itl_ms"],
        "tokens": int(big["total_output_tokens"]),
        "cpu_us_per_token": (cpu_big - cpu_small) / tokens * 1e6 if tokens > 0 else None,
    }


def requests_of(conc: int, requests: int, low: int = 8) -> int:
    """A level's requests: `requests` from c=128 on (the issue's 256: two waves at 128, one at 256),
    two waves below it (at least `low`: c=1 is 0.94 s a request)."""
    return requests if conc >= 128 else max(low, 2 * conc)


def cpus(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def pinning(cores: str) -> bool:
    try:
        return subprocess.run(["taskset", "-c", cores, "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def start_server(port: int, args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    import socket

    server_cpus = ",".join(map(str, cpus(args.server_cpus)))
    # (a sandbox may have no taskset, or refuse it: then unpinned, and the table's header says so)
    pin = ["taskset", "-c", server_cpus] if pinning(server_cpus) else []
    procs = [
        subprocess.Popen(
            [*pin, sys.executable, str(REPO / "benchmarks" / "paced_server.py"), "--port", str(port)]
            + ["--ttft", str(args.ttft), "--itl", str(args.itl)],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(args.workers or len(cpus(args.server_cpus)))
    ]
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            time.sleep(0.5)  # the other workers' start-up
            return procs
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the paced server did not start")


def server_lateness(url: str, probes: int) -> tuple[int, float]:
    """(workers seen, the worst worker's p99 of event lateness in ms) over the whole run."""
    import urllib.request

    seen: dict[int, float] = {}
    for _ in range(probes):
        with urllib.request.urlopen(f"{url}/stats", timeout=10) as resp:  # a fresh connection: any worker
            stats = json.loads(resp.read())
        seen[stats["pid"]] = stats["p99"]
    return len(seen), max(seen.values(), default=0.0)


TOOLS = {
    "minimal": measure_minimal,
    "validate": measure_validate,
    "threads": measure_threads,
    "aiohttp": measure_library(_aiohttp),
    "httpx": measure_library(_httpx),
}


def main() -> None:
    import datetime

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-python", help="python that runs SGLang's bench_serving (omit: without it)")
    p.add_argument("--bench-tree", type=Path)
    p.add_argument("--ttft", type=float, default=0.3)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,32,128,256")
    p.add_argument("--requests", type=int, default=256, help="requests of a level from c=128 on (below: 2 x c, at least 8)")
    p.add_argument("--at-least", type=int, default=8, help="requests of a level below c=128, at least")
    p.add_argument("--repeat", type=int, default=3, help="rounds; each figure is the median over them")
    p.add_argument("--tools", default=",".join(TOOLS), help="of: " + ", ".join(TOOLS) + " (those that import)")
    p.add_argument("--client-cpu", default="0", help="the core the clients are pinned to")
    p.add_argument("--server-cpus", default="1", help="the cores of the server's workers (e.g. 2-9)")
    p.add_argument("--workers", type=int, default=0, help="server processes (default: one per server core)")
    p.add_argument("--json", type=Path, help="also write the medians here (tests/validate/test_client_not_bottleneck.py)")
    args = p.parse_args()
    try:
        os.sched_setaffinity(0, {int(args.client_cpu)})
        pinned = f"clients on core {args.client_cpu}"
    except OSError as exc:
        pinned = f"clients not pinned ({exc})"
    tools = [t for t in args.tools.split(",") if t not in ("aiohttp", "httpx") or importlib.util.find_spec(t)]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    truth_ttft, truth_itl = args.ttft * 1000, args.itl * 1000
    levels = [int(c) for c in args.concurrency.split(",")]
    got: dict[tuple[int, str], list[dict[str, Any]]] = {}
    procs = start_server(port, args)
    try:
        for tool in tools:
            TOOLS[tool](url, 4, 8, 8)  # warm-up: imports, the first connections
        with tempfile.TemporaryDirectory() as tmp_s:
            tmp = Path(tmp_s)
            tokenizer = tmp / "tok"
            if args.peer_python:
                subprocess.run([args.peer_python, "-c", TOKENIZER, str(tokenizer)], check=True, capture_output=True)
                tools.append("bench_serving")
            for _ in range(args.repeat):
                for conc in levels:
                    n = requests_of(conc, args.requests, args.at_least)
                    for tool in tools:
                        if tool == "bench_serving":
                            m = measure_bench(
                                args.peer_python, args.bench_tree, url, tokenizer, conc, n, args.max_tokens, tmp, args.client_cpu
                            )
                        else:
                            m = TOOLS[tool](url, conc, n, args.max_tokens)
                        got.setdefault((conc, tool), []).append(m)
        workers, late = server_lateness(url, 8 * len(procs))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)

    unpinned = "" if pinning(args.server_cpus) else " (not pinned)"

    def med(conc: int, tool: str, key: str) -> float | None:
        values = [m[key] for m in got[(conc, tool)] if m[key] is not None]
        return statistics.median(values) if values else None

    if args.json:
        keys = ("ttft", "itl", "cpu_us_per_token")
        table = {
            str(conc): {
                tool: {**{k: med(conc, tool, k) for k in keys}, "failed": sum(m.get("failed") or 0 for m in got[(conc, tool)])}
                for tool in tools
            }
            for conc in levels
        }
        args.json.write_text(
            json.dumps({"truth": {"ttft": truth_ttft, "itl": truth_itl}, "server_late_p99_ms": late, "levels": table})
        )
    print(
        f"{datetime.date.today()}; truth: TTFT {truth_ttft:.1f} ms, ITL {truth_itl:.1f} ms, {args.max_tokens} tokens, "
        f"{args.requests} requests from c=128 on, 2 x c (at least {args.at_least}) below; "
        f"{os.cpu_count()} cores, {pinned}, server: "
        f"{len(procs)} asyncio workers on cores {args.server_cpus}{unpinned} ({workers} answered /stats), server late p99 "
        f"{late:.2f} ms; medians of {args.repeat} rounds"
    )
    print("| c | tool | TTFT p50 ms | vs truth | vs minimal | ITL p50 ms | vs truth | vs minimal | CPU µs / token | failed |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    pct = lambda v, ref: "-" if v is None or not ref else f"{(v - ref) / ref * 100:+.1f}%"  # noqa: E731
    for conc in levels:
        ref_ttft, ref_itl = med(conc, "minimal", "ttft"), med(conc, "minimal", "itl")
        for tool in tools:
            ttft, itl = med(conc, tool, "ttft"), med(conc, tool, "itl")
            failed = sum(m.get("failed") or 0 for m in got[(conc, tool)])
            print(
                f"| {conc} | {tool} | {fmt(ttft)} | {pct(ttft, truth_ttft)} | {pct(ttft, ref_ttft)} | {fmt(itl)} | "
                f"{pct(itl, truth_itl)} | {pct(itl, ref_itl)} | {fmt(med(conc, tool, 'cpu_us_per_token'))} | {failed} |"
            )


if __name__ == "__main__":
    main()
