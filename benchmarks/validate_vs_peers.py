"""`patchctl validate` against SGLang's `bench_serving` on the same server, same workload: the one test
server's reasoning model with known timings (TTFT and the time between tokens set), the same
concurrency, request count and max_tokens. Prints a table of both tools' TTFT, TPOT, ITL and output
throughput (medians) and their difference, and the known truth.

    python benchmarks/validate_vs_peers.py --peer-python VENV/bin/python --bench-tree TREE

TREE holds `sglang/bench_serving.py` of a release with this project's bench fixes applied (the bench
patches of patches/sglang/, e.g. `patchctl export sglang@0.5.4` or `patch -p1` of their 0.5.4
variants onto the release's file); VENV has what that file imports (aiohttp, numpy, pybase64, tqdm,
requests, transformers, tokenizers, pillow; `datasets` is stood in for, the random-ids dataset does
not use it). Target (issue 25): validate within 5% of bench_serving where the definitions agree.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchctl.serve.process import ServerProcess  # noqa: E402
from patchctl.serve.validation import ServeConfig, run_validate  # noqa: E402

# Runs bench_serving from TREE with the modules the random-ids workload never uses stood in for.
RUNNER = """
import runpy, sys, types
tree = sys.argv[1]
sys.path.insert(0, tree)
datasets = types.ModuleType("datasets")
datasets.load_dataset = None
sys.modules.setdefault("datasets", datasets)
sys.argv = ["sglang.bench_serving"] + sys.argv[2:]
runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
"""

TOKENIZER = """
import json, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2}
for w in [f"tok{i}" for i in range(4096)] + ["Let", "me", "think", "."]:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]")
fast.save_pretrained(sys.argv[1])
Path(sys.argv[1], "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(vocab)}))
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_bench(peer: str, tree: Path, url: str, tokenizer: Path, conc: int, n: int, max_tokens: int,
              out: Path) -> dict[str, Any]:
    cmd = [peer, "-c", RUNNER, str(tree), "--backend", "sglang-oai-chat", "--base-url", url,
           "--dataset-name", "random-ids", "--random-input-len", "8", "--random-output-len", str(max_tokens),
           "--random-range-ratio", "1.0", "--num-prompts", str(n), "--max-concurrency", str(conc),
           "--request-rate", "inf", "--seed", "1", "--output-file", str(out), "--disable-tqdm",
           "--tokenizer", str(tokenizer)]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"bench_serving failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return dict(json.loads(out.read_text().strip().splitlines()[-1]))


def run_ours(url: str, conc: int, n: int, max_tokens: int, prompt: str, tmp: Path) -> dict[str, float | None]:
    report = run_validate(ServeConfig(base_url=url, answers=False, concurrency=(conc,), requests_per_level=n,
                                      max_tokens=max_tokens, prompt=prompt, prompt_name="peer", warmup_requests=1,
                                      baseline_dir=tmp / "b"))
    assert report.throughput is not None
    (lv,) = report.throughput.levels
    return {"ttft": lv.ttft_ms.p50 if lv.ttft_ms else None, "tpot": lv.tpot_ms.p50 if lv.tpot_ms else None,
            "itl": lv.itl_ms.p50 if lv.itl_ms else None, "tok_s": lv.output_tok_s,
            "failed": float(lv.failed)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-python", required=True)
    p.add_argument("--bench-tree", type=Path, required=True)
    p.add_argument("--ttft", type=float, default=0.2, help="the server's prefill, seconds")
    p.add_argument("--itl", type=float, default=0.01, help="the server's time between tokens, seconds")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    rows = []
    port = free_port()
    # Its own process: in this one its threads would compete with validate's for the interpreter.
    server_cmd = [sys.executable, "-m", "patchctl.testing.reasoner", "--port", str(port), "--ttft", str(args.ttft),
                  "--itl", str(args.itl), "--no-reasoning"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp_s, ServerProcess(server_cmd, url, Path(tmp_s), ready_timeout_s=30):
        tmp = Path(tmp_s)
        tokenizer = tmp / "tok"
        subprocess.run([args.peer_python, "-c", TOKENIZER, str(tokenizer)], check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin"})
        for conc in (int(c) for c in args.concurrency.split(",")):
            ours = run_ours(url, conc, args.requests, args.max_tokens, "Say anything.", tmp)
            theirs = run_bench(args.peer_python, args.bench_tree, url, tokenizer, conc, args.requests,
                               args.max_tokens, tmp / f"bench{conc}.jsonl")
            peer = {"ttft": theirs["median_ttft_ms"], "tpot": theirs["median_tpot_ms"],
                    "itl": theirs["median_itl_ms"], "tok_s": theirs["output_throughput"]}
            truth = {"ttft": (args.ttft + args.itl) * 1000, "tpot": args.itl * 1000, "itl": args.itl * 1000,
                     "tok_s": None}
            for key in ("ttft", "tpot", "itl", "tok_s"):
                a, b = ours[key], peer[key]
                diff = None if a is None or not b else (a - b) / b * 100
                rows.append({"concurrency": conc, "figure": key, "validate": a, "bench_serving": b,
                             "diff_pct": diff, "truth": truth[key]})
    print("| c | figure | validate | bench_serving | difference | server's truth |")
    print("|---|---|---|---|---|---|")
    names = {"ttft": "TTFT p50 ms", "tpot": "TPOT p50 ms", "itl": "ITL p50 ms", "tok_s": "output tok/s"}
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        diff = "-" if r["diff_pct"] is None else f"{r['diff_pct']:+.1f}%"
        print(f"| {r['concurrency']} | {names[r['figure']]} | {fmt(r['validate'])} | {fmt(r['bench_serving'])} | "
              f"{diff} | {fmt(r['truth'])} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
