"""Runs in a fresh interpreter with one vLLM tree first on sys.path
(`python _dif_probe.py TREE MODE`; checks call run()); reports one result (checklib.probe).

MODE `fallback`: calls the DeepGEMM wrappers of `vllm.utils.deep_gemm` on CPU tensors with
VLLM_DSA_INDEXER_FALLBACK=1 and compares them with an independent per-row reference.

MODE `wrapper`: calls the prefill wrapper once with VLLM_DSA_INDEXER_FALLBACK=1 and reports
what it did: "ran", or the RuntimeError it raised (the pristine release has no fallback).
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile

from checklib import probe


def _ref_prefill(q, k, ks, w, lo, hi):
    M, H, D = q.shape
    N = k.shape[0]
    out = [[float("-inf")] * N for _ in range(M)]
    qf, kf = q.double(), k.double()
    for m in range(M):
        for n in range(int(lo[m]), int(hi[m])):
            s = (qf[m] @ kf[n]).clamp(min=0)  # [H]
            out[m][n] = float((s * w[m].double()).sum() * ks[n])
    return out


def probe_fallback() -> dict:
    os.environ["VLLM_DSA_INDEXER_FALLBACK"] = "1"
    import torch
    import vllm.utils.deep_gemm as dg

    torch.manual_seed(0)
    fp8 = torch.float8_e4m3fn
    fp4_api = hasattr(dg, "fp8_fp4_mqa_logits")
    mqa = dg.fp8_fp4_mqa_logits if fp4_api else dg.fp8_mqa_logits
    paged = dg.fp8_fp4_paged_mqa_logits if fp4_api else dg.fp8_paged_mqa_logits
    wrap = (lambda x: (x, None)) if fp4_api else (lambda x: x)
    res: dict = {"fp4_api": fp4_api}

    # ---- prefill: fp8_mqa_logits
    M, N, H, D = 5, 23, 4, 32
    q = torch.randn(M, H, D).to(fp8)
    k = torch.randn(N, D).to(fp8)
    ks = torch.rand(N) + 0.5
    w = torch.randn(M, H)
    lo = torch.tensor([0, 0, 3, 5, 10], dtype=torch.int32)
    hi = torch.tensor([1, 7, 12, 23, 23], dtype=torch.int32)
    try:
        got = mqa(wrap(q), (k, ks), w, lo, hi, clean_logits=False)
        ref = torch.tensor(_ref_prefill(q, k, ks, w, lo, hi), dtype=torch.float64)
        fin = torch.isfinite(ref)
        res["prefill"] = {
            "ok": True,
            "shape": list(got.shape),
            "inf_pattern_equal": bool(torch.equal(torch.isfinite(got), fin)),
            "max_abs_err": float((got.double()[fin] - ref[fin]).abs().max()),
        }
    except Exception as e:  # noqa: BLE001
        res["prefill"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}

    # ---- decode: fp8_paged_mqa_logits, DeepGEMM block layout
    B, bs, nblocks, max_model_len = 3, 16, 10, 80
    kvals = torch.randn(nblocks, bs, D).to(fp8)
    kscale = torch.rand(nblocks, bs) + 0.5
    raw = torch.empty(nblocks, bs * (D + 4), dtype=torch.uint8)
    raw[:, : bs * D] = kvals.reshape(nblocks, -1).view(torch.uint8)
    raw[:, bs * D :] = kscale.reshape(nblocks, -1).view(torch.uint8).reshape(nblocks, -1)
    kv_cache = raw.view(nblocks, bs, 1, D + 4)
    block_tables = torch.tensor([[3, 7, 1, 0, 0], [9, 2, 5, 4, 8], [6, 0, 0, 0, 0]], dtype=torch.int32)
    cases = {}
    for next_n, two_d in ((1, False), (1, True), (2, False), (2, True)):
        lens = torch.tensor([37, 75, 9], dtype=torch.int32)
        qd = torch.randn(B, next_n, H, D).to(fp8)
        wd = torch.randn(B * next_n, H)
        if two_d:
            ctx = torch.stack([lens - next_n + 1 + j for j in range(next_n)], dim=1).to(torch.int32)
        else:
            ctx = lens
        sched = dg.get_paged_mqa_logits_metadata(ctx, bs, 8)
        got = paged(wrap(qd), kv_cache, wd, ctx, block_tables, sched, max_model_len, clean_logits=False)
        ref = torch.full((B * next_n, max_model_len), float("-inf"), dtype=torch.float64)
        for b in range(B):
            for j in range(next_n):
                limit = int(lens[b]) - next_n + 1 + j
                for p in range(limit):
                    blk = int(block_tables[b, p // bs])
                    kk = kvals[blk, p % bs].double()
                    s = (qd[b, j].double() @ kk).clamp(min=0)
                    ref[b * next_n + j, p] = float((s * wd[b * next_n + j].double()).sum() * kscale[blk, p % bs])
        fin = torch.isfinite(ref)
        cases[f"next_n={next_n},2d={two_d}"] = {
            "shape": list(got.shape),
            "sched_shape": list(sched.shape),
            "inf_pattern_equal": bool(torch.equal(torch.isfinite(got), fin)),
            "max_abs_err": float((got.double()[fin] - ref[fin]).abs().max()),
        }
    res["paged"] = cases

    from vllm.v1.attention.ops import dsa_indexer_fallback as f

    os.environ["VLLM_DSA_INDEXER_FALLBACK"] = "0"
    res["env0_off"] = f.use_indexer_fallback() is False
    os.environ.pop("VLLM_DSA_INDEXER_FALLBACK")
    res["cpu_platform_off"] = f.use_indexer_fallback() is False
    return res


def probe_wrapper() -> dict:
    import torch
    import vllm.utils.deep_gemm as dg

    f = getattr(dg, "fp8_fp4_mqa_logits", None) or dg.fp8_mqa_logits
    try:
        f(
            torch.zeros(1, 1, 8),
            (torch.zeros(1, 8), torch.ones(1)),
            torch.ones(1, 1),
            torch.zeros(1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32),
            clean_logits=False,
        )
        return {"wrapper": "ran"}
    except RuntimeError as e:
        return {"wrapper": str(e)}


def run(tree: pathlib.Path, mode: str, extra_env: dict | None = None) -> dict:
    """This probe in MODE against `tree` (checklib.probe), vLLM imported from the tree."""
    env = {
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT") or tempfile.mkdtemp(prefix="dif-vllm-cache-"),
        **(extra_env or {}),
    }
    res = probe.run_probe(tree, __file__, mode, env=env)
    probe.assert_imported_from(res, "vllm_file", tree)
    return res


def main() -> None:
    tree, mode = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    res = probe_fallback() if mode == "fallback" else probe_wrapper()
    import vllm

    res["vllm_file"] = vllm.__file__
    probe.emit(res)


if __name__ == "__main__":
    main()
