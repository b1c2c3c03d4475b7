"""An fp8_ds_mla cache written the way vLLM's writer (``concat_and_cache_ds_mla``) lays it
out, for the kernel tests and the benchmark: per token the e4m3 latent (512 bytes, each
128-value tile divided by its scale max|x| / 448), the 4 fp32 tile scales, then the rope
part as bf16 (64 values; none for the rope-free variant). CPU or GPU, torch only."""
from __future__ import annotations

import torch

LATENT, TILE = 512, 128


def write_ds_mla(rows: torch.Tensor, rope: int) -> torch.Tensor:
    """rows [..., 512 + rope] (float) -> uint8 [..., 512 + 16 + 2 * rope]."""
    lead = rows.shape[:-1]
    lat = rows[..., :LATENT].float().reshape(*lead, LATENT // TILE, TILE)
    scale = (lat.abs().amax(-1) / 448.0).clamp_min(torch.finfo(torch.float32).tiny)
    q8 = (lat / scale[..., None]).to(torch.float8_e4m3fn).reshape(*lead, LATENT)
    parts = [q8.view(torch.uint8), scale.contiguous().view(torch.uint8).reshape(*lead, 4 * (LATENT // TILE))]
    if rope:
        parts.append(rows[..., LATENT:].to(torch.bfloat16).contiguous().view(torch.uint8).reshape(*lead, 2 * rope))
    return torch.cat(parts, -1).contiguous()


def read_ds_mla(cache: torch.Tensor, rope: int) -> torch.Tensor:
    """The values a cache holds, in float32 [..., 512 + rope] (the reference's input)."""
    lead = cache.shape[:-1]
    lat = cache[..., :LATENT].contiguous().view(torch.float8_e4m3fn).float().reshape(*lead, LATENT // TILE, TILE)
    nsc = 4 * (LATENT // TILE)
    scale = cache[..., LATENT:LATENT + nsc].contiguous().view(torch.float32)
    out = [(lat * scale[..., None]).reshape(*lead, LATENT)]
    if rope:
        out.append(cache[..., LATENT + nsc:].contiguous().view(torch.bfloat16).float())
    return torch.cat(out, -1)


def bytes_per_token(rope: int) -> int:
    return LATENT + 4 * (LATENT // TILE) + 2 * rope
