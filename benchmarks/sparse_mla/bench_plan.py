"""Arguments and byte accounting of bench_decode.py (no torch, no GPU: tested on CPU).

Bytes a decode step must move (the floor): per row the gathered cache rows (topk of them,
unique per row) + q (H x D activations) + out (H x 512 activations). A cache row is

* bf16/fp16: (512 + rope) x 2 bytes (1152 at rope 64);
* fp8 (per-tensor e4m3): 512 + rope bytes (576);
* fp8_ds_mla: 512 e4m3 + 16 (4 fp32 tile scales) + 2 x rope (bf16) bytes (656; 528 rope-free).

One CUDA graph holds ``sets`` calls, each on its own rows of one cache, so the bytes a graph
replay reads are several times the L2 (SETS_L2_MULTIPLE) and no call finds its rows in L2.
"""

from __future__ import annotations

import argparse
import math

DV, ROPE = 512, 64
KV_FORMATS = ("bf16", "fp8", "fp8_ds_mla")
SETS_L2_MULTIPLE = 6
MAX_SETS = 256
# SM120 (RTX PRO 6000 Blackwell, RTX 50xx): the opt-in shared memory of one program and of one SM.
SM120_SMEM_PER_BLOCK, SM120_SMEM_PER_SM = 101376, 102400


def cache_row_bytes(kv: str, rope: int, act_bytes: int = 2) -> int:
    if kv == "bf16":
        return (DV + rope) * act_bytes
    if kv == "fp8":
        return DV + rope
    if kv == "fp8_ds_mla":
        return DV + 4 * (DV // 128) + 2 * rope
    raise ValueError(f"unknown kv format {kv!r} (one of {', '.join(KV_FORMATS)})")


def floor_bytes(batch: int, heads: int, topk: int, kv: str, rope: int, act_bytes: int = 2) -> int:
    """Bytes one decode step must read and write at the least."""
    return (
        batch * topk * cache_row_bytes(kv, rope, act_bytes)
        + batch * heads * (DV + rope) * act_bytes
        + batch * heads * DV * act_bytes
    )


def sets_for(cache_bytes_per_call: int, l2_bytes: int) -> int:
    """Calls per graph: enough that one replay reads SETS_L2_MULTIPLE x L2 of cache rows."""
    return max(2, min(MAX_SETS, math.ceil(SETS_L2_MULTIPLE * l2_bytes / max(1, cache_bytes_per_call))))


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _kv_list(text: str) -> list[str]:
    vals = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in vals if v not in KV_FORMATS]
    if not vals or bad:
        raise argparse.ArgumentTypeError(f"--kv takes {'|'.join(KV_FORMATS)} (comma-separated), got {text!r}")
    return vals


def build_parser(description: str = "") -> argparse.ArgumentParser:
    from pathlib import Path

    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dense-src",
        type=Path,
        default=None,
        help="triton_decode_attention.py of a vLLM release, by path (default: read from --dense-version)",
    )
    ap.add_argument("--dense-version", default="0.23.0", help="vLLM release whose dense kernel is timed")
    ap.add_argument("--no-dense", action="store_true", help="do not time vLLM's dense kernel")
    ap.add_argument("--index-url", default=None, help="package index (default: pip's configuration)")
    ap.add_argument(
        "--fetch-dense",
        type=Path,
        default=None,
        metavar="DIR",
        help="only write the dense kernel file of --dense-version into DIR (no GPU needed) and exit",
    )
    ap.add_argument(
        "--kernel",
        type=Path,
        default=None,
        help="the sparse kernel file to time (default: the shipped one; "
        "kernels/sparse_mla/next/triton_sparse_mla.py: the development kernel)",
    )
    ap.add_argument("--batches", type=_int_list, default=_int_list("1,8,32,64,128"))
    ap.add_argument("--heads", type=_int_list, default=_int_list("8,16"))
    ap.add_argument(
        "--dtypes",
        default="bf16",
        help="activation dtypes (q, out): fp16, bf16; 'fp8' is kept as an alias of --kv fp8 with bf16 q",
    )
    ap.add_argument(
        "--kv",
        type=_kv_list,
        default=None,
        help="cache formats to time: bf16 (the activation dtype), fp8 (per-tensor e4m3), fp8_ds_mla",
    )
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument(
        "--rope",
        type=int,
        default=ROPE,
        choices=(0, ROPE),
        help="rope width of the cache rows: 64 (D 576, DeepSeek V3.2 / GLM-5) or 0 (D 512, GLM-5.3-Flash)",
    )
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="time every sparse point N times (fresh inputs each); the table gives median and min-max",
    )
    ap.add_argument("--no-peer", action="store_true", help="do not time the plain-torch peer")
    ap.add_argument("--sweep", action="store_true", help="also sweep launch configs (bf16, or the 8-bit kernel's)")
    ap.add_argument("--sweep-batches", default="1,32,128")
    ap.add_argument("--sweep-configs", default=None, help='per heads, names from _CONFIGS: "8:a+b;64:c"')
    ap.add_argument(
        "--limits",
        choices=("device", "sm120"),
        default="device",
        help="choose configs and split counts for this GPU, or as on an SM120 part (99 KB per program, dots as mma.sync)",
    )
    ap.add_argument("--sm120-limits", action="store_true", help="the same as --limits sm120")
    ap.add_argument(
        "--plan", action="store_true", help="print the shapes, bytes and graph sizes as JSON and exit (no GPU needed)"
    )
    ap.add_argument(
        "--l2-mib", type=float, default=None, help="L2 size for --plan (default: 60, the H200's; on a GPU the device's own)"
    )
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    return ap


def parse_args(argv=None, description: str = "") -> argparse.Namespace:
    ap = build_parser(description)
    args = ap.parse_args(argv)
    if args.sm120_limits:
        args.limits = "sm120"
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("fp16", "bf16", "fp8")]
    if not dtypes or bad:
        ap.error(f"--dtypes takes fp16, bf16 (and the alias fp8), got {args.dtypes!r}")
    kv = list(args.kv) if args.kv else []
    if "fp8" in dtypes:  # the old spelling: bf16 q over an fp8 cache
        dtypes = [d for d in dtypes if d != "fp8"] or ["bf16"]
        kv = kv or ["fp8"]
        if "fp8" not in kv:
            kv.append("fp8")
    args.act_dtypes = dtypes
    args.kv = kv or ["bf16"]
    if args.topk <= 0 or args.page <= 0 or args.repeat <= 0:
        ap.error("--topk, --page and --repeat must be positive")
    return args


def plan(args: argparse.Namespace, l2_bytes: int) -> list[dict]:
    """Every point the table times: shape, bytes per call, calls per graph, bytes per replay."""
    rows = []
    for kv in args.kv:
        for dt in args.act_dtypes:
            for h in args.heads:
                for b in args.batches:
                    row = cache_row_bytes(kv, args.rope)
                    per_call = b * args.topk * row
                    sets = sets_for(per_call, l2_bytes)
                    rows.append(
                        dict(
                            kv=kv,
                            dtype=dt,
                            H=h,
                            B=b,
                            D=DV + args.rope,
                            topk=args.topk,
                            page=args.page,
                            row_bytes=row,
                            floor_bytes=floor_bytes(b, h, args.topk, kv, args.rope),
                            sets=sets,
                            cache_bytes_per_replay=sets * per_call,
                            l2_multiple=round(sets * per_call / l2_bytes, 2),
                        )
                    )
    return rows
