#!/usr/bin/env python3
"""Decode benchmark for the Triton sparse-MLA kernel (needs a CUDA GPU).

    python benchmarks/sparse_mla/bench_decode.py [--sweep] [--repeat N] [--limits sm120] [--json FILE]
    python benchmarks/sparse_mla/bench_decode.py --fetch-dense DIR   # on a machine with the package index
    python benchmarks/sparse_mla/bench_decode.py --dense-src DIR/triton_decode_attention-vllm-0.23.0.py  # GPU box offline

For batch 1, 8, 32, 64, 128, heads 8 and 16 (GLM-5 at TP 8, DeepSeek V3.2 at
TP 8; ``--heads``), fp16 and bf16, top-k 2048, page size 64, it times one decode
step of (``--dtypes fp8``: bf16 q with an fp8 e4m3 cache; its floor counts one
byte per cache element and its dense column is the bf16 dense kernel)

* the sparse kernel (kernels/sparse_mla/triton_sparse_mla.py), every row
  gathering 2048 distinct random slots of a paged cache, and
* vLLM's dense Triton MLA decode kernel (``decode_attention_fwd`` from a
  release's ``vllm/v1/attention/ops/triton_decode_attention.py``) attending to
  2048 tokens per request (32 random pages of 64), called the way vLLM 0.23.0's
  TritonMLA backend calls it (num_kv_splits = 4 for 2048 tokens, is_mla=True).
  The file is read from the pristine release (``--dense-version``, default
  0.23.0) through patchctl's upstream sources: the package index from pip's
  configuration (or ``--index-url``), downloaded once into patchctl's cache and
  checked against the index's sha256. A GPU machine without network access
  takes the file by path (``--dense-src``); write it on a machine that has
  access with ``--fetch-dense DIR``.

Timing: one CUDA graph holds N back-to-back calls, each on its own input set
(its own KV rows / pages), with N chosen so that the bytes the graph reads are
several times the 60 MB L2; the graph is replayed and time / N is one call.
The copy bandwidth is measured in the same run (device-to-device copy of a
2 GiB buffer, bytes read + written over time). ``--repeat N`` times every sparse
point N times, each on freshly drawn inputs and its own graph: the table gives
the median and the min-max spread.

``--limits sm120``: configs and split counts chosen as the kernel chooses them on
an SM120 part (99 KB of shared memory per program, 100 KB per SM), and every dot
compiled as ``mma.sync`` (``DISABLE_MMA_V3=1``; SM120 has no wgmma), timed on the
GPU at hand. After the table the bench counts, in the PTX of every kernel this
process compiled, which MMA instructions it holds (``wgmma`` / ``mma.sync``).

``--rope 0``: rope-free MLA (GLM-5.3-Flash, ``qk_rope_head_dim = 0``): rows of D =
kv_lora_rank = 512 instead of 576 (the dense column is not run then: vLLM's dense
kernel is timed at its DeepSeek geometry only). Run the default (64) beside it for the
576-wide kernel at the same batch sizes.

Bandwidth floor of the sparse kernel: per row topk * D * elt bytes gathered
(unique per row) + q + out. "%floor" = floor bytes / time / copy bandwidth.

The dense module imports ``vllm.platforms.current_platform`` and
``vllm.triton_utils``; when vLLM is not installed those two are stubbed here
(``is_rocm() -> False``; ``tl``/``triton`` are the real triton modules), which
is what they resolve to on an NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import types
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "kernels" / "sparse_mla" / "triton_sparse_mla.py"
DENSE_MEMBER = "vllm/v1/attention/ops/triton_decode_attention.py"
DV, ROPE = 512, 64
D = DV + ROPE
L2_BYTES = 60 * 2**20


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fetch_dense(version: str, index_url: str | None, dest_dir: Path) -> Path:
    """The pristine release's dense decode kernel file, through patchctl's upstream sources."""
    from packaging.version import Version

    from patchctl.engines import get_engine
    from patchctl.sources import fetch

    source = fetch.release(get_engine("vllm"), Version(version), fetch.SourceContext(index_url=index_url))
    data = source.read(DENSE_MEMBER)
    if data is None:
        raise SystemExit(f"vllm {version} ({source.artifact.filename}) has no {DENSE_MEMBER}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"triton_decode_attention-vllm-{version}.py"
    path.write_bytes(data)
    print(f"dense kernel: {DENSE_MEMBER} of {source.artifact.filename} (sha256 {source.artifact.sha256[:12]}) "
          f"-> {path}")
    return path


def dense_source(args) -> Path | None:
    if args.dense_src:
        return args.dense_src
    try:
        return fetch_dense(args.dense_version, args.index_url, Path(tempfile.mkdtemp(prefix="bench-dense-")))
    except ImportError:
        print("dense kernel: patchctl is not importable here; pass --dense-src (skipped)")
    except Exception as e:  # noqa: BLE001 -- no network, no such release: the sparse table still runs
        print(f"dense kernel: cannot read it from vllm {args.dense_version}: {e} (skipped; see --dense-src)")
    return None


def load_dense(path: Path):
    try:
        import vllm.platforms  # noqa: F401
        import vllm.triton_utils  # noqa: F401
    except Exception:
        # Minimal stubs: what these resolve to on an NVIDIA GPU.
        vllm = types.ModuleType("vllm")
        plat = types.ModuleType("vllm.platforms")
        plat.current_platform = types.SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: True)
        tu = types.ModuleType("vllm.triton_utils")
        tu.tl, tu.triton = tl, triton
        vllm.platforms, vllm.triton_utils = plat, tu
        sys.modules.update({"vllm": vllm, "vllm.platforms": plat, "vllm.triton_utils": tu})
    return load_module(path, "vllm_triton_decode_attention")


def graph_time_us(fns, reps=20, rounds=5):
    """Capture fns (one call each) into one graph; median over rounds of time per call."""
    for f in fns[:2]:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (reps * len(fns)))
    del g
    return statistics.median(times)


def copy_bandwidth():
    n = 2 * 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(ts)


def n_sets_for(bytes_per_call):
    return max(2, min(256, math.ceil(6 * L2_BYTES / bytes_per_call)))


def sparse_case(kmod, B, H, dtype, topk, page, cfg=None, kv_dtype=None, rope=ROPE):
    """kv_dtype float8_e4m3fn: an fp8 cache (per-tensor scale) with fp16/bf16 q; rope 0:
    rope-free rows (D = DV)."""
    D = DV + rope
    elt = torch.finfo(dtype).bits // 8
    kv_elt = torch.finfo(kv_dtype).bits // 8 if kv_dtype is not None else elt
    kv_bytes = B * topk * D * kv_elt
    sets = n_sets_for(kv_bytes)
    n_slots = sets * B * topk
    n_blocks = triton.cdiv(n_slots, page)
    kv = torch.randn(n_blocks, page, D, device="cuda", dtype=dtype)
    extra = {}
    if kv_dtype is not None:
        kv = (kv * 8).to(kv_dtype)
        extra["kv_scale"] = 0.125
    perm = torch.randperm(n_blocks * page, device="cuda")[:n_slots].to(torch.int32)
    idx = perm.view(sets, B, topk)
    q = torch.randn(sets, B, H, D, device="cuda", dtype=dtype)
    out = torch.empty(B, H, DV, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(D)
    fns = [
        (lambda i=i: kmod.sparse_mla_attention(q[i], kv, idx[i], scale, DV, out=out, _config=cfg, **extra))
        for i in range(sets)
    ]
    us = graph_time_us(fns)
    floor_bytes = kv_bytes + B * H * D * elt + B * H * DV * elt
    del kv, idx, q
    torch.cuda.empty_cache()
    return us, floor_bytes


def dense_case(dmod, B, H, dtype, seqlen, page):
    elt = torch.finfo(dtype).bits // 8
    pages_per_req = seqlen // page
    sets = n_sets_for(B * seqlen * D * elt)
    n_pages = sets * B * pages_per_req
    kv = torch.randn(n_pages, page, 1, D, device="cuda", dtype=dtype)
    v = kv[..., :DV]
    bt = torch.randperm(n_pages, device="cuda").to(torch.int32).view(sets, B, pages_per_req)
    seq = torch.full((B,), seqlen, dtype=torch.int32, device="cuda")
    q = torch.randn(sets, B, H, D, device="cuda", dtype=dtype)
    o = torch.empty(B, H, DV, device="cuda", dtype=dtype)
    lse = torch.empty(B, H, device="cuda", dtype=dtype)
    splits = min(triton.next_power_of_2(max(1, seqlen // 512)),
                 2 * torch.cuda.get_device_properties(0).multi_processor_count)
    logits = torch.empty(B, H, splits, DV + 1, dtype=torch.float32, device="cuda")
    one = torch.tensor(1.0, dtype=torch.float32, device="cuda")
    scale = 1.0 / math.sqrt(D)
    fns = [
        (lambda i=i: dmod.decode_attention_fwd(q[i], kv, v, o, lse, bt[i], seq, logits, splits, scale,
                                                page, k_scale=one, v_scale=one, is_mla=True))
        for i in range(sets)
    ]
    us = graph_time_us(fns)
    del kv, q, bt
    torch.cuda.empty_cache()
    return us


SWEEP = {
    8: ["h16_n32_w4_s3", "h16_n32_w8_s3", "h16_n16_w4_s3", "h16_n64_w8_s2"],
    32: ["h32_n32_w8_s3", "h32_n64_w8_s3", "h16_n32_w4_s3"],
    64: ["h64_n32_w8_s3", "h64_n32_w8_s4", "h64_n64_w8_s2", "h16_n32_w4_s3", "h32_n64_w8_s3"],
}


def device_limits(kmod, which: str):
    """The limits configs are chosen under: this GPU's, or SM120's shared memory (99 KB per
    program, 100 KB per SM) with this GPU's SM count -- what an SM120 part would run, timed here."""
    dev = torch.device("cuda")
    if which == "sm120":
        return kmod._Limits(kmod._device_limits(dev).sms, 101376, 102400)
    return kmod._device_limits(dev)


def run_sweep(kmod, bw, topk, page, results, batches, sweep=SWEEP, limits=None):
    """bf16; each named config of the kernel's _CONFIGS at its own split rule, and at half that."""
    dev = limits or torch.device("cuda")
    print(f"{'H':>3} {'B':>4} {'cfg':<16} {'splits':>6} {'us':>8} {'%floor':>7}")
    for H, names in sweep.items():
        for B in batches:
            for name in names:
                c = kmod._config_dict(name, B, H, topk, dev)
                for splits in sorted({c["num_splits"], max(1, c["num_splits"] // 2)}, reverse=True):
                    cc = dict(c, num_splits=splits)
                    try:
                        us, fb = sparse_case(kmod, B, H, torch.bfloat16, topk, page, cc)
                    except Exception as e:  # a config may not fit (shared memory, registers)
                        print(f"{H:>3} {B:>4} {name:<16} failed: {type(e).__name__}: {str(e)[:80]}", flush=True)
                        break
                    pct = 100 * fb / (us * 1e-6) / bw
                    print(f"{H:>3} {B:>4} {name:<16} {splits:>6} {us:>8.1f} {pct:>6.1f}%", flush=True)
                    results.append(dict(kind="sweep", H=H, B=B, cfg=cc, name=name, us=us, pct_floor=pct))


def mma_kinds(kernels) -> dict:
    """Which MMA instructions the compiled kernels' PTX holds: {kernel name: [kinds]}."""
    out = {}
    for k in kernels:
        for compiled in _compiled_of(k):
            ptx = compiled.asm.get("ptx", "")
            kinds = [kind for kind, needle in (("wgmma", "wgmma.mma_async"), ("mma.sync", "mma.sync"))
                     if needle in ptx]
            name = getattr(compiled, "name", None) or getattr(getattr(compiled, "metadata", None), "name", "?")
            out.setdefault(name, set()).update(kinds or ["no mma"])
    return {n: sorted(v) for n, v in out.items()}


def _compiled_of(jit_fn):
    """The compiled kernels a @triton.jit function holds (its per-device caches)."""
    for per_device in getattr(jit_fn, "device_caches", {}).values():
        cache = per_device[0] if isinstance(per_device, tuple) else per_device
        yield from cache.values()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense-src", type=Path, default=None,
                    help="triton_decode_attention.py of a vLLM release, by path (default: read from --dense-version)")
    ap.add_argument("--dense-version", default="0.23.0", help="vLLM release whose dense kernel is timed")
    ap.add_argument("--index-url", default=None, help="package index (default: pip's configuration)")
    ap.add_argument("--fetch-dense", type=Path, default=None, metavar="DIR",
                    help="only write the dense kernel file of --dense-version into DIR (no GPU needed) and exit")
    ap.add_argument("--kernel", type=Path, default=KERNEL, help="the sparse kernel file to time (default: the shipped one)")
    ap.add_argument("--batches", default="1,8,32,64,128")
    ap.add_argument("--heads", default="8,16")
    ap.add_argument("--dtypes", default="fp16,bf16", help="fp16, bf16, fp8 (bf16 q, fp8 e4m3 cache)")
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--rope", type=int, default=ROPE, choices=(0, ROPE),
                    help="rope width of the cache rows: 64 (D 576, DeepSeek V3.2 / GLM-5) or 0 (D 512, GLM-5.3-Flash)")
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1,
                    help="time every sparse point N times (fresh inputs each); the table gives median and min-max")
    ap.add_argument("--sweep", action="store_true", help="also sweep launch configs (bf16)")
    ap.add_argument("--sweep-batches", default="1,32,128")
    ap.add_argument("--sweep-configs", default=None, help='per heads, names from _CONFIGS: "8:a+b;64:c"')
    ap.add_argument("--limits", choices=("device", "sm120"), default="device",
                    help="choose configs and split counts for this GPU, or as on an SM120 part (99 KB per program, "
                         "dots as mma.sync)")
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.fetch_dense:
        from patchctl.errors import PatchctlError

        try:
            fetch_dense(args.dense_version, args.index_url, args.fetch_dense)
        except PatchctlError as e:
            sys.exit(f"bench_decode.py: {e}")
        return
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py needs a CUDA GPU")

    kmod = load_module(args.kernel, "triton_sparse_mla")
    print(f"sparse kernel: {args.kernel}")
    dense_src = dense_source(args) if args.rope == ROPE else None
    dmod = load_dense(dense_src) if dense_src else None
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}")
    print(f"dense kernel: {dense_src or 'not found (skipped)'}")
    if args.limits == "sm120":
        # SM120 has no wgmma: make triton compile every dot as mma.sync, as it would there
        # (read when a kernel is compiled, and part of triton's cache key).
        os.environ["DISABLE_MMA_V3"] = "1"
        print("DISABLE_MMA_V3=1: dots compiled as mma.sync (SM120's instruction set)")
    limits = device_limits(kmod, args.limits)
    print(f"configs chosen for: {args.limits} ({limits.smem_per_block} B shared memory per program)")
    bw = copy_bandwidth()
    print(f"copy bandwidth (read+write): {bw / 1e12:.2f} TB/s")
    results = [dict(kind="copy_bw", bytes_per_s=bw)]

    if args.sweep:
        sweep = SWEEP
        if args.sweep_configs:  # "8:name+name;64:name"
            sweep = {int(h): names.split("+") for h, names in (p.split(":") for p in args.sweep_configs.split(";"))}
        run_sweep(kmod, bw, args.topk, args.page, results, [int(b) for b in args.sweep_batches.split(",")], sweep,
                  limits)

    if not args.no_table:
        # "fp8": bf16 q with an fp8 (e4m3) cache; its dense column is the bf16 dense
        # kernel (vLLM's Triton MLA decode is not run with an fp8 cache here).
        dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
        rows = []
        for dn in args.dtypes.split(","):
            for H in map(int, args.heads.split(",")):
                for B in map(int, args.batches.split(",")):
                    kv_dtype = torch.float8_e4m3fn if dn == "fp8" else None
                    cfg = kmod._pick_config(B, H, args.topk, limits)
                    samples = []
                    for _ in range(max(1, args.repeat)):
                        t, fb = sparse_case(kmod, B, H, dtypes[dn], args.topk, args.page, cfg=cfg,
                                            kv_dtype=kv_dtype, rope=args.rope)
                        samples.append(t)
                    us = statistics.median(samples)
                    dus = dense_case(dmod, B, H, dtypes[dn], args.topk, args.page) if dmod else float("nan")
                    rows.append(dict(kind="table", dtype=dn, H=H, B=B, D=DV + args.rope, sparse_us=us, samples_us=samples,
                                     floor_bytes=fb, floor_us=fb / bw * 1e6, pct_floor=100 * fb / (us * 1e-6) / bw,
                                     achieved_TBps=fb / (us * 1e-6) / 1e12, dense_us=dus, cfg=cfg))
                    print(f"  {dn} H={H} B={B}: sparse {us:.1f} us ({' '.join(f'{t:.1f}' for t in samples)}), "
                          f"dense {dus:.1f} us", flush=True)
        results += rows
        print()
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s; topk {args.topk}, page {args.page}, CUDA-graph replay, "
              f"time per call; D {DV + args.rope}; configs for {args.limits}; sparse us = median of {max(1, args.repeat)}")
        hdr = ("| dtype | heads | batch | config | splits | sparse us | min-max | floor us | % of floor "
               "| achieved TB/s | dense us | sparse/dense | target |")
        print(hdr)
        print("|---" * (hdr.count("|") - 1) + "|")
        for r in rows:
            need = []
            if r["B"] >= 32 and r["H"] <= 8:  # the heads-64 floor target (50 %) is withdrawn
                need.append(r["pct_floor"] >= 60)
            if r["B"] == 1:
                need.append(r["sparse_us"] <= 15)
            ratio = r["sparse_us"] / r["dense_us"]
            need.append(ratio <= 1 / 3)
            spread = f"{min(r['samples_us']):.1f}-{max(r['samples_us']):.1f}"
            print(f"| {r['dtype']} | {r['H']} | {r['B']} | {r['cfg']['name']} | {r['cfg']['num_splits']} "
                  f"| {r['sparse_us']:.1f} | {spread} | {r['floor_us']:.1f} | {r['pct_floor']:.1f}% "
                  f"| {r['achieved_TBps']:.2f} | {r['dense_us']:.1f} | {ratio:.2f} | {'met' if all(need) else 'MISSED'} |")
        print("target: %floor >= 60 (H8) at batch >= 32; batch 1 <= 15 us; sparse/dense <= 1/3")
    kernels = [getattr(kmod, n) for n in dir(kmod) if n.startswith("_sparse_mla_stage")]
    try:
        mma = mma_kinds(kernels)
    except Exception as e:  # noqa: BLE001 -- triton's private caches moved: the table above stands
        mma = {"?": [f"not read: {type(e).__name__}: {e}"]}
    print("MMA instructions in the compiled sparse kernels' PTX:",
          "; ".join(f"{n}: {'+'.join(k)}" for n, k in sorted(mma.items())) or "none compiled")
    results.append(dict(kind="mma", limits=args.limits, kernels=mma))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
