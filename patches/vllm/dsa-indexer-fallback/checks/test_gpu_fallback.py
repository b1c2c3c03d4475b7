"""GPU check (run on an H200 here): the fallback logits run on CUDA, are
capturable in a CUDA graph (sync-free), and match a plain einsum reference.
Loads the fallback module from the patched tree by path (torch only)."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.mark.gpu
def test_gpu_fallback_logits_and_cuda_graph(patched_tree):
    import torch

    spec = importlib.util.spec_from_file_location("dif", patched_tree / "vllm/v1/attention/ops/dsa_indexer_fallback.py")
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


def _load_with_platform(patched_tree, capability):
    """The fallback module with `vllm.platforms.current_platform` a CUDA platform of the given
    capability that enables DeepGEMM (vLLM 0.24 on 12.x); torch only, no vLLM install."""
    import logging
    import sys
    import types

    class Platform:
        def is_cuda(self):
            return True

        def is_device_capability(self, cap):
            return capability[0] * 10 + capability[1] == cap

        def is_device_capability_family(self, cap):
            return capability[0] * 10 == cap // 10 * 10

        def support_deep_gemm(self):
            return True

    mods = {
        "vllm": types.ModuleType("vllm"),
        "vllm.platforms": types.ModuleType("vllm.platforms"),
        "vllm.logger": types.ModuleType("vllm.logger"),
        "vllm.utils": types.ModuleType("vllm.utils"),
        "vllm.utils.import_utils": types.ModuleType("vllm.utils.import_utils"),
    }
    mods["vllm.platforms"].current_platform = Platform()
    mods["vllm.logger"].init_logger = logging.getLogger
    mods["vllm.utils.import_utils"].has_deep_gemm = lambda: True
    saved = {name: sys.modules.get(name) for name in mods}
    sys.modules.update(mods)
    spec = importlib.util.spec_from_file_location("dif_refusal", patched_tree / "vllm/v1/attention/ops/dsa_indexer_fallback.py")
    f = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(f)
    return f, saved


@pytest.mark.gpu
def test_gpu_refusal_inside_cuda_graph_capture(patched_tree, monkeypatch):
    """A DeepGEMM refusal met while a CUDA graph is captured (the first indexer call on SM120 can
    come in vLLM's capture): on_refusal switches to the fallback inside the capture, and the
    replayed graph gives the eager fallback's logits. The refusal is raised as DeepGEMM's is:
    a RuntimeError from the host after it allocated its output, before any launch."""
    import sys

    import torch

    monkeypatch.delenv("VLLM_DSA_INDEXER_FALLBACK", raising=False)
    f, saved = _load_with_platform(patched_tree, (12, 0))
    try:
        dev, fp8 = "cuda", torch.float8_e4m3fn
        torch.manual_seed(0)
        B, H, D, bs, NB, MML = 4, 32, 128, 64, 64, 2048
        vals = torch.randn(NB, bs, D, device=dev).to(fp8)
        sc = torch.rand(NB, bs, device=dev) + 0.5
        raw = torch.empty(NB, bs * (D + 4), dtype=torch.uint8, device=dev)
        raw[:, : bs * D] = vals.reshape(NB, -1).view(torch.uint8)
        raw[:, bs * D :] = sc.view(torch.uint8).reshape(NB, -1)
        kv = raw.view(NB, bs, 1, D + 4)
        bt = torch.randint(0, NB, (B, MML // bs), dtype=torch.int32, device=dev)
        q = torch.randn(B, 1, H, D, device=dev).to(fp8)
        w = torch.randn(B, H, device=dev)
        cl = torch.randint(1, MML, (B,), dtype=torch.int32, device=dev)
        asked = []

        def paged(q, kv, w, cl, bt, mml):  # vllm.utils.deep_gemm's wrapper, patched
            if f.use_indexer_fallback():
                return f.fp8_paged_mqa_logits_fallback(q, kv, w, cl, bt, mml)
            asked.append(1)
            torch.empty(B, mml, device=dev)  # DeepGEMM allocates its logits, then refuses
            raise RuntimeError("Assertion error (csrc/apis/attention.hpp:376): Unsupported architecture")

        guarded = f.on_refusal(paged)
        assert f.use_indexer_fallback() is False  # DeepGEMM is trusted until it refuses
        eager = f.fp8_paged_mqa_logits_fallback(q, kv, w, cl, bt, MML)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f.fp8_paged_mqa_logits_fallback(q, kv, w, cl, bt, MML)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = guarded(q, kv, w, cl, bt, MML)
        assert asked == [1] and f.use_indexer_fallback() is True
        out.fill_(0)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        guarded(q, kv, w, cl, bt, MML)
        assert asked == [1]  # not asked again
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
