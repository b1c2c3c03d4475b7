"""Cold `patchctl check` through a throttled link, against the naive path, in one run.

    python benchmarks/throttled_check.py                      10, 50, 200 MB/s; 20 ms RTT; 5 rounds
    python benchmarks/throttled_check.py --speeds 50 --rounds 1 --engines vllm@0.23.0

A proxy on 127.0.0.1 (a separate process) carries every request of both paths: HTTPS through CONNECT
tunnels, which is what requests does with $HTTPS_PROXY / $HTTP_PROXY. It holds the bytes of each
direction to one shared link of the given rate (a FIFO bottleneck, as a real access link) and delays
each direction by half the RTT; a tunnel's set-up costs one RTT more (the TCP handshake to the
server). The index is the one pip is configured with, as patchctl reads it.

Both paths run as fresh processes with a fresh cache, so both pay an interpreter's start, with their
modules' bytecode as an installed tool has it (pip compiles it at install; here a PYTHONPYCACHEPREFIX
under the run's temporary folder, even where PYTHONDONTWRITEBYTECODE is set, as on this machine);
a first round of both paths fills it (and the index's own caches) and is not counted:
- check: `python -m patchctl.cli.main check ENGINE@VERSION --json`;
- naive: a Python script with requests: the index page, the release's smallest artifact whole (the
  sdist; a wheel where there is none, as for SGLang >= 0.5.11), its sha256, extracted, then
  `git apply --check` of each patch's variant for that version (chosen before, not timed).

Targets (issue 17): vLLM and SGLang <= 0.25x the naive time at 50 MB/s and <= 0.15x at 10 MB/s;
every engine <= 1x at every speed. Medians of --rounds rounds; each round runs every cell once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_ENGINES = ("vllm@0.23.0", "sglang@0.5.23", "vllm-gguf-plugin@0.0.5")


# ---------------------------------------------------------------------------------------------
# the throttling proxy (runs in its own process: `--proxy PORTFILE RATE RTT`)


class Link:
    """One direction of a bottleneck link: bytes leave in arrival order at `rate` bytes/s."""

    def __init__(self, rate: float):
        self.rate = rate
        self.free_at = 0.0

    def reserve(self, n: int, now: float) -> float:
        """When the last of n bytes arriving now has crossed the link."""
        self.free_at = max(self.free_at, now) + n / self.rate
        return self.free_at


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link, delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def read() -> None:
        while True:
            data = await reader.read(1 << 16)
            now = loop.time()
            queue.put_nowait((link.reserve(len(data), now) + delay if data else now + delay, data))
            if not data:
                return

    async def send() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass

    try:
        await asyncio.gather(read(), send())
    except (ConnectionError, OSError):
        pass


async def _serve(port_file: str, rate: float, rtt: float) -> None:
    down, up = Link(rate), Link(rate)
    delay = rtt / 2

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
            if method != "CONNECT":  # requests tunnels every https:// URL; plain http is not proxied here
                writer.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                writer.close()
                return
            host, _, port = target.rpartition(":")
            server_reader, server_writer = await asyncio.open_connection(host, int(port))
            await asyncio.sleep(rtt)  # the client's TCP handshake with the server
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await asyncio.gather(_pump(reader, server_writer, up, delay), _pump(server_reader, writer, down, delay))
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
    async with server:
        await server.serve_forever()


class Proxy:
    def __init__(self, mb_per_s: float, rtt_ms: float, work: Path):
        self.port_file = work / f"proxy-{mb_per_s}.port"
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--proxy", str(self.port_file), str(mb_per_s * 1e6), str(rtt_ms / 1000)]
        )
        for _ in range(200):
            if self.port_file.is_file() and self.port_file.read_text():
                break
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port_file.read_text()}"

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()


# ---------------------------------------------------------------------------------------------
# the two paths

NAIVE = r"""
import hashlib, json, subprocess, sys, tarfile, zipfile
from pathlib import Path
import requests
index, dist, version, work, layout, package, variants = sys.argv[1:8]
work = Path(work)
page = requests.get(f"{index}/{dist}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}).json()
mine = [f for f in page["files"] if f"-{version}." in f["filename"] or f"-{version}-" in f["filename"]]
artifact = min(mine, key=lambda f: (not f["filename"].endswith(".tar.gz"), f["size"]))
target = work / artifact["filename"]
digest = hashlib.sha256()
with requests.get(artifact["url"], stream=True) as r, open(target, "wb") as out:
    for chunk in r.iter_content(1 << 20):
        out.write(chunk)
        digest.update(chunk)
assert digest.hexdigest() == artifact["hashes"]["sha256"]
src = work / "src"
if target.name.endswith(".whl"):
    with zipfile.ZipFile(target) as zf:
        zf.extractall(src)
    root = src
else:
    with tarfile.open(target) as tf:
        tf.extractall(src, filter="data")
    (root,) = list(src.iterdir())
    if layout and (root / layout / package).is_dir():
        root = root / layout
out = []
for v in json.loads(variants):
    if v is None:
        out.append("obsolete")
        continue
    proc = subprocess.run(["git", "apply", "--check", v], cwd=root, capture_output=True)
    out.append("applies" if proc.returncode == 0 else "fails")
print(json.dumps({"artifact": artifact["filename"], "bytes": artifact["size"], "outcomes": out}))
"""


def variants_for(spec: str) -> tuple[str, str, list[str | None]]:
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.store.layered import Store
    from patchctl.store.series import choose_variant

    name, _, version = spec.partition("@")
    engine = get_engine(name)
    paths = []
    for patch in Store.open().series(name).patches:
        choice = choose_variant(patch, Version(version))
        paths.append(str(choice.variant.path) if choice.variant else None)
    return engine.dist, engine.layout_prefix("git").rstrip("/"), paths


def run_naive(spec: str, index: str, proxy: str, work: Path) -> tuple[float, dict]:
    from patchctl.core.engines import get_engine

    dist, layout, paths = variants_for(spec)
    version = spec.partition("@")[2]
    package = get_engine(spec.partition("@")[0]).packages[0]
    work.mkdir(parents=True)
    env = _child_env(proxy)
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-c", NAIVE, index, dist, version, str(work), layout, package, json.dumps(paths)],
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    CPU.setdefault(f"naive {spec}", []).append(_children_cpu() - cpu)
    if proc.returncode != 0:
        raise SystemExit(f"naive path failed for {spec}: {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout)


def run_check(spec: str, proxy: str, cache: Path) -> tuple[float, dict]:
    env = dict(_child_env(proxy), PATCHCTL_CACHE_DIR=str(cache))
    env.pop("PATCHCTL_INDEX_MAX_AGE", None)
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(
        [sys.executable, "-m", "patchctl.cli.main", "check", spec, "--json"], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    CPU.setdefault(f"check {spec}", []).append(_children_cpu() - cpu)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"check failed for {spec}: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    return seconds, json.loads(proc.stdout)


PYCACHE: Path | None = None  # set by main: the bytecode both paths' processes share


def _child_env(proxy: str) -> dict:
    env = dict(os.environ, HTTPS_PROXY=proxy, HTTP_PROXY=proxy)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if PYCACHE is not None:
        env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return env


CPU: dict[str, list[float]] = {}  # CPU seconds (user + sys) of each child: the start-up floor under load


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


TARGETS = {10: 0.15, 50: 0.25}  # vLLM and SGLang; every engine <= 1x at every speed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--speeds", type=float, nargs="+", default=[10, 50, 200], help="MB/s")
    parser.add_argument("--rtt", type=float, default=20, help="ms")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES))
    parser.add_argument("--proxy", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.proxy:
        asyncio.run(_serve(args.proxy[0], float(args.proxy[1]), float(args.proxy[2])))
        return
    from patchctl.core.config import resolve_index

    index = resolve_index().url
    times: dict[tuple[float, str, str], list[float]] = {}
    info: dict[tuple[float, str, str], dict] = {}
    global PYCACHE
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        PYCACHE = work / "pycache"
        for speed in args.speeds:
            proxy = Proxy(speed, args.rtt, work)
            try:
                if speed == args.speeds[0]:  # the warm-up round: bytecode, the index's caches
                    for spec in args.engines:
                        run_check(spec, proxy.url, work / f"cache-warmup-{spec}")
                        run_naive(spec, index, proxy.url, work / f"naive-warmup-{spec}")
                    CPU.clear()
                for r in range(args.rounds):
                    for spec in args.engines:
                        cell = f"{speed:g}-{spec}-{r}"
                        seconds, doc = run_check(spec, proxy.url, work / f"cache-{cell}")
                        times.setdefault((speed, spec, "check"), []).append(seconds)
                        info[(speed, spec, "check")] = doc
                        seconds, doc = run_naive(spec, index, proxy.url, work / f"naive-{cell}")
                        times.setdefault((speed, spec, "naive"), []).append(seconds)
                        info[(speed, spec, "naive")] = doc
            finally:
                proxy.close()
    print(
        f"cold `check` vs the naive path through a throttled link ({args.rtt:g} ms RTT), "
        f"median of {args.rounds} round(s), {os.cpu_count()} cores, index from {resolve_index().origin}"
    )
    print(
        f"{'MB/s':>5} {'engine':<24} {'check s':>8} {'naive s':>8} {'ratio':>6} {'target':>7} "
        f"{'check bytes':>12} {'naive bytes':>12}  check reads / naive reads"
    )
    met = True
    for speed in args.speeds:
        for spec in args.engines:
            c = statistics.median(times[(speed, spec, "check")])
            n = statistics.median(times[(speed, spec, "naive")])
            source = info[(speed, spec, "check")]["source"]
            naive = info[(speed, spec, "naive")]
            limit = TARGETS.get(int(speed), 1.0) if not spec.startswith("vllm-gguf-plugin") else 1.0
            ok = c / n <= limit
            met &= ok
            print(
                f"{speed:>5g} {spec:<24} {c:>8.2f} {n:>8.2f} {c / n:>6.2f} {'<=' + format(limit, 'g'):>7}"
                f"{'' if ok else '!'} {source['bytes_fetched']:>12,} {naive['bytes']:>12,}  "
                f"{source['kind']} {source.get('read')} / {naive['artifact']}"
            )
    outcomes = {
        spec: (
            [p["outcome"] for p in info[(args.speeds[0], spec, "check")]["patches"]],
            info[(args.speeds[0], spec, "naive")]["outcomes"],
        )
        for spec in args.engines
    }
    for spec, (check_out, naive_out) in outcomes.items():
        print(f"outcomes {spec}: check {' '.join(check_out)}; naive {' '.join(naive_out)}")
    print(
        "CPU s of each process (user+sys, median over every speed and round), check / naive: "
        + "; ".join(
            f"{spec} {statistics.median(CPU['check ' + spec]):.2f} / {statistics.median(CPU['naive ' + spec]):.2f}"
            for spec in args.engines
        )
    )
    print("targets " + ("met" if met else "NOT met (cells marked !)"))


if __name__ == "__main__":
    main()
