#!/usr/bin/env python3
"""Decode benchmark for the Triton sparse-MLA kernel (needs a CUDA GPU).

    python benchmarks/sparse_mla/bench_decode.py [--kv bf16,fp8,fp8_ds_mla] [--sm120-limits] [--sweep] [--repeat N] [--json FILE]
    python benchmarks/sparse_mla/bench_decode.py --plan [--kv ...] [--l2-mib 128]   # shapes and bytes only, no GPU
    python benchmarks/sparse_mla/bench_decode.py --fetch-dense DIR   # on a machine with the package index
    python benchmarks/sparse_mla/bench_decode.py --dense-src DIR/triton_decode_attention-vllm-0.23.0.py  # GPU box offline

For batch 1, 8, 32, 64, 128, heads 8 and 16 (GLM-5 at TP 8, DeepSeek V3.2 at
TP 8; ``--heads``), bf16 activations (``--dtypes``), top-k 2048, page size 64 and
each cache format of ``--kv`` (bf16: the activation dtype; fp8: per-tensor e4m3;
fp8_ds_mla: vLLM's DSA layout, 656 bytes a row; bench_plan.py has the byte
accounting: each format's floor counts its own bytes), it times one decode step of

* the sparse kernel (``--kernel FILE``; by default the shipped
  kernels/sparse_mla/triton_sparse_mla.py, which has no fp8_ds_mla path; the
  development kernel is kernels/sparse_mla/next/triton_sparse_mla.py, and
  gpu_recheck_fp8.sh times both), every row gathering 2048 distinct random
  slots of a paged cache, and
* the plain-torch peer (bench_peer.py: gather the rows, dequantise them for the fp8
  formats, two batched matmuls and a softmax; ``--no-peer`` skips it), and
* vLLM's dense Triton MLA decode kernel (bf16 cache only; ``--no-dense`` skips it) (``decode_attention_fwd`` from a
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

``--limits sm120`` (or ``--sm120-limits``): configs and split counts chosen as the kernel chooses them on
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_peer  # noqa: E402 -- beside this file
import bench_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "kernels" / "sparse_mla" / "triton_sparse_mla.py"
DENSE_MEMBER = "vllm/v1/attention/ops/triton_decode_attention.py"
DV, ROPE = 512, 64
D = DV + ROPE
L2_BYTES = 60 * 2**20  # the H200's; on a GPU main() takes the device's own


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fetch_dense(version: str, index_url: str | None, dest_dir: Path) -> Path:
    """The pristine release's dense decode kernel file, through patchctl's upstream sources."""
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.sources import fetch

    source = fetch.release(get_engine("vllm"), Version(version), fetch.SourceContext(index_url=index_url))
    data = source.read(DENSE_MEMBER)
    if data is None:
        raise SystemExit(f"vllm {version} ({source.artifact.filename}) has no {DENSE_MEMBER}")
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"triton_decode_attention-vllm-{version}.py"
    path.write_bytes(data)
    print(f"dense kernel: {DENSE_MEMBER} of {source.artifact.filename} (sha256 {source.artifact.sha256[:12]}) -> {path}")
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
    return bench_plan.sets_for(bytes_per_call, L2_BYTES)


def sparse_case(kmod, B, H, dtype, topk, page, cfg=None, kv="bf16", rope=ROPE, peer=False):
    """One point: the kernel (or, peer=True, the plain-torch peer) over a cache in format kv
    (bf16: dtype itself, fp8, fp8_ds_mla), every call of the graph on its own rows; rope 0:
    rope-free rows (D = DV). Returns (us per call, floor bytes)."""
    D = DV + rope
    elt = torch.finfo(dtype).bits // 8
    kv_bytes = B * topk * bench_plan.cache_row_bytes(kv, rope, elt)
    sets = n_sets_for(kv_bytes)
    n_slots = sets * B * topk
    n_blocks = triton.cdiv(n_slots, page)
    cache, extra = bench_peer.make_cache(kv, n_blocks, page, rope, dtype, "cuda")
    perm = torch.randperm(n_blocks * page, device="cuda")[:n_slots].to(torch.int32)
    idx = perm.view(sets, B, topk)
    q = torch.randn(sets, B, H, D, device="cuda", dtype=dtype)
    out = torch.empty(B, H, DV, device="cuda", dtype=dtype)
    scale = 1.0 / math.sqrt(D)
    if peer:
        fns = [
            (lambda i=i: out.copy_(bench_peer.peer_forward(q[i], cache, idx[i], scale, kv, rope, extra.get("kv_scale"))))
            for i in range(sets)
        ]
    else:
        fns = [
            (lambda i=i: kmod.sparse_mla_attention(q[i], cache, idx[i], scale, DV, out=out, _config=cfg, **extra))
            for i in range(sets)
        ]
    us = graph_time_us(fns)
    del cache, idx, q
    torch.cuda.empty_cache()
    return us, bench_plan.floor_bytes(B, H, topk, kv, rope, elt)


def launch_for(kmod, B, H, topk, limits, kv, rope):
    """The launch a call gets under these limits (kernels from before pick_launch: _pick_config)."""
    if hasattr(kmod, "pick_launch"):
        return kmod.pick_launch(B, H, topk, limits, kv, rope)
    if kv == "fp8_ds_mla":
        return None  # that kernel has no fp8_ds_mla path
    return dict(kmod._pick_config(B, H, topk, limits), kernel="generic")


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
    splits = min(triton.next_power_of_2(max(1, seqlen // 512)), 2 * torch.cuda.get_device_properties(0).multi_processor_count)
    logits = torch.empty(B, H, splits, DV + 1, dtype=torch.float32, device="cuda")
    one = torch.tensor(1.0, dtype=torch.float32, device="cuda")
    scale = 1.0 / math.sqrt(D)
    fns = [
        (
            lambda i=i: dmod.decode_attention_fwd(
                q[i], kv, v, o, lse, bt[i], seq, logits, splits, scale, page, k_scale=one, v_scale=one, is_mla=True
            )
        )
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
            kinds = [kind for kind, needle in (("wgmma", "wgmma.mma_async"), ("mma.sync", "mma.sync")) if needle in ptx]
            name = getattr(compiled, "name", None) or getattr(getattr(compiled, "metadata", None), "name", "?")
            out.setdefault(name, set()).update(kinds or ["no mma"])
    return {n: sorted(v) for n, v in out.items()}


def _compiled_of(jit_fn):
    """The compiled kernels a @triton.jit function holds (its per-device caches)."""
    for per_device in getattr(jit_fn, "device_caches", {}).values():
        cache = per_device[0] if isinstance(per_device, tuple) else per_device
        yield from cache.values()


def run_fp8_sweep(kmod, bw, topk, page, results, batches, heads, kv, limits, rope):
    """Each config of the 8-bit kernel (FP8_CONFIGS) for cache format kv, at its split rule."""
    fp8 = kmod._fp8
    print(f"{'kv':<10} {'H':>3} {'B':>4} {'cfg':<22} {'splits':>6} {'us':>8} {'%floor':>7}")
    for H in heads:
        for B in batches:
            for name, c in fp8.FP8_CONFIGS.items():
                if c.smem > limits.smem_per_block:  # would not launch on the part these limits stand for
                    print(f"{kv:<10} {H:>3} {B:>4} {name:<22} skipped: {c.smem} B > {limits.smem_per_block} B")
                    continue
                per_sm = max(1, min(c.per_sm, limits.smem_per_sm // (c.smem + 1024)))
                splits = kmod._num_splits(B * triton.cdiv(H, c.block_h), triton.cdiv(topk, c.block_n), per_sm, limits.sms)
                cfg = dict(
                    block_h=c.block_h,
                    block_n=c.block_n,
                    num_warps=c.num_warps,
                    num_stages=c.num_stages,
                    pv_reload=c.pv_reload,
                    num_splits=splits,
                )
                try:
                    us, fb = sparse_case(kmod, B, H, torch.bfloat16, topk, page, cfg, kv=kv, rope=rope)
                except Exception as e:  # noqa: BLE001 -- a config may not fit (shared memory, registers)
                    print(f"{kv:<10} {H:>3} {B:>4} {name:<22} failed: {type(e).__name__}: {str(e)[:80]}", flush=True)
                    continue
                pct = 100 * fb / (us * 1e-6) / bw
                print(f"{kv:<10} {H:>3} {B:>4} {name:<22} {splits:>6} {us:>8.1f} {pct:>6.1f}%", flush=True)
                results.append(dict(kind="fp8_sweep", kv=kv, H=H, B=B, name=name, cfg=cfg, us=us, pct_floor=pct))


def target(r, bf16_us):
    """The issue's targets for a row ("met"/"MISSED"/"-"): batch >= 32, heads 8/16: fp8 formats
    >= 60 % of their own floor and >= 1.5x faster than bf16 at the same shape (when bf16 ran);
    bf16 >= 70 % under SM120's limits (--limits sm120) and >= 60 % otherwise."""
    if r["B"] < 32 or r["H"] not in (8, 16):
        return "-"
    if r["kv"] == "bf16":
        return "met" if r["pct_floor"] >= (70 if r["limits"] == "sm120" else 60) else "MISSED"
    ok = r["pct_floor"] >= 60
    if bf16_us is not None:
        ok = ok and bf16_us / r["sparse_us"] >= 1.5
    return "met" if ok else "MISSED"


def main():
    args = bench_plan.parse_args(description=__doc__)
    global L2_BYTES
    if args.plan:
        l2 = int((args.l2_mib or 60) * 2**20)
        print(json.dumps(dict(l2_bytes=l2, limits=args.limits, points=bench_plan.plan(args, l2)), indent=1))
        return
    if args.fetch_dense:
        from patchctl.core.errors import PatchctlError

        try:
            fetch_dense(args.dense_version, args.index_url, args.fetch_dense)
        except PatchctlError as e:
            sys.exit(f"bench_decode.py: {e}")
        return
    if not torch.cuda.is_available():
        sys.exit("bench_decode.py needs a CUDA GPU (--plan prints the shapes and bytes without one)")

    kernel_path = args.kernel or KERNEL
    kmod = load_module(kernel_path, "triton_sparse_mla")
    print(f"sparse kernel: {kernel_path}")
    want_dense = not args.no_dense and args.rope == ROPE and "bf16" in args.kv
    dense_src = dense_source(args) if want_dense else None
    dmod = load_dense(dense_src) if dense_src else None
    props = torch.cuda.get_device_properties(0)
    L2_BYTES = getattr(props, "L2_cache_size", 0) or L2_BYTES
    print(
        f"device: {props.name}, {props.multi_processor_count} SMs, L2 {L2_BYTES / 2**20:.0f} MiB; "
        f"torch {torch.__version__}, triton {triton.__version__}"
    )
    print(f"dense kernel: {dense_src or 'not run'}")
    if args.limits == "sm120":
        # SM120 has no wgmma: make triton compile every dot as mma.sync, as it would there
        # (read when a kernel is compiled, and part of triton's cache key).
        os.environ["DISABLE_MMA_V3"] = "1"
        print("DISABLE_MMA_V3=1: dots compiled as mma.sync (SM120's instruction set)")
    limits = device_limits(kmod, args.limits)
    print(f"configs chosen for: {args.limits} ({limits.smem_per_block} B shared memory per program)")
    bw = copy_bandwidth()
    print(f"copy bandwidth (read+write, the floor's rate, this run): {bw / 1e12:.2f} TB/s")
    results = [dict(kind="copy_bw", bytes_per_s=bw, l2_bytes=L2_BYTES)]

    if args.sweep:
        batches = [int(b) for b in args.sweep_batches.split(",")]
        if "bf16" in args.kv:
            sweep = SWEEP
            if args.sweep_configs:  # "8:name+name;64:name"
                sweep = {int(h): names.split("+") for h, names in (p.split(":") for p in args.sweep_configs.split(";"))}
            run_sweep(kmod, bw, args.topk, args.page, results, batches, sweep, limits)
        for kv in (k for k in args.kv if k != "bf16"):
            if hasattr(kmod, "_fp8"):
                run_fp8_sweep(kmod, bw, args.topk, args.page, results, batches, args.heads, kv, limits, args.rope)

    if not args.no_table:
        dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
        rows = []
        for kv in args.kv:
            for dn in args.act_dtypes:
                for H in args.heads:
                    for B in args.batches:
                        cfg = launch_for(kmod, B, H, args.topk, limits, kv, args.rope)
                        if cfg is None:
                            print(f"  {kv} H={H} B={B}: this kernel has no {kv} path (skipped)", flush=True)
                            continue
                        samples = []
                        for _ in range(args.repeat):
                            t, fb = sparse_case(kmod, B, H, dtypes[dn], args.topk, args.page, cfg=cfg, kv=kv, rope=args.rope)
                            samples.append(t)
                        us = statistics.median(samples)
                        pus = (
                            float("nan")
                            if args.no_peer
                            else sparse_case(kmod, B, H, dtypes[dn], args.topk, args.page, kv=kv, rope=args.rope, peer=True)[0]
                        )
                        dus = dense_case(dmod, B, H, dtypes[dn], args.topk, args.page) if dmod and kv == "bf16" else float("nan")
                        rows.append(
                            dict(
                                kind="table",
                                kv=kv,
                                dtype=dn,
                                H=H,
                                B=B,
                                D=DV + args.rope,
                                sparse_us=us,
                                samples_us=samples,
                                floor_bytes=fb,
                                floor_us=fb / bw * 1e6,
                                pct_floor=100 * fb / (us * 1e-6) / bw,
                                achieved_TBps=fb / (us * 1e-6) / 1e12,
                                peer_us=pus,
                                dense_us=dus,
                                cfg=cfg,
                                limits=args.limits,
                            )
                        )
                        print(
                            f"  {kv} {dn} H={H} B={B}: sparse {us:.1f} us ({' '.join(f'{t:.1f}' for t in samples)}),"
                            f" peer {pus:.1f} us, dense {dus:.1f} us",
                            flush=True,
                        )
        results += rows
        bf16_at = {(r["dtype"], r["H"], r["B"]): r["sparse_us"] for r in rows if r["kv"] == "bf16"}
        print()
        print(
            f"copy bandwidth {bw / 1e12:.2f} TB/s (measured in this run); topk {args.topk}, page {args.page}, "
            f"CUDA-graph replay over caches of >= {bench_plan.SETS_L2_MULTIPLE}x L2 "
            f"({L2_BYTES / 2**20:.0f} MiB) per replay (fewer where {bench_plan.MAX_SETS} calls are less), "
            f"time per call; D {DV + args.rope}; configs for {args.limits}; sparse us = median of {args.repeat}"
        )
        hdr = (
            "| kv | dtype | heads | batch | kernel | config | splits | sparse us | min-max | floor us | % of floor "
            "| achieved TB/s | peer us | sparse/peer | vs bf16 | dense us | target |"
        )
        print(hdr)
        print("|---" * (hdr.count("|") - 1) + "|")
        for r in rows:
            bf = bf16_at.get((r["dtype"], r["H"], r["B"]))
            r["target"] = target(r, bf if r["kv"] != "bf16" else None)
            vs = f"{bf / r['sparse_us']:.2f}x" if bf and r["kv"] != "bf16" else "-"
            spread = f"{min(r['samples_us']):.1f}-{max(r['samples_us']):.1f}"
            print(
                f"| {r['kv']} | {r['dtype']} | {r['H']} | {r['B']} | {r['cfg'].get('kernel', 'generic')} "
                f"| {r['cfg']['name']} | {r['cfg']['num_splits']} | {r['sparse_us']:.1f} | {spread} "
                f"| {r['floor_us']:.1f} | {r['pct_floor']:.1f}% | {r['achieved_TBps']:.2f} | {r['peer_us']:.1f} "
                f"| {r['sparse_us'] / r['peer_us']:.2f} | {vs} | {r['dense_us']:.1f} | {r['target']} |"
            )
        print(
            "target (batch >= 32, heads 8/16): fp8 formats >= 60 % of their own floor and >= 1.5x faster than "
            "bf16; bf16 >= 70 % under --limits sm120 (60 % otherwise)"
        )
    kernels = [getattr(kmod, n) for n in dir(kmod) if n.startswith("_sparse_mla_stage")]
    if hasattr(kmod, "_fp8"):
        kernels.append(kmod._fp8._sparse_mla_stage1_8bit)
    try:
        mma = mma_kinds(kernels)
    except Exception as e:  # noqa: BLE001 -- triton's private caches moved: the table above stands
        mma = {"?": [f"not read: {type(e).__name__}: {e}"]}
    print(
        "MMA instructions in the compiled sparse kernels' PTX:",
        "; ".join(f"{n}: {'+'.join(k)}" for n, k in sorted(mma.items())) or "none compiled",
    )
    results.append(dict(kind="mma", limits=args.limits, kernels=mma))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
