# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""PyTorch fallback for the DSA (DeepSeek V3.2 / GLM-5) indexer's fp8 MQA
logits, for GPUs where DeepGEMM is not supported.

Downstream backport (patchctl patch `dsa-indexer-fallback`). The sparse
attention indexer computes its logits with DeepGEMM's `fp8_mqa_logits`
(prefill) and `fp8_paged_mqa_logits` (decode). The wrappers in
`vllm.utils.deep_gemm` call these functions instead when
`use_indexer_fallback()` is true:

- `VLLM_DSA_INDEXER_FALLBACK=1` forces it on any GPU, `=0` turns it off;
- never automatically on compute capability 9.0 / 10.x (DeepGEMM's own GPUs);
- on other CUDA GPUs where the release does not run DeepGEMM (before 0.24,
  `support_deep_gemm()` has no 12.x);
- where the release does enable DeepGEMM (12.x from 0.24): only when DeepGEMM
  is missing, or once DeepGEMM has refused the GPU. vLLM 0.24's DeepGEMM pin
  throws "Unsupported architecture" on arch 12 from every indexer entry point,
  host-side and before any launch; `on_refusal` catches that first refusal,
  remembers it and runs the call again, which then takes the fallback. A
  DeepGEMM that accepts the GPU keeps running.

Top-k selection stays with vLLM's own CUDA kernels.

Both functions are sync-free (shapes only decide the chunking), so they can
run inside a captured CUDA graph. Memory per step is bounded by chunking.
"""

import functools
import os

import torch

_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")
# Bytes of fp32 scores materialized per chunk.
_CHUNK_BYTES = 256 * 1024 * 1024


# Messages that say DeepGEMM cannot run the indexer on this GPU: DeepGEMM's own
# refusal (DG_HOST_UNREACHABLE in csrc/apis/attention.hpp) and vLLM's wrapper
# when the installed DeepGEMM does not import.
_REFUSALS = ("Unsupported architecture", "DeepGEMM backend is unavailable")
# What DeepGEMM said when it refused this GPU (then the fallback stays on).
_refused: str | None = None


def _forced() -> bool | None:
    env = os.environ.get("VLLM_DSA_INDEXER_FALLBACK", "").strip().lower()
    if env in _TRUE:
        return True
    if env in _FALSE:
        return False
    return None


def _may_fall_back(platform) -> bool:
    # DeepGEMM's kernels are built for SM90 and SM100; there vLLM's own path
    # stays as it is.
    return platform.is_cuda() and not (
        platform.is_device_capability(90)
        or platform.is_device_capability_family(100)
    )


def _has_deep_gemm() -> bool:
    try:
        from vllm.utils.import_utils import has_deep_gemm
    except ImportError:
        from vllm.utils.deep_gemm import has_deep_gemm
    return has_deep_gemm()


def use_indexer_fallback() -> bool:
    forced = _forced()
    if forced is not None:
        return forced
    from vllm.platforms import current_platform

    if not _may_fall_back(current_platform):
        return False
    enables = getattr(current_platform, "support_deep_gemm", None)
    if enables is None or not enables():
        # This release does not run DeepGEMM on the GPU (12.x before 0.24).
        return True
    # It does (12.x from 0.24): only if DeepGEMM is missing or refused it.
    return _refused is not None or not _has_deep_gemm()


def note_refusal(error: BaseException) -> bool:
    """True when `error` is DeepGEMM refusing this GPU and the fallback may
    take over: it is then on for the rest of the process."""
    global _refused
    if not any(m in str(error) for m in _REFUSALS) or _forced() is False:
        return False
    from vllm.platforms import current_platform

    if not _may_fall_back(current_platform):
        return False
    if _refused is None:
        from vllm.logger import init_logger

        init_logger(__name__).warning(
            "DeepGEMM cannot run the DSA indexer on this GPU (%s); using the "
            "PyTorch fallback (VLLM_DSA_INDEXER_FALLBACK=0 turns it off).",
            error,
        )
    _refused = str(error)
    return True


def on_refusal(deep_gemm_wrapper):
    """`deep_gemm_wrapper` (one of vllm.utils.deep_gemm's indexer wrappers,
    which take the fallback when `use_indexer_fallback()` is true), run again
    once DeepGEMM refused the GPU. The refusal is thrown on the host before
    DeepGEMM launches anything, so nothing has run on the GPU yet."""

    @functools.wraps(deep_gemm_wrapper)
    def call(*args, **kwargs):
        try:
            return deep_gemm_wrapper(*args, **kwargs)
        except RuntimeError as e:
            if not note_refusal(e):
                raise
        return deep_gemm_wrapper(*args, **kwargs)

    return call


def _fp8_dtype() -> torch.dtype:
    return torch.float8_e4m3fn


def _split_q(q) -> torch.Tensor:
    if isinstance(q, tuple):
        q, q_scale = q
        if q_scale is not None:
            raise NotImplementedError(
                "the DSA indexer fallback supports the fp8 indexer cache only "
                "(not the MXFP4 one)"
            )
    return q


def fp8_mqa_logits_fallback(
    q,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
) -> torch.Tensor:
    """logits[m, n] = sum_h weights[m, h] * relu(q[m, h] . k[n]) * k_scale[n]
    for cu_seqlen_ks[m] <= n < cu_seqlen_ke[m], else -inf.

    q: [M, H, D] fp8 (or a `(q, None)` tuple); kv: (k [N, D] fp8, k_scale [N]
    fp32); weights: [M, H] fp32. Returns [M, N] fp32.
    """
    q = _split_q(q)
    k, k_scale = kv
    M, H, D = q.shape
    N = k.shape[0]
    logits = torch.empty((M, N), dtype=torch.float32, device=q.device)
    if M == 0 or N == 0:
        return logits
    kf = k.to(torch.float32)  # [N, D]
    k_scale = k_scale.reshape(-1).to(torch.float32)[:N]
    cols = torch.arange(N, device=q.device)
    rows_per_chunk = max(1, _CHUNK_BYTES // (4 * H * N))
    for s in range(0, M, rows_per_chunk):
        e = min(M, s + rows_per_chunk)
        qf = q[s:e].to(torch.float32)  # [m, H, D]
        scores = torch.matmul(qf.reshape(-1, D), kf.t()).view(e - s, H, N)
        scores = torch.relu_(scores) * weights[s:e].to(torch.float32)[:, :, None]
        out = scores.sum(dim=1) * k_scale[None, :]
        mask = (cols[None, :] >= cu_seqlen_ks[s:e, None]) & (
            cols[None, :] < cu_seqlen_ke[s:e, None]
        )
        logits[s:e] = out.masked_fill(~mask, float("-inf"))
    return logits


def fp8_paged_mqa_logits_fallback(
    q,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_model_len: int,
) -> torch.Tensor:
    """Paged variant for decode rows.

    q: [B, next_n, H, D] fp8 (or a `(q, None)` tuple). kv_cache: the indexer
    cache, [num_blocks, block_size, 1, D + 4] uint8 view; every block holds
    block_size * D fp8 values followed by block_size fp32 scales (DeepGEMM's
    layout, written by `indexer_k_quant_and_cache`). weights: [B * next_n, H].
    context_lens: [B] (row j of a request sits at position len - next_n + j)
    or [B, next_n] (per-row length). block_tables: [B, max_blocks].
    Returns [B * next_n, max_model_len] fp32; -inf beyond each row's length.
    """
    q = _split_q(q)
    B, next_n, H, D = q.shape
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    logits = torch.full(
        (B * next_n, max_model_len), float("-inf"), dtype=torch.float32,
        device=q.device,
    )
    if B == 0:
        return logits
    kv_u8 = kv_cache.view(torch.uint8)
    # per-row length limit [B, next_n]
    if context_lens.dim() == 2 and context_lens.shape[1] == next_n:
        limit = context_lens.to(torch.int64)
    else:
        cl = context_lens.reshape(B, -1)[:, -1].to(torch.int64)
        limit = cl[:, None] - next_n + 1 + torch.arange(next_n, device=q.device)
    qf = q.to(torch.float32).reshape(B, next_n * H, D)
    w = weights[: B * next_n].to(torch.float32).reshape(B, next_n, H)
    max_blocks = min(block_tables.shape[1], -(-max_model_len // block_size))
    per_block = 4 * B * next_n * H * block_size
    blocks_per_chunk = max(1, _CHUNK_BYTES // per_block)
    vals_bytes = block_size * D
    for b0 in range(0, max_blocks, blocks_per_chunk):
        b1 = min(max_blocks, b0 + blocks_per_chunk)
        nb = b1 - b0
        bt = block_tables[:B, b0:b1].to(torch.int64).clamp(0, num_blocks - 1)
        raw = kv_u8[bt].reshape(B, nb, -1)  # [B, nb, bs * (D + 4)] (gathered copy)
        vals = (
            raw[..., :vals_bytes].contiguous().view(_fp8_dtype()).to(torch.float32)
        ).reshape(B, nb * block_size, D)
        scales = (
            raw[..., vals_bytes : vals_bytes + 4 * block_size]
            .contiguous()
            .view(torch.float32)
            .reshape(B, nb * block_size)
        )
        s = torch.bmm(qf, vals.transpose(1, 2))  # [B, next_n*H, nb*bs]
        s = torch.relu_(s).view(B, next_n, H, nb * block_size)
        s = (s * w[..., None]).sum(dim=2) * scales[:, None, :]  # [B, next_n, n]
        pos = b0 * block_size + torch.arange(nb * block_size, device=q.device)
        s = s.masked_fill(pos[None, None, :] >= limit[:, :, None], float("-inf"))
        c0, c1 = b0 * block_size, min(max_model_len, b1 * block_size)
        logits[:, c0:c1] = s.reshape(B * next_n, -1)[:, : c1 - c0]
    return logits
