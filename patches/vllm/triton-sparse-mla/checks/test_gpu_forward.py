"""GPU check (any CUDA GPU; run on an H200 here): the patched backend's index
conversion + the shipped Triton kernel, on a mixed decode/prefill batch with -1
padding, against a dense reference, eagerly and replayed from a CUDA graph; the
DeepSeek V3.2 / GLM-5 latent (512 + 64 rope, 16 heads) and rope-free MLA
(GLM-5.3-Flash: D = 512, 8 and 16 heads), each also with the launch config that
SM120's 99 KB of shared memory per program picks, forced.

Needs only torch + triton: the two pieces are loaded from the patched tree's
files without importing vLLM."""

from __future__ import annotations

import ast
import importlib.util
import pathlib

import pytest


def _load(tree: pathlib.Path):
    import torch

    src = (tree / "vllm/v1/attention/backends/mla/triton_mla_sparse.py").read_text()
    mod = ast.parse(src)
    fn = next(n for n in mod.body if isinstance(n, ast.FunctionDef) and n.name == "convert_req_index_to_global_slot")
    ns = {"torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "convert", "exec"), ns)
    spec = importlib.util.spec_from_file_location("tsm_kernel", tree / "vllm/v1/attention/ops/triton_sparse_mla.py")
    kernel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel)
    return ns["convert_req_index_to_global_slot"], kernel.sparse_mla_attention, kernel


@pytest.mark.gpu
@pytest.mark.parametrize("block_gap", [0, 8], ids=["adjacent-blocks", "strided-blocks"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("rope,heads", [(64, 16), (0, 8), (0, 16)], ids=["rope64-h16", "rope-free-h8", "rope-free-h16"])
@pytest.mark.parametrize("limits", ["device", "sm120"])
# page 1024: the kernel block GLM-5.3-Flash's layer group gets on 12.x (the kpool indexer's
# index_kpool * 64 tokens, shared with the MLA layer: test_glm5next_block_size.py).
@pytest.mark.parametrize("page", [64, 1024], ids=["page64", "page1024"])
def test_gpu_forward_and_cuda_graph(patched_tree, dtype_name, block_gap, rope, heads, limits, page):
    # block_gap > 0: the cache's blocks are not adjacent (vLLM 0.33 may put other layers' pages
    # between them; the backend hands the strided [blocks, block_size, D] view to the kernel).
    import torch

    convert, attn, kernel = _load(patched_tree)
    dtype = getattr(torch, dtype_name)
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    H, L, R, BS, TOPK = heads, 512, rope, page, 2048
    D = L + R
    seq_lens, q_lens = [3000, 700, 2500, 4100], [1, 1, 1, 37]
    T = sum(q_lens)
    per_req = -(-4160 // BS)  # blocks per request row (65 of 64, 5 of 1024)
    NB = 300 if BS == 64 else 24
    bt = torch.randperm(NB, generator=g)[: 4 * per_req].view(4, per_req).to(torch.int32)
    kv_full = (torch.randn(NB, BS + block_gap, D, generator=g) * 0.5).to(dtype)
    kv = kv_full[:, :BS]
    topk = torch.full((T, TOPK), -1, dtype=torch.int32)
    req = []
    row = 0
    for r, (s, n) in enumerate(zip(seq_lens, q_lens, strict=False)):
        for j in range(n):
            pos = s - n + j
            k = min(pos + 1, TOPK)
            topk[row, :k] = torch.randperm(pos + 1, generator=g)[:k].to(torch.int32)
            topk[row] = topk[row][torch.randperm(TOPK, generator=g)]
            req.append(r)
            row += 1
    q = torch.randn(T, H, D, generator=g).to(dtype)
    scale = D**-0.5
    # reference (fp32, CPU)
    ref = torch.empty(T, H, L)
    flat = kv.float().reshape(-1, D)  # a copy: row block * BS + offset
    for t in range(T):
        ids = topk[t][topk[t] >= 0].long()
        slots = bt[req[t]].long()[ids // BS] * BS + ids % BS
        kk = flat[slots]
        p = torch.softmax((q[t].float() @ kk.T) * scale, dim=-1)
        ref[t] = p @ kk[:, :L]
    q_d, kv_d, bt_d = q.to(dev), kv_full.to(dev)[:, :BS], bt.to(dev)
    cfg = {}
    if limits == "sm120":  # the config SM120 would pick (99 KB per program, 100 KB per SM), forced here
        sm120 = kernel._Limits(sms=188, smem_per_block=101376, smem_per_sm=102400)
        cfg = {"_config": kernel._pick_config(T, H, TOPK, sm120)}
        assert kernel._CONFIGS[cfg["_config"]["name"]].smem <= sm120.smem_per_block
    topk_d, req_d = topk.to(dev), torch.tensor(req, dtype=torch.int32, device=dev)
    out = attn(q_d, kv_d, convert(req_d, bt_d, topk_d, BS), scale, kv_lora_rank=L, **cfg)
    torch.cuda.synchronize()
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    err = (out.float().cpu() - ref).abs().max().item()
    assert err < tol, err
    # CUDA graph: capture convert + kernel, replay with new query values
    static_out = torch.empty(T, H, L, dtype=dtype, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        attn(q_d, kv_d, convert(req_d, bt_d, topk_d, BS), scale, kv_lora_rank=L, out=static_out, **cfg)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attn(q_d, kv_d, convert(req_d, bt_d, topk_d, BS), scale, kv_lora_rank=L, out=static_out, **cfg)
    static_out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    err_g = (static_out.float().cpu() - ref).abs().max().item()
    assert err_g < tol, err_g
    assert kv_d.stride(0) == (BS + block_gap) * D
    name = cfg["_config"]["name"] if cfg else "auto"
    print(
        f"{dtype_name} gap={block_gap} D={D} H={H} {limits} {name}: eager max_abs_err={err:.3e} "
        f"graph max_abs_err={err_g:.3e} on {torch.cuda.get_device_name()} cc={torch.cuda.get_device_capability()}"
    )
