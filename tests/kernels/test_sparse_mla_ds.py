"""The development kernel (kernels/sparse_mla/next/: not shipped, never run on a GPU) over vLLM's
``fp8_ds_mla`` cache (per token: 512 e4m3 latent bytes, 4 fp32 scales of 128-value tiles, 64 bf16
rope values; the rope-free variant without the rope part), against the float64 reference of the
values the cache holds.

CPU: Triton's interpreter on small shapes (set up by test_sparse_mla, imported here);
GPU: the same cases plus GLM-5 shapes and CUDA-graph replay. Cases are generated: seeds,
rope 64/0, fp16/bf16 q, each 8-bit config, ragged rows, holes, empty rows, tiles whose
scales differ by up to 2**20 within a row (so a kernel that applied one tile's scale to
another, or none, fails)."""

from __future__ import annotations

import next_kernel
import pytest
import test_sparse_mla as base  # noqa: I001 -- sets TRITON_INTERPRET before triton is imported
from ds_mla_cache import bytes_per_token, read_ds_mla, write_ds_mla

torch = base.torch
kmod = next_kernel.load()  # the shipped kernel has no fp8_ds_mla path
DEV, DV = base.DEV, base.DV
FP8_NAMES = sorted(kmod._fp8.FP8_CONFIGS)
pytestmark = pytest.mark.skipif(not base.HAS_FP8, reason="this torch has no float8_e4m3fn")


def ds_inputs(T, H, topk, dtype, rope, seed, *, block_size=16, tile_spread=True, **kw):
    """q, the fp8_ds_mla cache, indices, and the float values the cache holds."""
    q, kv, idx, _ = base.make_inputs(T, H, topk, dtype, block_size=block_size, seed=seed, rope=rope, **kw)
    rows = kv.float()
    if tile_spread:
        # Each 128-value latent tile of each row scaled by its own power of two in
        # [2**-10, 2**10]: the per-tile scales then differ by up to 2**20 inside a row.
        g = torch.Generator().manual_seed(seed)
        e = torch.randint(-10, 11, rows.shape[:-1] + (4,), generator=g).to(rows.device)
        mul = torch.pow(2.0, e.float()).repeat_interleave(128, -1)
        rows = torch.cat([rows[..., :DV] * mul, rows[..., DV:]], -1)
    cache = write_ds_mla(rows, rope, dtype)  # the rope part in the activations' dtype, as vLLM writes it
    return q, cache, idx, read_ds_mla(cache, rope, dtype)


def run_ds(q, cache, idx, sm_scale, cfg=None):
    out = torch.full((q.shape[0], q.shape[1], DV), float("nan"), dtype=q.dtype, device=DEV)
    kw = {"_config": cfg} if cfg else {}
    return kmod.sparse_mla_attention(q, cache, idx, sm_scale, DV, out=out, return_lse=True, kv_format="fp8_ds_mla", **kw)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("rope", [64, 0], ids=["d576", "d512_rope_free"])
@pytest.mark.parametrize("dtype", base.DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", FP8_NAMES)
def test_ds_mla_matches_reference(name, dtype, rope, seed):
    T, H, topk = 5, 8, 80
    q, cache, idx, vals = ds_inputs(T, H, topk, dtype, rope, seed, mid_padding=True, empty_rows=(2,))
    assert cache.shape[-1] == bytes_per_token(rope) == kmod._fp8.ds_mla_row_bytes(DV, rope)
    sm_scale = (DV + rope) ** -0.5
    ref, ref_lse = base.reference(q, vals, idx, sm_scale)
    for mode in ("nosplit", "split"):
        o, lse = run_ds(q, cache, idx, sm_scale, dict(next_kernel.fp8_cfg(name), **base.CFGS[mode]))
        base.assert_close(o, ref, dtype, f"ds_mla {name} rope {rope} {mode}")
        base.assert_lse(lse, ref_lse, f"ds_mla {name} rope {rope} {mode}")
        assert torch.all(o[2] == 0)


@pytest.mark.parametrize("rope", [64, 0], ids=["d576", "d512_rope_free"])
@pytest.mark.parametrize("T", [1, 3, 8])
def test_ds_mla_default_launch(T, rope):
    """The launcher's own choice (no _config) at 1, 3 and 8 rows; heads 16 and a block size of
    64 with blocks that are not adjacent (a gap of 3 rows after each block)."""
    H, topk, bs = 16, 96, 64
    q, cache0, idx, vals = ds_inputs(T, H, topk, torch.bfloat16, rope, 10 + T, block_size=bs)
    big = torch.zeros((cache0.shape[0], bs + 3, cache0.shape[-1]), dtype=torch.uint8, device=DEV)
    cache = big[:, :bs]
    cache.copy_(cache0)
    ref, ref_lse = base.reference(q, vals, idx, 0.05)
    o, lse = run_ds(q, cache, idx, 0.05)
    base.assert_close(o, ref, torch.bfloat16, f"ds_mla auto T={T}")
    base.assert_lse(lse, ref_lse, f"ds_mla auto T={T}")


@pytest.mark.parametrize("q_mul", [2.0**20, 2.0**-20], ids=["q_beyond_fp16_range", "tiny_q"])
@pytest.mark.parametrize("rope", [64, 0], ids=["d576", "d512_rope_free"])
def test_ds_mla_q_outside_fp16_range(q_mul, rope):
    """The latent dots run in fp16: a bf16 q far outside fp16's range still gives the reference."""
    dtype = torch.bfloat16
    q, cache, idx, vals = ds_inputs(4, 8, 48, dtype, rope, 7, tile_spread=False)
    q = (q.float() * q_mul).to(dtype)
    sm_scale = 0.1 / q_mul
    ref, ref_lse = base.reference(q, vals, idx, sm_scale)
    o, lse = run_ds(q, cache, idx, sm_scale, base.CFGS["split"])
    assert torch.isfinite(o).all()
    base.assert_close(o, ref, dtype, f"ds_mla q x {q_mul}")
    base.assert_lse(lse, ref_lse, f"ds_mla q x {q_mul}")


def test_ds_mla_tolerance_catches_a_wrong_scale():
    """The tolerances see a cache whose scales are read one tile off (what a kernel that mixed
    up the tiles would compute): the reference of that cache differs beyond them."""
    q, cache, idx, vals = ds_inputs(3, 8, 64, torch.bfloat16, 64, 3)
    wrong = cache.clone()
    sc = wrong[..., DV : DV + 16].clone().view(torch.float32)
    wrong[..., DV : DV + 16] = sc.roll(1, -1).contiguous().view(torch.uint8)
    ref, _ = base.reference(q, vals, idx, 0.05)
    o, _ = run_ds(q, wrong, idx, 0.05)
    with pytest.raises(AssertionError):
        base.assert_close(o, ref, torch.bfloat16)


BAD = {
    "float_cache": lambda c: c.float(),
    "row_655_bytes": lambda c: c[..., :655],
    "row_657_bytes": lambda c: torch.nn.functional.pad(c, (0, 1)),
    "row_bytes_strided": lambda c: torch.zeros(c.shape[0], c.shape[1], 2 * 656, dtype=torch.uint8, device=c.device)[..., ::2],
    "start_not_16_aligned": lambda c: torch.zeros(c.numel() + 8, dtype=torch.uint8, device=c.device)[8:].view(c.shape),
    "misaligned_row_stride": lambda c: torch.zeros(c.shape[0], c.shape[1], 657, dtype=torch.uint8, device=c.device)[..., :656],
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_ds_mla_rejects_bad_caches(bad):
    q, cache, idx, _ = ds_inputs(2, 8, 16, torch.bfloat16, 64, 5, tile_spread=False)
    with pytest.raises(ValueError, match="fp8_ds_mla"):
        run_ds(q, BAD[bad](cache), idx, 0.1)


@pytest.mark.parametrize("kv_lora_rank,rope_cols", [(256, 64), (512, 32)])
def test_ds_mla_rejects_other_geometries(kv_lora_rank, rope_cols):
    q = torch.zeros(2, 8, kv_lora_rank + rope_cols, dtype=torch.bfloat16, device=DEV)
    cache = torch.zeros(4, 16, kmod._fp8.ds_mla_row_bytes(kv_lora_rank, rope_cols), dtype=torch.uint8, device=DEV)
    with pytest.raises(ValueError, match="fp8_ds_mla needs kv_lora_rank 512"):
        kmod.sparse_mla_attention(
            q, cache, torch.zeros(2, 4, dtype=torch.int32, device=DEV), 0.1, kv_lora_rank, kv_format="fp8_ds_mla"
        )


def test_unknown_kv_format_is_rejected():
    q, cache, idx, _ = ds_inputs(2, 8, 16, torch.bfloat16, 64, 6, tile_spread=False)
    with pytest.raises(ValueError, match="kv_format"):
        kmod.sparse_mla_attention(q, cache, idx, 0.1, DV, kv_format="fp8_e5m2")


# ---------------------------------------------------------------- GPU only
@base.gpu
@pytest.mark.gpu
@pytest.mark.parametrize("rope", [64, 0], ids=["d576", "d512_rope_free"])
@pytest.mark.parametrize("heads", [8, 16])
@pytest.mark.parametrize("T", [1, 37, 128])
def test_ds_mla_glm5_shapes(T, heads, rope):
    q, cache, idx, vals = ds_inputs(T, heads, base.GLM5_TOPK, torch.bfloat16, rope, T, block_size=64, n_blocks=T * 40 + 64)
    ref, ref_lse = base.reference(q, vals, idx, 0.05)
    for cfg in (None, kmod.pick_launch(T, heads, base.GLM5_TOPK, base.SM120, "fp8_ds_mla", rope)):
        o, lse = run_ds(q, cache, idx, 0.05, cfg)
        base.assert_close(o, ref, torch.bfloat16, f"ds_mla T={T} H={heads} cfg={cfg}")
        base.assert_lse(lse, ref_lse, f"ds_mla T={T} H={heads}")


@base.gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("sm120_config", [False, True], ids=["auto_config", "sm120_config"])
def test_8bit_cuda_graph_replay(kv, sm120_config):
    """Decode runs under CUDA graphs: capture the 8-bit kernel, replay over new cache contents."""
    T, H, dtype = 8, 8, torch.bfloat16
    topk, nb = base.GLM5_TOPK, T * 40 + 64

    def draw(seed, **kw):
        if kv == "fp8":
            q, c, i, s = base.make_inputs(
                T, H, topk, dtype, block_size=64, n_blocks=nb, seed=seed, kv_dtype=torch.float8_e4m3fn, **kw
            )
            return q, c, i, c.float() * s, {"kv_scale": s}
        q, c, i, v = ds_inputs(T, H, topk, dtype, 64, seed, block_size=64, n_blocks=nb, **kw)
        return q, c, i, v, {"kv_format": "fp8_ds_mla"}

    q, cache, idx, _, kw = draw(1)
    if sm120_config:
        kw["_config"] = kmod.pick_launch(T, H, topk, base.SM120, kv)
    out = torch.empty(T, H, DV, dtype=dtype, device=DEV)
    kmod.sparse_mla_attention(q, cache, idx, 0.05, DV, out=out, **kw)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kmod.sparse_mla_attention(q, cache, idx, 0.05, DV, out=out, **kw)
    q2, cache2, idx2, vals2, _ = draw(2, empty_rows=(2,))
    q.copy_(q2)
    cache.copy_(cache2)
    idx.copy_(idx2)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    base.assert_close(out, base.reference(q, vals2, idx, 0.05)[0], dtype, f"{kv} graph replay")
    assert torch.all(out[2] == 0)
