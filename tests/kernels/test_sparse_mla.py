"""Correctness tests for kernels/sparse_mla/triton_sparse_mla.py.

Without CUDA the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1,
set here before the kernel module is imported) on small shapes; the GLM-5
full-shape cases are marked ``gpu`` and skip without CUDA. With CUDA every case
runs on the GPU:

    TRITON_INTERPRET=1 python -m pytest tests/kernels/test_sparse_mla.py   # CPU
    python -m pytest tests/kernels/test_sparse_mla.py                      # GPU (+ full shapes)

Every check draws fresh random inputs, poisons the output with NaN first and
compares against a float64 reference.

Tolerances. Let u be the unit round-off of the activation dtype (fp16 2**-11,
bf16 2**-8). The kernel accumulates in fp32 (error ~1e-7, negligible); the
errors that matter are (a) rounding the softmax weights P to fp16/bf16 before
the P@V product (each weight off by <= u relative, independent signs, so they
partly cancel) and (b) rounding the output to fp16/bf16 (<= u relative per
element). So the relative error norm is about u (measured on CPU: fp16 2.5e-4,
bf16 4.7e-3) and we allow 4u (fp16 2.0e-3, bf16 1.6e-2); per element we allow
8u times the largest |ref| (the bound for an element is ~2u of its own size
plus cancellation in P@V, which is bounded by the row's value scale).
``test_tolerance_catches_padding_bug`` shows these bounds are tight enough to
catch a kernel that reads padded slots instead of skipping them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before the kernel module is imported (triton.jit reads it).
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton", reason="triton is not importable: sparse MLA kernel tests need it")

# SPARSE_MLA_KERNEL lets a mutation check point the tests at a deliberately broken copy.
_KERNEL = Path(
    os.environ.get("SPARSE_MLA_KERNEL") or Path(__file__).resolve().parents[2] / "kernels" / "sparse_mla" / "triton_sparse_mla.py"
)


def _load_kernel():
    spec = importlib.util.spec_from_file_location("triton_sparse_mla_under_test", _KERNEL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


kmod = _load_kernel()
sparse_mla_attention = kmod.sparse_mla_attention

DEV = "cuda" if HAS_CUDA else "cpu"
DV, ROPE = 512, 64
D = DV + ROPE
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
DTYPES = [torch.float16, torch.bfloat16]
HAS_FP8 = hasattr(torch, "float8_e4m3fn")
gpu = pytest.mark.skipif(not HAS_CUDA, reason="full GLM-5 shapes need a CUDA GPU")


# ---------------------------------------------------------------- helpers
def make_inputs(
    T,
    H,
    topk,
    dtype,
    *,
    block_size=16,
    n_blocks=None,
    seed=None,
    valid_counts=None,
    mid_padding=False,
    empty_rows=(),
    kv_dtype=None,
    rope=ROPE,
):
    """Random q / paged kv cache / top-k indices; rows DV + rope wide (rope 0: rope-free MLA).

    valid_counts[t] valid (unique) slots per row; the rest is -1. With
    mid_padding the -1 entries are scattered through the row instead of at its end.
    """
    D = DV + rope
    g = torch.Generator().manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))
    if n_blocks is None:
        n_blocks = max(4, (2 * topk) // block_size + 3)
    n_slots = n_blocks * block_size
    q = torch.randn(T, H, D, generator=g).to(dtype)
    kv = torch.randn(n_blocks, block_size, D, generator=g)
    if valid_counts is None:
        valid_counts = torch.randint(1, topk + 1, (T,), generator=g).tolist()
    idx = torch.full((T, topk), -1, dtype=torch.int32)
    perm = torch.randperm(n_slots, generator=g).to(torch.int32)
    for t in range(T):
        n = 0 if t in empty_rows else min(valid_counts[t], topk, n_slots)
        # a window of one random permutation: unique slots within the row
        start = int(torch.randint(0, n_slots, (1,), generator=g))
        slots = perm[(start + torch.arange(n)) % n_slots]
        if mid_padding:
            pos = torch.randperm(topk, generator=g)[:n]
            idx[t, pos] = slots
        else:
            idx[t, :n] = slots
    kv_scale = None
    if kv_dtype is not None:
        kv_scale = 0.05
        kv = (kv / kv_scale).to(kv_dtype)
    else:
        kv = kv.to(dtype)
    return q.to(DEV), kv.to(DEV), idx.to(DEV), kv_scale


def reference(q, kv, idx, sm_scale, kv_scale=None):
    """float64 reference: out [T,H,DV], lse [T,H] (natural log, -inf for empty rows)."""
    T = q.shape[0]
    flat = kv.reshape(-1, kv.shape[-1]).to(torch.float64)
    if kv_scale is not None:
        flat = flat * kv_scale
    valid = idx >= 0
    K = flat[idx.clamp_min(0).long()]  # [T, topk, D]
    s = torch.einsum("thd,tkd->thk", q.to(torch.float64), K) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    has = valid.any(dim=1)
    p = torch.exp(s - torch.where(has[:, None, None], lse[..., None], torch.zeros_like(lse[..., None])))
    p = torch.where(has[:, None, None], p, torch.zeros_like(p))
    out = torch.einsum("thk,tkd->thd", p, K[..., :DV])
    out[~has] = 0.0
    lse[~has] = float("-inf")
    assert T == out.shape[0]
    return out, lse


def errors(out, ref):
    o = out.to(torch.float64)
    rel = ((o - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    worst = ((o - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    return rel, worst


def assert_close(out, ref, dtype, what=""):
    assert not torch.isnan(out).any(), f"{what}: NaN left in output (unwritten or NaN produced)"
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    u = UNIT[dtype]
    rel, worst = errors(out, ref)
    assert rel <= 4 * u, f"{what}: relative error norm {rel:.3e} > {4 * u:.3e}"
    assert worst <= 8 * u, f"{what}: max abs error / max|ref| {worst:.3e} > {8 * u:.3e}"


def assert_lse(lse, ref_lse, what=""):
    assert not torch.isnan(lse).any(), f"{what}: NaN in lse"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), f"{what}: lse -inf pattern differs"
    # lse is computed in fp32 from fp32 scores of fp16/bf16 operands: absolute
    # error ~1e-5 for |scores| of a few units.
    err = (lse[~empty].double() - ref_lse[~empty]).abs().max().item() if (~empty).any() else 0.0
    assert err < 1e-3, f"{what}: lse max abs error {err:.3e}"


def run(q, kv, idx, sm_scale, out=None, cfg=None, kv_scale=None):
    if out is not None:
        out.fill_(float("nan"))
    kw = {"kv_scale": kv_scale} if kv_scale is not None else {}
    if cfg is not None:
        kw["_config"] = cfg
    return sparse_mla_attention(q, kv, idx, sm_scale, DV, out=out, return_lse=True, **kw)


# Launch variants: automatic choice, one split (single-kernel path), many splits.
CFGS = {"auto": None, "nosplit": {"num_splits": 1}, "split": {"num_splits": 64}}


# ---------------------------------------------------------------- small (CPU interpreter or GPU)
# heads 64 skips "auto" (on CPU it is the split path again) to keep the CPU run short.
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "heads,mode", [(8, m) for m in CFGS] + [(64, "nosplit"), (64, "split")] + ([(64, "auto")] if HAS_CUDA else [])
)
def test_ragged_padded_matches_reference(dtype, heads, mode):
    T, topk = 4, 136  # topk not a multiple of the 32/64-row tiles
    q, kv, idx, _ = make_inputs(T, heads, topk, dtype, valid_counts=[136, 1, 77, 0], empty_rows=(3,), mid_padding=True)
    idx[0, 5] = -1  # a hole in an otherwise full row
    sm_scale = 1.0 / (D**0.5)
    out = torch.empty(T, heads, DV, dtype=dtype, device=DEV)
    o, lse = run(q, kv, idx, sm_scale, out=out, cfg=CFGS[mode])
    assert o.data_ptr() == out.data_ptr()
    ref, ref_lse = reference(q, kv, idx, sm_scale)
    assert_close(o, ref, dtype, f"{mode}")
    assert torch.all(o[3] == 0), "all -1 row must output zeros"
    assert_lse(lse, ref_lse, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_noncontiguous_out_and_q(dtype):
    T, H, topk = 3, 8, 70
    q0, kv, idx, _ = make_inputs(T, H, topk, dtype)
    # q as a strided view (heads interleaved with other data)
    qbig = torch.randn(T, 2 * H, D + 8, device=DEV).to(dtype)
    q = qbig[:, 1::2, 4 : 4 + D]
    q.copy_(q0)
    # out: heads-major slice of a larger buffer with a stride-2 last dim
    big = torch.full((H + 2, T, 2 * DV), float("nan"), dtype=dtype, device=DEV)
    out = big[1 : H + 1, :, ::2].transpose(0, 1)
    assert not out.is_contiguous()
    for mode in ("nosplit", "split"):
        big.fill_(7.0)  # sentinel outside the view
        o, lse = sparse_mla_attention(q, kv, idx, 0.1, DV, out=out.fill_(float("nan")), return_lse=True, _config=CFGS[mode])
        ref, ref_lse = reference(q, kv, idx, 0.1)
        assert_close(o, ref, dtype, mode)
        assert_lse(lse, ref_lse, mode)
        assert torch.all(big[0] == 7.0) and torch.all(big[H + 1] == 7.0), "wrote outside the out view"
        assert torch.all(big[1 : H + 1, :, 1::2] == 7.0), "wrote into the gaps of the out view"


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_cache_blocks_not_back_to_back(dtype):
    """A cache whose blocks are not adjacent (a gap after every block): a slot id
    is then not a row number, and the kernel must split it into block and
    offset (the row-number shortcut is taken only for back-to-back blocks)."""
    T, H, topk, bs = 3, 8, 70, 16
    q, kv0, idx, _ = make_inputs(T, H, topk, dtype, block_size=bs)
    big = torch.full((kv0.shape[0], bs + 3, D), float("nan"), dtype=dtype, device=DEV)
    kv = big[:, :bs]
    kv.copy_(kv0)
    assert kv.stride(0) != bs * kv.stride(1)
    ref, ref_lse = reference(q, kv0, idx, 0.1)
    for mode in ("nosplit", "split"):
        o, lse = run(q, kv, idx, 0.1, out=torch.empty(T, H, DV, dtype=dtype, device=DEV), cfg=CFGS[mode])
        assert_close(o, ref, dtype, mode)
        assert_lse(lse, ref_lse, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("mode", ["nosplit", "split"])
def test_output_buffer_reuse(dtype, mode):
    """Second call with the same out must hold nothing of the first."""
    T, H, topk = 4, 16, 96
    out = torch.empty(T, H, DV, dtype=dtype, device=DEV)
    q1, kv1, idx1, _ = make_inputs(T, H, topk, dtype, valid_counts=[96] * T)
    o1, _ = sparse_mla_attention(q1, kv1, idx1, 0.08, DV, out=out, return_lse=True, _config=CFGS[mode])
    first = o1.clone()
    assert_close(first, reference(q1, kv1, idx1, 0.08)[0], dtype, "first call")
    # Second call: different inputs, rows 1 and 3 now empty, row 2 shorter.
    # No poisoning in between: this is the field scenario.
    q2, kv2, idx2, _ = make_inputs(T, H, topk, dtype, valid_counts=[96, 0, 9, 0], empty_rows=(1, 3))
    o2, lse2 = sparse_mla_attention(q2, kv2, idx2, 0.08, DV, out=out, return_lse=True, _config=CFGS[mode])
    ref2, ref_lse2 = reference(q2, kv2, idx2, 0.08)
    assert_close(o2, ref2, dtype, "second call")
    assert torch.all(o2[1] == 0) and torch.all(o2[3] == 0), "empty rows must be zeros, not the old values"
    assert_lse(lse2, ref_lse2, "second call")
    assert not torch.equal(o2, first)


def test_out_none_and_plain_return():
    T, H, topk = 2, 8, 40
    q, kv, idx, _ = make_inputs(T, H, topk, torch.float16)
    o = sparse_mla_attention(q, kv, idx, 0.1)  # kv_lora_rank default 512, no lse
    assert isinstance(o, torch.Tensor) and o.shape == (T, H, DV) and o.dtype == torch.float16
    assert_close(o, reference(q, kv, idx, 0.1)[0], torch.float16)


def test_tolerance_catches_padding_bug():
    """A kernel that read padded entries as slot 0 would fail assert_close."""
    dtype = torch.bfloat16  # the loosest tolerance
    T, H, topk = 3, 8, 64
    q, kv, idx, _ = make_inputs(T, H, topk, dtype, valid_counts=[60, 32, 50], mid_padding=True)
    o = sparse_mla_attention(q, kv, idx, 0.1, DV)
    ref_ok, _ = reference(q, kv, idx, 0.1)
    ref_bug, _ = reference(q, kv, torch.where(idx < 0, torch.zeros_like(idx), idx), 0.1)
    assert_close(o, ref_ok, dtype)
    with pytest.raises(AssertionError):
        assert_close(o, ref_bug, dtype)
    # and an output written for the wrong row would fail too
    with pytest.raises(AssertionError):
        assert_close(o.roll(1, dims=0), ref_ok, dtype)


@pytest.mark.skipif(not HAS_FP8, reason="torch has no float8_e4m3fn")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_fp8_kv_cache(dtype):
    T, H, topk = 3, 8, 80
    q, kv, idx, kv_scale = make_inputs(T, H, topk, dtype, kv_dtype=torch.float8_e4m3fn, empty_rows=(2,))
    for mode in ("nosplit", "split"):
        out = torch.empty(T, H, DV, dtype=dtype, device=DEV)
        o, lse = run(q, kv, idx, 0.1, out=out, cfg=CFGS[mode], kv_scale=kv_scale)
        ref, ref_lse = reference(q, kv, idx, 0.1, kv_scale=kv_scale)
        assert_close(o, ref, dtype, f"fp8 {mode}")
        assert_lse(lse, ref_lse, f"fp8 {mode}")


@pytest.mark.skipif(not HAS_FP8, reason="this torch has no float8_e4m3fn")
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("gapped", [False, True], ids=["blocks_back_to_back", "blocks_with_gaps"])
def test_fp8_kv_cache_word_kernel(dtype, gapped):
    """fp8 cache with 16-head blocks from 8 rows on: the kernel that reads the cache as
    16-bit words (even/odd dims as separate fp16 dots) -- ragged rows, holes, an empty
    row, split and single-kernel paths, and a cache whose blocks are not adjacent."""
    T, H, topk, bs = 9, 8, 80, 16
    q, kv0, idx, kv_scale = make_inputs(
        T,
        H,
        topk,
        dtype,
        block_size=bs,
        kv_dtype=torch.float8_e4m3fn,
        valid_counts=[80, 1, 33, 0, 80, 79, 2, 64, 40],
        empty_rows=(3,),
        mid_padding=True,
    )
    kv = kv0
    if gapped:
        big = torch.zeros((kv0.shape[0], bs + 2, D), dtype=kv0.dtype, device=DEV)
        kv = big[:, :bs]
        kv.copy_(kv0)
        assert kv.stride(0) != bs * kv.stride(1)
    assert kmod._fp8_words_apply(kv, 16, T, ROPE, ROPE)
    ref, ref_lse = reference(q, kv0, idx, 0.1, kv_scale=kv_scale)
    for mode in ("nosplit", "split"):
        out = torch.empty(T, H, DV, dtype=dtype, device=DEV)
        o, lse = run(q, kv, idx, 0.1, out=out, cfg=CFGS[mode], kv_scale=kv_scale)
        assert_close(o, ref, dtype, f"fp8 words {mode}")
        assert_lse(lse, ref_lse, f"fp8 words {mode}")
        assert torch.all(o[3] == 0)


@pytest.mark.skipif(not HAS_FP8, reason="this torch has no float8_e4m3fn")
@pytest.mark.parametrize("q_mul", [2.0**20, 2.0**-20], ids=["q_beyond_fp16_range", "tiny_q"])
@pytest.mark.parametrize("T", [2, 8], ids=["generic_kernel", "word_kernel"])
def test_fp8_kv_cache_q_outside_fp16_range(q_mul, T):
    """With an fp8 cache the dots may run in fp16: a bf16 q far beyond fp16's range (or far
    below its normal range) must still give the reference result, not inf/NaN or zeros."""
    H, topk, dtype = 8, 48, torch.bfloat16
    q, kv, idx, kv_scale = make_inputs(T, H, topk, dtype, kv_dtype=torch.float8_e4m3fn)
    q = (q.float() * q_mul).to(dtype)
    sm_scale = 0.1 / q_mul  # keeps the scores in the range of the unscaled case
    out = torch.empty(T, H, DV, dtype=dtype, device=DEV)
    o, lse = run(q, kv, idx, sm_scale, out=out, cfg=CFGS["split"], kv_scale=kv_scale)
    ref, ref_lse = reference(q, kv, idx, sm_scale, kv_scale=kv_scale)
    assert torch.isfinite(o).all()
    assert_close(o, ref, dtype, f"fp8, q x {q_mul}")
    assert_lse(lse, ref_lse, f"fp8, q x {q_mul}")


def test_rejects_bad_arguments():
    q, kv, idx, _ = make_inputs(2, 8, 16, torch.float16)
    with pytest.raises(ValueError):
        sparse_mla_attention(q, kv.to(torch.bfloat16), idx, 0.1)
    with pytest.raises(ValueError):
        sparse_mla_attention(q, kv, idx, 0.1, out=torch.empty(2, 8, 256, dtype=q.dtype, device=DEV))
    if HAS_FP8:
        with pytest.raises(ValueError):
            sparse_mla_attention(q, kv.to(torch.float8_e4m3fn), idx, 0.1)  # no kv_scale


# ---------------------------------------------------------------- full GLM-5 shapes (GPU)
GLM5_TOPK = 2048


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", [8, 64])
@pytest.mark.parametrize("T", [1, 37, 300])
def test_glm5_full_shapes(dtype, heads, T):
    """topk 2048, page 64, ragged rows (with holes and empty rows), reused out, lse."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    counts = torch.randint(1, GLM5_TOPK + 1, (T,), generator=g).tolist()
    counts[0] = GLM5_TOPK
    empty = (T - 1,) if T > 1 else ()
    q, kv, idx, _ = make_inputs(
        T,
        heads,
        GLM5_TOPK,
        dtype,
        block_size=64,
        n_blocks=T * 40 + 64,
        valid_counts=counts,
        mid_padding=(T % 2 == 1),
        empty_rows=empty,
    )
    sm_scale = 1.0 / (D**0.5)
    # out is a slice of a larger buffer (e.g. a [T, H, 2*DV] workspace)
    big = torch.empty(T, heads, 2 * DV, dtype=dtype, device=DEV)
    out = big[:, :, DV:]
    for mode in CFGS:
        o, lse = run(q, kv, idx, sm_scale, out=out, cfg=CFGS[mode])
        torch.cuda.synchronize()
        ref, ref_lse = reference(q, kv, idx, sm_scale)
        assert_close(o, ref, dtype, f"T={T} H={heads} {mode}")
        assert_lse(lse, ref_lse, mode)
    # reuse: same out, new inputs with shorter/empty rows, no poisoning
    q2, kv2, idx2, _ = make_inputs(
        T, heads, GLM5_TOPK, dtype, block_size=64, n_blocks=T * 40 + 64, valid_counts=[c // 3 for c in counts], empty_rows=(0,)
    )
    o2 = sparse_mla_attention(q2, kv2, idx2, sm_scale, DV, out=out)
    assert_close(o2, reference(q2, kv2, idx2, sm_scale)[0], dtype, "reuse")
    assert torch.all(o2[0] == 0)


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_FP8, reason="torch has no float8_e4m3fn")
@pytest.mark.parametrize("heads", [8, 64])
def test_glm5_fp8_full_shapes(heads):
    T, dtype = 33, torch.bfloat16
    q, kv, idx, kv_scale = make_inputs(
        T,
        heads,
        GLM5_TOPK,
        dtype,
        block_size=64,
        n_blocks=T * 40 + 64,
        kv_dtype=torch.float8_e4m3fn,
        mid_padding=True,
        empty_rows=(5,),
    )
    o, lse = run(q, kv, idx, 0.04, out=torch.empty(T, heads, DV, dtype=dtype, device=DEV), kv_scale=kv_scale)
    ref, ref_lse = reference(q, kv, idx, 0.04, kv_scale=kv_scale)
    assert_close(o, ref, dtype, "fp8")
    assert_lse(lse, ref_lse, "fp8")


@gpu
@pytest.mark.gpu
def test_cuda_graph_capture():
    """The backend runs decode under CUDA graphs: capture, replay with new data."""
    T, H, dtype = 8, 8, torch.bfloat16
    q, kv, idx, _ = make_inputs(T, H, GLM5_TOPK, dtype, block_size=64, n_blocks=T * 40 + 64)
    out = torch.empty(T, H, DV, dtype=dtype, device=DEV)
    sparse_mla_attention(q, kv, idx, 0.05, DV, out=out)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_attention(q, kv, idx, 0.05, DV, out=out)
    q2, kv2, idx2, _ = make_inputs(T, H, GLM5_TOPK, dtype, block_size=64, n_blocks=T * 40 + 64, empty_rows=(2,))
    q.copy_(q2)
    kv.copy_(kv2)
    idx.copy_(idx2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference(q, kv, idx, 0.05)[0], dtype, "graph replay")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(kmod._CONFIGS))
@pytest.mark.parametrize("heads", [8, 64])
def test_every_named_config(name, heads):
    """Every launch configuration the defaults or the benchmark sweep can pick, on
    ragged rows with holes and an empty row, with its own split rule and one split."""
    T, dtype = 6, torch.bfloat16
    q, kv, idx, _ = make_inputs(
        T,
        heads,
        GLM5_TOPK,
        dtype,
        block_size=64,
        n_blocks=T * 40 + 64,
        valid_counts=[GLM5_TOPK, 1, 700, 2047, 33, 0],
        mid_padding=True,
        empty_rows=(5,),
    )
    ref, ref_lse = reference(q, kv, idx, 0.04)
    cfg = kmod._config_dict(name, T, heads, GLM5_TOPK, q.device)
    for c in (cfg, dict(cfg, num_splits=1)):
        out = torch.empty(T, heads, DV, dtype=dtype, device=DEV)
        o, lse = run(q, kv, idx, 0.04, out=out, cfg=c)
        assert_close(o, ref, dtype, f"{name} {c}")
        assert_lse(lse, ref_lse, f"{name} {c}")
        assert torch.all(o[5] == 0)


# ---------------------------------------------------------------- launch configs vs device limits
# SM120 (RTX PRO 6000 / RTX 50xx): 99 KB of shared memory per program (the opt-in
# maximum Triton checks at launch), against 227 KB on an H200.
SM120 = kmod._Limits(sms=188, smem_per_block=101376, smem_per_sm=102400)
H200 = kmod._Limits(sms=132, smem_per_block=232448, smem_per_sm=233472)
ROWS = [1, 2, 3, 8, 31, 32, 64, 127, 128, 300]


@pytest.mark.parametrize("heads", [1, 8, 16, 20, 32, 64, 128])
def test_default_configs_fit_sm120_shared_memory(heads):
    for rows in ROWS:
        cfg = kmod._pick_config(rows, heads, GLM5_TOPK, SM120)
        assert kmod._CONFIGS[cfg["name"]].smem <= SM120.smem_per_block, (rows, heads, cfg)
        assert cfg["num_splits"] >= 1


def test_large_head_blocks_only_where_they_fit():
    """The H200 keeps the configs it was tuned with; SM120 never gets one that
    needs more than 99 KB (NOTES.md v6)."""
    assert kmod._pick_config(128, 64, GLM5_TOPK, H200)["name"] == "h64_n64_w8_s2"
    assert kmod._pick_config(32, 64, GLM5_TOPK, H200)["name"] == "h64_n32_w8_s3"
    assert kmod._pick_config(32, 32, GLM5_TOPK, H200)["name"] == "h32_n64_w8_s3"
    for rows in ROWS:
        for heads in (32, 64):
            assert kmod._pick_config(rows, heads, GLM5_TOPK, SM120)["block_h"] == 16
    # Fewer programs per SM where an SM has less shared memory: fewer splits.
    assert kmod._pick_config(32, 8, GLM5_TOPK, SM120)["num_splits"] < kmod._pick_config(32, 8, GLM5_TOPK, H200)["num_splits"]


@pytest.mark.parametrize(
    "name",
    sorted({kmod._pick_config(r, h, GLM5_TOPK, SM120)["name"] for r in ROWS for h in (8, 32, 64)} | set(kmod._SMALL_FALLBACKS)),
)
def test_sm120_configs_compile_within_99kb(name):
    """What the SM120 choice relies on, checked with the compiler: each config it
    can pick compiles for sm_120 within 99 KB and within its recorded size.
    (A separate process: the interpreter switch, set for this module on CPU, is
    also read while compiling.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compile_sizes.py")), str(_KERNEL), name, "120"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode == 3:  # the script's "cannot compile for this target here"
        pytest.skip(f"cannot compile for sm_120 here: {proc.stdout.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sizes = json.loads(proc.stdout)
    recorded = kmod._CONFIGS[name].smem
    assert max(sizes.values()) <= SM120.smem_per_block, (name, sizes)
    assert max(sizes.values()) <= recorded, (name, sizes, recorded)


# ---------------------------------------------------------------- rope-free MLA
# GLM-5.3-Flash (glm5_next): qk_rope_head_dim = 0, so D = kv_lora_rank = 512 and the
# kernel runs without its rope part (HAS_PE=False). 8 and 16 heads per GPU (TP 8 / TP 4).
ROPE_FREE_HEADS = [8, 16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", ROPE_FREE_HEADS)
@pytest.mark.parametrize("mode", sorted(CFGS))
def test_rope_free_matches_reference(dtype, heads, mode):
    T = 5
    q, kv, idx, _ = make_inputs(T, heads, 96, dtype, rope=0, mid_padding=True, empty_rows=(3,))
    assert q.shape[-1] == DV and kv.shape[-1] == DV
    sm_scale = 256**-0.5  # glm5_next: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)
    o, lse = run(q, kv, idx, sm_scale, out=torch.empty(T, heads, DV, dtype=dtype, device=DEV), cfg=CFGS[mode])
    ref, ref_lse = reference(q, kv, idx, sm_scale)
    assert_close(o, ref, dtype, f"rope-free H={heads} {mode}")
    assert_lse(lse, ref_lse, f"rope-free H={heads} {mode}")
    assert torch.all(o[3] == 0)


@pytest.mark.skipif(not HAS_FP8, reason="torch has no float8_e4m3fn")
@pytest.mark.parametrize("T", [2, 8], ids=["below_word_kernel_rows", "word_kernel_rows"])
def test_rope_free_fp8_kv_cache(T):
    """An fp8 e4m3 rope-free cache: the generic kernel at every batch (the 16-bit-word
    kernel needs a rope part of its own width)."""
    dtype = torch.bfloat16
    q, kv, idx, kv_scale = make_inputs(T, 8, 64, dtype, rope=0, kv_dtype=torch.float8_e4m3fn, mid_padding=True)
    o, lse = run(q, kv, idx, 0.06, out=torch.empty(T, 8, DV, dtype=dtype, device=DEV), kv_scale=kv_scale)
    ref, ref_lse = reference(q, kv, idx, 0.06, kv_scale=kv_scale)
    assert_close(o, ref, dtype, "rope-free fp8")
    assert_lse(lse, ref_lse, "rope-free fp8")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("heads", ROPE_FREE_HEADS)
@pytest.mark.parametrize("T", [1, 37, 300])
def test_rope_free_full_shapes(dtype, heads, T):
    """topk 2048, page 64, ragged rows with holes and an empty row: the automatic
    choice, one split, many splits, and the config SM120's 99 KB limit picks (forced)."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    counts = torch.randint(1, GLM5_TOPK + 1, (T,), generator=g).tolist()
    counts[0] = GLM5_TOPK
    empty = (T - 1,) if T > 1 else ()
    q, kv, idx, _ = make_inputs(
        T,
        heads,
        GLM5_TOPK,
        dtype,
        block_size=64,
        n_blocks=T * 40 + 64,
        rope=0,
        valid_counts=counts,
        mid_padding=(T % 2 == 1),
        empty_rows=empty,
    )
    sm_scale = 256**-0.5
    ref, ref_lse = reference(q, kv, idx, sm_scale)
    sm120 = kmod._pick_config(T, heads, GLM5_TOPK, SM120)
    assert kmod._CONFIGS[sm120["name"]].smem <= SM120.smem_per_block
    for mode, cfg in [*CFGS.items(), ("sm120", sm120)]:
        out = torch.empty(T, heads, DV, dtype=dtype, device=DEV)
        o, lse = run(q, kv, idx, sm_scale, out=out, cfg=cfg)
        torch.cuda.synchronize()
        assert_close(o, ref, dtype, f"rope-free T={T} H={heads} {mode}")
        assert_lse(lse, ref_lse, f"rope-free {mode}")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("heads", ROPE_FREE_HEADS)
@pytest.mark.parametrize("sm120_config", [False, True], ids=["auto_config", "sm120_config"])
def test_rope_free_cuda_graph_replay(heads, sm120_config):
    T, dtype = 8, torch.bfloat16
    q, kv, idx, _ = make_inputs(T, heads, GLM5_TOPK, dtype, block_size=64, n_blocks=T * 40 + 64, rope=0)
    cfg = kmod._pick_config(T, heads, GLM5_TOPK, SM120) if sm120_config else None
    kw = {"_config": cfg} if cfg else {}
    out = torch.empty(T, heads, DV, dtype=dtype, device=DEV)
    sparse_mla_attention(q, kv, idx, 0.0625, DV, out=out, **kw)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_attention(q, kv, idx, 0.0625, DV, out=out, **kw)
    q2, kv2, idx2, _ = make_inputs(T, heads, GLM5_TOPK, dtype, block_size=64, n_blocks=T * 40 + 64, rope=0, empty_rows=(2,))
    q.copy_(q2)
    kv.copy_(kv2)
    idx.copy_(idx2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference(q, kv, idx, 0.0625)[0], dtype, f"rope-free graph replay H={heads}")
    assert torch.all(out[2] == 0)
