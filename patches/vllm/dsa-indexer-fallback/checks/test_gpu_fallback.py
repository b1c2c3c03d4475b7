"""GPU check (run on an H200 here): the fallback logits run on CUDA, are
capturable in a CUDA graph (sync-free), and match a plain einsum reference.
Loads the fallback module from the patched tree by path (torch only)."""
from __future__ import annotations

import importlib.util

import pytest


@pytest.mark.gpu
def test_gpu_fallback_logits_and_cuda_graph(patched_tree):
    import torch

    spec = importlib.util.spec_from_file_location(
        "dif", patched_tree / "vllm/v1/attention/ops/dsa_indexer_fallback.py"
    )
    f = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(f)
    dev, fp8 = "cuda", torch.float8_e4m3fn
    torch.manual_seed(0)
    B, n, H, D, bs, NB, MML = 8, 1, 64, 128, 64, 400, 16384
    vals = torch.randn(NB, bs, D, device=dev).to(fp8)
    sc = torch.rand(NB, bs, device=dev) + 0.5
    raw = torch.empty(NB, bs * (D + 4), dtype=torch.uint8, device=dev)
    raw[:, : bs * D] = vals.reshape(NB, -1).view(torch.uint8)
    raw[:, bs * D :] = sc.view(torch.uint8).reshape(NB, -1)
    kv = raw.view(NB, bs, 1, D + 4)
    bt = torch.randint(0, NB, (B, MML // bs), dtype=torch.int32, device=dev)
    q = torch.randn(B, n, H, D, device=dev).to(fp8)
    w = torch.randn(B * n, H, device=dev)
    cl = torch.randint(1, MML, (B,), dtype=torch.int32, device=dev)
    eager = f.fp8_paged_mqa_logits_fallback(q, kv, w, cl, bt, MML)
    # reference: gather every row's keys explicitly
    for b in range(B):
        L = int(cl[b])
        pos = torch.arange(L, device=dev)
        blk = bt[b].long()[pos // bs]
        k = vals[blk, pos % bs].float()
        s = (q[b, 0].float() @ k.T).relu() * w[b][:, None]
        ref = s.sum(0) * sc[blk, pos % bs]
        torch.testing.assert_close(eager[b, :L], ref, rtol=1e-4, atol=1e-3)
        assert torch.isinf(eager[b, L:]).all()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f.fp8_paged_mqa_logits_fallback(q, kv, w, cl, bt, MML)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = f.fp8_paged_mqa_logits_fallback(q, kv, w, cl, bt, MML)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    # prefill
    M, N = 300, 5000
    qp = torch.randn(M, H, D, device=dev).to(fp8)
    k = torch.randn(N, D, device=dev).to(fp8)
    ks = torch.rand(N, device=dev) + 0.5
    wp = torch.randn(M, H, device=dev)
    lo = torch.randint(0, N // 2, (M,), dtype=torch.int32, device=dev)
    hi = lo + torch.randint(1, N // 2, (M,), dtype=torch.int32, device=dev)
    got = f.fp8_mqa_logits_fallback(qp, (k, ks), wp, lo, hi)
    ref = (torch.einsum("mhd,nd->mhn", qp.float(), k.float()).relu() * wp[:, :, None]).sum(1)
    ref = ref * ks[None]
    ar = torch.arange(N, device=dev)
    m = (ar[None] >= lo[:, None]) & (ar[None] < hi[:, None])
    assert torch.equal(torch.isfinite(got), m)
    torch.testing.assert_close(got[m], ref[m], rtol=1e-4, atol=1e-3)
