"""Caches in the three formats bench_decode.py times, and the plain-torch peer it compares
with: gather the top-k rows, dequantise them (fp8: the per-tensor scale; fp8_ds_mla: the
per-128-tile fp32 scales, the 16-bit rope part as it is), then two batched matmuls and a
softmax. torch only, any device (the peer's maths is checked on CPU against the kernel
tests' float64 reference)."""

from __future__ import annotations

import torch

DV = 512
TILE = 128


def write_ds_mla(rows: torch.Tensor, rope: int, rope_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """float rows [..., 512 + rope] -> uint8 fp8_ds_mla rows, laid out as vLLM's
    concat_and_cache_ds_mla writes them: e4m3 of each 128-value tile / (max|x| / 448), the
    4 fp32 scales, the rope part in the activations' 16-bit dtype (rope_dtype)."""
    lead = rows.shape[:-1]
    lat = rows[..., :DV].float().reshape(*lead, DV // TILE, TILE)
    scale = (lat.abs().amax(-1) / 448.0).clamp_min(torch.finfo(torch.float32).tiny)
    parts = [
        (lat / scale[..., None]).to(torch.float8_e4m3fn).reshape(*lead, DV).view(torch.uint8),
        scale.contiguous().view(torch.uint8).reshape(*lead, 4 * (DV // TILE)),
    ]
    if rope:
        parts.append(rows[..., DV:].to(rope_dtype).contiguous().view(torch.uint8).reshape(*lead, 2 * rope))
    return torch.cat(parts, -1).contiguous()


def make_cache(kv: str, n_blocks: int, page: int, rope: int, act_dtype: torch.dtype, device) -> tuple:
    """(cache, kernel keyword arguments) for kv bf16 (the activation dtype), fp8 or fp8_ds_mla."""
    d = DV + rope
    if kv == "bf16":
        return torch.randn(n_blocks, page, d, device=device, dtype=act_dtype), {}
    if kv == "fp8":
        # values * 8 in e4m3, scale 1/8: the same distribution as the bf16 cache
        return (torch.randn(n_blocks, page, d, device=device) * 8).to(torch.float8_e4m3fn), {"kv_scale": 0.125}
    if kv == "fp8_ds_mla":
        # written in chunks of blocks: a float copy of a cache several times L2 would not fit beside it
        out = torch.empty(n_blocks, page, DV + 16 + 2 * rope, dtype=torch.uint8, device=device)
        step = max(1, (64 << 20) // (page * d * 4))
        for b0 in range(0, n_blocks, step):
            b1 = min(n_blocks, b0 + step)
            out[b0:b1] = write_ds_mla(torch.randn(b1 - b0, page, d, device=device), rope, act_dtype)
        return out, {"kv_format": "fp8_ds_mla"}
    raise ValueError(f"unknown kv format {kv!r}")


def dequant_rows(rows: torch.Tensor, kv: str, rope: int, dtype: torch.dtype, kv_scale: float | None = None):
    """Gathered cache rows [..., R] in the cache's format -> [..., 512 + rope] in dtype."""
    if kv == "bf16":
        return rows.to(dtype)
    if kv == "fp8":
        return (rows.to(torch.float32) * kv_scale).to(dtype)
    if kv == "fp8_ds_mla":
        lead = rows.shape[:-1]
        lat = rows[..., :DV].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
        scales = rows[..., DV : DV + 16].contiguous().view(torch.float32)
        lat = (lat.reshape(*lead, DV // TILE, TILE) * scales[..., None]).reshape(*lead, DV)
        parts = [lat.to(dtype)]
        if rope:
            parts.append(rows[..., DV + 16 :].contiguous().view(dtype))  # the activations' dtype
        return torch.cat(parts, -1)
    raise ValueError(f"unknown kv format {kv!r}")


def peer_forward(
    q: torch.Tensor, cache: torch.Tensor, idx: torch.Tensor, sm_scale: float, kv: str, rope: int, kv_scale: float | None = None
) -> torch.Tensor:
    """The plain-torch sparse MLA decode: q [B, H, D], idx [B, topk] (negative = padding)."""
    flat = cache.reshape(-1, cache.shape[-1])
    rows = flat[idx.clamp_min(0).long()]  # [B, topk, R]: the gather
    k = dequant_rows(rows, kv, rope, q.dtype, kv_scale)  # [B, topk, D]
    s = torch.bmm(q, k.transpose(1, 2)).float() * sm_scale  # [B, H, topk]
    s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
    p = torch.softmax(s, -1).nan_to_num_(0.0).to(q.dtype)  # rows without a valid key: zeros
    return torch.bmm(p, k[..., :DV])
