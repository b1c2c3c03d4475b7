"""Runs in a fresh interpreter with one vLLM tree first on sys.path
(`python _dif_probe.py TREE`); prints `PROBE-RESULT {json}`. Calls the DeepGEMM
wrappers of `vllm.utils.deep_gemm` on CPU tensors with VLLM_DSA_INDEXER_FALLBACK=1
and compares them with an independent per-row reference."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile


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


def probe(tree: str) -> dict:
    sys.path.insert(0, tree)
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
    block_tables = torch.tensor(
        [[3, 7, 1, 0, 0], [9, 2, 5, 4, 8], [6, 0, 0, 0, 0]], dtype=torch.int32
    )
    cases = {}
    for next_n, two_d in ((1, False), (1, True), (2, False), (2, True)):
        lens = torch.tensor([37, 75, 9], dtype=torch.int32)
        qd = torch.randn(B, next_n, H, D).to(fp8)
        wd = torch.randn(B * next_n, H)
        if two_d:
            ctx = torch.stack(
                [lens - next_n + 1 + j for j in range(next_n)], dim=1
            ).to(torch.int32)
        else:
            ctx = lens
        sched = dg.get_paged_mqa_logits_metadata(ctx, bs, 8)
        got = paged(wrap(qd), kv_cache, wd, ctx, block_tables, sched, max_model_len,
                    clean_logits=False)
        ref = torch.full((B * next_n, max_model_len), float("-inf"), dtype=torch.float64)
        for b in range(B):
            for j in range(next_n):
                limit = int(lens[b]) - next_n + 1 + j
                for p in range(limit):
                    blk = int(block_tables[b, p // bs])
                    kk = kvals[blk, p % bs].double()
                    s = (qd[b, j].double() @ kk).clamp(min=0)
                    ref[b * next_n + j, p] = float(
                        (s * wd[b * next_n + j].double()).sum() * kscale[blk, p % bs]
                    )
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
    import vllm

    res["vllm_file"] = vllm.__file__
    return res


def run_probe(tree: pathlib.Path) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="dif-vllm-cache-"))
    r = subprocess.run(
        [sys.executable, __file__, str(tree)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=900,
    )
    for line in r.stdout.splitlines():
        if line.startswith("PROBE-RESULT "):
            res = json.loads(line[len("PROBE-RESULT "):])
            assert pathlib.Path(res["vllm_file"]).resolve().is_relative_to(tree.resolve())
            return res
    import pytest

    pytest.fail(f"probe failed (rc={r.returncode}):\n{r.stdout[-6000:]}")


if __name__ == "__main__":
    print("PROBE-RESULT " + json.dumps(probe(sys.argv[1])))
