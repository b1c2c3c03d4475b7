"""Is the client the bottleneck? validate's client, and SGLang's `bench_serving` beside it, against the
one test server's model with known timings (its own process), each client pinned to one core:
per concurrency level the measured TTFT and ITL (p50) against the truth, and the client's CPU time
per streamed token.

    python benchmarks/validate_client_cost.py [--peer-python VENV/bin/python --bench-tree TREE]
        [--client-cpu 0 --server-cpu 1] [--concurrency 1,32,128,256]

validate's CPU time is its process's (user + system) over the level alone; bench_serving's is the
difference of two runs' CPU time (N and 2N requests, as a child process), which cancels its start-up
(imports, tokenizer), divided by the difference of their output tokens. "Faithful" is TTFT and ITL
within 5% of the truth. Take the figures on a loaded machine as pessimistic.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from validate_vs_peers import RUNNER, TOKENIZER, free_port  # noqa: E402

from patchctl.validate.client import CHAT, OpenAIClient  # noqa: E402
from patchctl.validate.process import ServerProcess  # noqa: E402
from patchctl.validate.throughput import run_level  # noqa: E402

TOLERANCE = 0.05


def cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure_validate(url: str, conc: int, n: int, max_tokens: int) -> dict[str, Any]:
    client = OpenAIClient(url)
    client.resolve_model()
    before = cpu_self()
    lv = run_level(client, conc, n, CHAT, "Say anything.", max_tokens)
    cpu = cpu_self() - before
    tokens = lv.output_tokens or 0
    return {
        "ttft": lv.ttft_ms.p50 if lv.ttft_ms else None,
        "itl": lv.itl_ms.p50 if lv.itl_ms else None,
        "tokens": tokens,
        "cpu_us_per_token": cpu / tokens * 1e6 if tokens else None,
        "failed": lv.failed,
    }


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


def faithful(m: dict[str, Any], ttft: float, itl: float) -> bool:
    return (
        m["ttft"] is not None
        and m["itl"] is not None
        and abs(m["ttft"] - ttft) <= TOLERANCE * ttft
        and abs(m["itl"] - itl) <= TOLERANCE * itl
    )


def main() -> None:
    import datetime

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-python", help="python that runs SGLang's bench_serving (omit: validate alone)")
    p.add_argument("--bench-tree", type=Path)
    p.add_argument("--ttft", type=float, default=0.1)
    p.add_argument("--itl", type=float, default=0.01)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,32,128")
    p.add_argument("--client-cpu", default="0", help="the core the clients are pinned to (taskset -c)")
    p.add_argument("--server-cpu", default="1", help="the core the test server is pinned to")
    args = p.parse_args()
    os.sched_setaffinity(0, {int(args.client_cpu)})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = [
        "taskset",
        "-c",
        args.server_cpu,
        sys.executable,
        "-m",
        "support.reasoner",
        "--port",
        str(port),
        "--ttft",
        str(args.ttft),
        "--itl",
        str(args.itl),
        "--no-reasoning",
        "--role-at-first-token",
    ]
    truth_ttft, truth_itl = (args.ttft + args.itl) * 1000, args.itl * 1000
    rows = []
    with tempfile.TemporaryDirectory() as tmp_s, ServerProcess(server, url, Path(tmp_s), ready_timeout_s=30):
        tmp = Path(tmp_s)
        tokenizer = tmp / "tok"
        if args.peer_python:
            subprocess.run(
                [args.peer_python, "-c", TOKENIZER, str(tokenizer)],
                check=True,
                capture_output=True,
                env={"PATH": "/usr/bin:/bin"},
            )
        measure_validate(url, 4, 8, 8)  # warm-up
        for conc in (int(c) for c in args.concurrency.split(",")):
            n = max(16, 2 * conc)
            row: dict[str, Any] = {"concurrency": conc, "validate": measure_validate(url, conc, n, args.max_tokens)}
            if args.peer_python and args.bench_tree:
                row["bench_serving"] = measure_bench(
                    args.peer_python, args.bench_tree, url, tokenizer, conc, n, args.max_tokens, tmp, args.client_cpu
                )
            rows.append(row)
    tools = [t for t in ("validate", "bench_serving") if t in rows[0]]
    print(
        f"{datetime.date.today()}; truth: TTFT {truth_ttft:.1f} ms, ITL {truth_itl:.1f} ms; "
        f"clients on core {args.client_cpu}, server on core {args.server_cpu}"
    )
    print("| c | tool | TTFT p50 ms | ITL p50 ms | CPU µs / token | faithful (within 5%) |")
    print("|---|---|---|---|---|---|")
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    for row in rows:
        for t in tools:
            m = row[t]
            ok = "yes" if faithful(m, truth_ttft, truth_itl) else "no"
            print(f"| {row['concurrency']} | {t} | {fmt(m['ttft'])} | {fmt(m['itl'])} | {fmt(m['cpu_us_per_token'])} | {ok} |")


if __name__ == "__main__":
    main()
