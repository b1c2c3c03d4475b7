"""Tests of the development kernel kernels/sparse_mla/next/ (issue 35; not shipped, never run on a
GPU): every test of the shipped kernel (test_sparse_mla.py, which keeps testing the shipped file
as on main) re-run against next/, its 8-bit stage 1 over a per-tensor e4m3 cache, its launch
choice under SM120's limits and its configs compiled for sm_120. fp8_ds_mla: test_sparse_mla_ds.py.

Helpers (inputs, float64 reference, tolerances) are test_sparse_mla's; on CPU the kernel runs in
Triton's interpreter, on a GPU the full shapes run too (``gpu`` marks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import next_kernel
import pytest
import test_sparse_mla as base  # noqa: I001 -- sets TRITON_INTERPRET before triton is imported

torch = base.torch
nmod = next_kernel.load()
DEV, DV, D, ROPE = base.DEV, base.DV, base.D, base.ROPE
DTYPES, CFGS, GLM5_TOPK, ROWS = base.DTYPES, base.CFGS, base.GLM5_TOPK, base.ROWS
make_inputs, reference, assert_close, assert_lse = base.make_inputs, base.reference, base.assert_close, base.assert_lse
fp8_cfg = next_kernel.fp8_cfg
SM120 = nmod._Limits(*base.SM120)
H200 = nmod._Limits(*base.H200)
fp8_only = pytest.mark.skipif(not base.HAS_FP8, reason="this torch has no float8_e4m3fn")


def run(q, kv, idx, sm_scale, out=None, cfg=None, kv_scale=None):
    if out is not None:
        out.fill_(float("nan"))
    kw = {"kv_scale": kv_scale} if kv_scale is not None else {}
    if cfg is not None:
        kw["_config"] = cfg
    return nmod.sparse_mla_attention(q, kv, idx, sm_scale, DV, out=out, return_lse=True, **kw)


# ---------------------------------------------------------------- main's tests, against next/
# Every test of the shipped kernel (test_sparse_mla.py) runs again here with that module's
# kernel replaced by next/'s, except those next/ answers differently, re-written below:
REWRITTEN = {
    "test_fp8_kv_cache_word_kernel": "next/ has no 16-bit-word kernel: test_fp8_kv_cache_8bit_kernel",
    "test_fp8_kv_cache_q_outside_fp16_range": "the same cases; the 8-bit kernel where main's ids say word kernel",
    "test_rope_free_fp8_kv_cache": "the same cases; from 8 rows on the 8-bit kernel",
    "test_sm120_configs_compile_within_99kb": "next/'s configs, the 8-bit ones too, compiled from next/'s file",
}


@pytest.fixture(autouse=True)
def _next_kernel_in_base(monkeypatch):
    monkeypatch.setattr(base, "kmod", nmod)
    monkeypatch.setattr(base, "sparse_mla_attention", nmod.sparse_mla_attention)
    # the limits as next/'s own _Limits: the kernel tells them from a device by their class
    monkeypatch.setattr(base, "SM120", SM120)
    monkeypatch.setattr(base, "H200", H200)


for _name in dir(base):
    if _name.startswith("test_") and _name not in REWRITTEN:
        globals()[_name] = getattr(base, _name)


def test_every_test_of_the_shipped_kernel_runs_against_next():
    shipped = {n for n in dir(base) if n.startswith("test_")}
    assert set(REWRITTEN) <= shipped  # a renamed test of main would otherwise drop out silently
    assert all(globals()[n] is getattr(base, n) for n in shipped - set(REWRITTEN))


# ---------------------------------------------------------------- the 8-bit kernel, per-tensor e4m3
@fp8_only
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("gapped", [False, True], ids=["blocks_back_to_back", "blocks_with_gaps"])
@pytest.mark.parametrize("name", sorted(nmod._fp8.FP8_CONFIGS))
def test_fp8_kv_cache_8bit_kernel(dtype, gapped, name):
    """Per-tensor fp8 cache from 8 rows on: the 8-bit kernel (one byte per element, four
    128-wide latent tiles) under each of its configs -- ragged rows, holes, an empty row,
    split and single-kernel paths, and a cache whose blocks are not adjacent."""
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
    assert nmod.pick_launch(T, H, topk, SM120, "fp8")["kernel"] == "8bit"
    ref, ref_lse = reference(q, kv0, idx, 0.1, kv_scale=kv_scale)
    for mode in ("nosplit", "split"):
        out = torch.empty(T, H, DV, dtype=dtype, device=DEV)
        o, lse = run(q, kv, idx, 0.1, out=out, cfg=dict(fp8_cfg(name), **CFGS[mode]), kv_scale=kv_scale)
        assert_close(o, ref, dtype, f"fp8 8-bit {name} {mode}")
        assert_lse(lse, ref_lse, f"fp8 8-bit {name} {mode}")
        assert torch.all(o[3] == 0)


@fp8_only
@pytest.mark.parametrize("q_mul", [2.0**20, 2.0**-20], ids=["q_beyond_fp16_range", "tiny_q"])
@pytest.mark.parametrize("T", [2, 8], ids=["generic_kernel", "8bit_kernel"])
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


@fp8_only
@pytest.mark.parametrize("T", [2, 8], ids=["below_8bit_kernel_rows", "8bit_kernel_rows"])
def test_rope_free_fp8_kv_cache(T):
    """An fp8 e4m3 rope-free cache: the generic kernel below 8 rows, the 8-bit one (no rope
    part) from 8 rows on."""
    dtype = torch.bfloat16
    q, kv, idx, kv_scale = make_inputs(T, 8, 64, dtype, rope=0, kv_dtype=torch.float8_e4m3fn, mid_padding=True)
    o, lse = run(q, kv, idx, 0.06, out=torch.empty(T, 8, DV, dtype=dtype, device=DEV), kv_scale=kv_scale)
    ref, ref_lse = reference(q, kv, idx, 0.06, kv_scale=kv_scale)
    assert_close(o, ref, dtype, "rope-free fp8")
    assert_lse(lse, ref_lse, "rope-free fp8")


# ---------------------------------------------------------------- launch configs vs SM120's limits
@pytest.mark.parametrize("kv", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("heads", [1, 8, 16, 32, 64, 128])
def test_8bit_launch_fits_sm120(kv, heads):
    """Every 8-bit launch SM120 can get fits its 99 KB; fp8_ds_mla always runs the 8-bit kernel,
    per-tensor fp8 from 8 rows on; the split count respects the shared memory per SM."""
    for rows in ROWS:
        for rope in (0, 64):
            cfg = nmod.pick_launch(rows, heads, GLM5_TOPK, SM120, kv, rope)
            if cfg["kernel"] == "generic":
                assert kv == "fp8" and rows < nmod._FP8_KERNEL_MIN_ROWS, (rows, heads, cfg)
                continue
            c = nmod._fp8.FP8_CONFIGS[cfg["name"]]
            assert 0 < c.smem <= SM120.smem_per_block, cfg
            assert cfg["num_splits"] >= 1 and cfg["block_h"] == 16


@pytest.mark.parametrize(
    "name",
    sorted(
        {nmod._pick_config(r, h, GLM5_TOPK, SM120)["name"] for r in ROWS for h in (8, 32, 64)}
        | set(nmod._SMALL_FALLBACKS)
        | {
            nmod.pick_launch(r, h, GLM5_TOPK, SM120, kv, rope)["name"]
            for r in ROWS
            for h in (8, 16)
            for kv in ("fp8", "fp8_ds_mla")
            for rope in (0, 64)
        }
        | set(nmod._fp8.FP8_PREFERRED)
    ),
)
def test_sm120_configs_compile_within_99kb(name):
    """What next/'s SM120 choice relies on, checked with the compiler: each config it can pick
    (bf16 and 8-bit) compiles for sm_120 within 99 KB and within its recorded size.
    (A separate process: the interpreter switch, set on CPU, is also read while compiling.)"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compile_sizes.py")), str(next_kernel.NEXT_KERNEL), name, "120"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode == 3:  # the script's "cannot compile for this target here"
        pytest.skip(f"cannot compile for sm_120 here: {proc.stdout.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    sizes = json.loads(proc.stdout)
    recorded = (nmod._CONFIGS.get(name) or nmod._fp8.FP8_CONFIGS[name]).smem
    assert max(sizes.values()) <= SM120.smem_per_block, (name, sizes)
    assert max(sizes.values()) <= recorded, (name, sizes, recorded)
