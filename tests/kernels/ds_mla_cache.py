"""fp8_ds_mla caches for the kernel tests. The writer is the benchmark's (bench_peer.py: the
layout of vLLM's ``concat_and_cache_ds_mla``: per token the e4m3 latent, 512 bytes, each
128-value tile divided by its scale max|x| / 448, the 4 fp32 tile scales, then the rope part
in the activations' 16-bit dtype, none for the rope-free variant); the reader here is written independently of the
benchmark's dequantisation, which test_bench_plan.py checks against it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_PEER = Path(__file__).resolve().parents[2] / "benchmarks" / "sparse_mla" / "bench_peer.py"
_spec = importlib.util.spec_from_file_location("sparse_mla_bench_peer", _PEER)
bench_peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_peer)
write_ds_mla = bench_peer.write_ds_mla

LATENT, TILE = 512, 128


def read_ds_mla(cache: torch.Tensor, rope: int, rope_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The values a cache holds, in float32 [..., 512 + rope] (the reference's input)."""
    lead = cache.shape[:-1]
    lat = cache[..., :LATENT].contiguous().view(torch.float8_e4m3fn).float().reshape(*lead, LATENT // TILE, TILE)
    nsc = 4 * (LATENT // TILE)
    scale = cache[..., LATENT : LATENT + nsc].contiguous().view(torch.float32)
    out = [(lat * scale[..., None]).reshape(*lead, LATENT)]
    if rope:
        out.append(cache[..., LATENT + nsc :].contiguous().view(rope_dtype).float())
    return torch.cat(out, -1)


def bytes_per_token(rope: int) -> int:
    return LATENT + 4 * (LATENT // TILE) + 2 * rope
