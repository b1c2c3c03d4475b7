# SPDX-License-Identifier: Apache-2.0
"""Sparse MLA attention (DeepSeek V3.2 / GLM-5 "DSA") in Triton.

Every query row ``t`` attends to its own top-k list of KV-cache slots
(``indices[t]``, global slot ids ``block * block_size + offset``; ``-1`` (any
negative value) is padding and is ignored). The KV cache is the MLA latent
cache: one shared "head" of ``D = kv_lora_rank + rope_dim`` values per token;
K is the whole row, V its first ``kv_lora_rank`` values. The same kernel serves
decode (one row per request) and prefill (one row per token). The rope
tail may be absent (``rope_dim = 0``, ``D = kv_lora_rank``: rope-free MLA such as
GLM-5.3-Flash, ``qk_rope_head_dim = 0``); the kernel is then compiled without
the rope loads and dot (``HAS_PE``).

Design (see NOTES.md beside this file for measurements):

* stage 1: one program per (row, head block, split). A head block covers up to
  ``BLOCK_H`` query heads; they all share the row's gathered KV tiles, so each
  tile of ``BLOCK_N`` gathered cache rows is loaded once and used as the N
  (scores) and K (output) operand of ``tl.dot`` for all heads of the block.
  D is handled as ``kv_lora_rank`` + ``rope`` chunks. Online softmax in base 2.
  The indices of the next tile are loaded one tile ahead, so the gather of the
  next tile is in flight while the current one is computed.
* split-K over the top-k dimension (flash decoding) when rows x head blocks are
  too few to fill the GPU; stage 2 merges the splits through their
  log-sum-exp. With one split, stage 1 writes the final output directly.

This file imports only torch and triton so it can be copied verbatim into a
vLLM tree.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

try:  # in a package (a vLLM tree): the 8-bit stage 1 sits beside this file
    from . import triton_sparse_mla_fp8 as _fp8
except ImportError:  # loaded by path (tests, benchmark): load the sibling file by path too
    import importlib.util as _ilu
    import os as _os

    _spec = _ilu.spec_from_file_location(
        __name__ + "_fp8", _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "triton_sparse_mla_fp8.py")
    )
    _fp8 = _ilu.module_from_spec(_spec)
    _spec.loader.exec_module(_fp8)

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit
def _sparse_mla_stage1(
    Q,
    KV,
    IDX,
    O,
    LSE,
    scale_log2,  # sm_scale * log2(e) (* kv_scale for fp8)
    out_scale,  # kv_scale for fp8, else 1.0
    num_heads,
    topk,
    rope_dim,
    tiles_per_split,
    num_splits,
    num_head_blocks,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kvb,
    stride_kvs,
    stride_kvd,
    stride_it,
    stride_ik,
    stride_ot,
    stride_oh,
    stride_os,
    stride_od,
    stride_lt,
    stride_lh,
    stride_ls,
    DV: tl.constexpr,
    DPE: tl.constexpr,
    PE_MASKED: tl.constexpr,  # rope_dim < DPE: mask the padded rope columns
    HAS_PE: tl.constexpr,  # rope_dim > 0; False: rope-free MLA (D = DV), no rope loads or dot
    PAGE: tl.constexpr,  # kv-cache block size (constexpr: the slot split is a shift for powers of 2)
    FLAT_KV: tl.constexpr,  # stride_kvb == PAGE * stride_kvs: a slot id is a row number, no split needed
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_FINAL: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    KV_FP8: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    # 1-D grid, head block fastest: the head blocks of one (row, split) read the
    # same KV rows at about the same time, so all but the first hit L2.
    pid = tl.program_id(0)
    hb = pid % num_head_blocks
    rest = pid // num_head_blocks
    split = rest % num_splits
    t = rest // num_splits

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_dv = tl.arange(0, DV)
    offs_pe = tl.arange(0, DPE)
    if PE_MASKED:
        mask_pe = offs_pe < rope_dim
    else:
        # No column mask when rope_dim == DPE: a mask that varies along the row
        # stops 16-byte vector loads, and with them cp.async pipelining.
        mask_pe = offs_pe < DPE

    q_row = Q + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q_nope = tl.load(q_row + offs_dv[None, :] * stride_qd, mask=mask_h[:, None], other=0.0)
    if HAS_PE:
        q_pe = tl.load(
            q_row + (DV + offs_pe[None, :]) * stride_qd,
            mask=mask_h[:, None] & mask_pe[None, :],
            other=0.0,
        )

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, DV], dtype=tl.float32)

    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, topk)
    idx_row = IDX + t.to(tl.int64) * stride_it
    # The indices of tile i+1 are loaded during tile i (loop-carried), so no
    # load in the same iteration feeds the gather's addresses. With the index
    # load in that chain (v5) triton's pipeliner copied the index three times
    # per tile (once per layout that uses it), gave the KV tile fewer buffers
    # and, at 3 stages, waited for every copy at the top of each iteration;
    # now the gather of the next tile stays in flight (NOTES.md v6).
    offs_n = start + tl.arange(0, BLOCK_N)
    slot_next = tl.load(idx_row + offs_n * stride_ik, mask=offs_n < end, other=-1).to(tl.int32)
    for n0 in tl.range(start, end, BLOCK_N):
        slot = slot_next
        offs_n = n0 + BLOCK_N + tl.arange(0, BLOCK_N)
        slot_next = tl.load(idx_row + offs_n * stride_ik, mask=offs_n < end, other=-1).to(tl.int32)
        valid = slot >= 0
        slot = tl.where(valid, slot, 0)
        if FLAT_KV:
            row_ptr = KV + slot.to(tl.int64) * stride_kvs
        else:
            blk = slot // PAGE
            row_ptr = KV + blk.to(tl.int64) * stride_kvb + (slot - blk * PAGE) * stride_kvs
        k_nope = tl.load(
            row_ptr[:, None] + offs_dv[None, :] * stride_kvd,
            mask=valid[:, None],
            other=0.0,
        )
        if KV_FP8:
            # e4m3 -> fp16/bf16 is exact; the per-tensor scale is folded into
            # scale_log2 (scores) and out_scale (output).
            k_nope = k_nope.to(q_nope.dtype)
        if DOT_F32:
            # CPU interpreter only: its tl.dot multiplies the raw uint16 bits of
            # bf16 operands (triton 3.8), so upcast there. Never used on GPU.
            qk = tl.dot(q_nope.to(tl.float32), tl.trans(k_nope.to(tl.float32)))
        else:
            qk = tl.dot(q_nope, tl.trans(k_nope))
        if HAS_PE:
            # The rope tail: a second, narrow dot into the same scores.
            k_pe = tl.load(
                row_ptr[:, None] + (DV + offs_pe[None, :]) * stride_kvd,
                mask=valid[:, None] & mask_pe[None, :],
                other=0.0,
            )
            if KV_FP8:
                k_pe = k_pe.to(q_pe.dtype)
            if DOT_F32:
                qk += tl.dot(q_pe.to(tl.float32), tl.trans(k_pe.to(tl.float32)))
            else:
                qk += tl.dot(q_pe, tl.trans(k_pe))
        qk = tl.where(valid[None, :], qk * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # Rows with no valid key so far keep m = -inf; use 0 as the reference
        # so exp2 gives 0 instead of NaN (-inf - -inf).
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(qk - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DOT_F32:
            pv = tl.dot(p.to(k_nope.dtype).to(tl.float32), k_nope.to(tl.float32))
        else:
            pv = tl.dot(p.to(k_nope.dtype), k_nope)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    res = tl.where(has[:, None], acc / l_safe[:, None], 0.0)
    lse2 = tl.where(has, m_i + tl.log2(l_safe), float("-inf"))

    o_ptr = O + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh + split * stride_os + offs_dv[None, :] * stride_od
    l_ptr = LSE + t.to(tl.int64) * stride_lt + offs_h * stride_lh + split * stride_ls
    if IS_FINAL:
        tl.store(o_ptr, (res * out_scale).to(O.dtype.element_ty), mask=mask_h[:, None])
        if WRITE_LSE:
            tl.store(l_ptr, lse2 * 0.6931471805599453, mask=mask_h)
    else:
        tl.store(o_ptr, res, mask=mask_h[:, None])
        tl.store(l_ptr, lse2, mask=mask_h)


@triton.jit
def _sparse_mla_stage2(
    MID_O,  # [T, H, S, DV] float32, each split normalised by its own sum (0 if empty)
    MID_L,  # [T, H, S] float32, base-2 lse of each split (-inf if empty)
    O,
    LSE,
    out_scale,
    num_heads,
    num_splits,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    stride_od,
    stride_rt,
    stride_rh,
    DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ONE_STEP: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    pid = tl.program_id(0)
    h = pid % num_heads
    t = pid // num_heads
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, DV)
    l_base = MID_L + t.to(tl.int64) * stride_lt + h * stride_lh
    o_base = MID_O + t.to(tl.int64) * stride_mt + h * stride_mh

    if ONE_STEP:
        # num_splits <= BLOCK_S: lse and partial outputs in one round of loads.
        ms = offs_s < num_splits
        ls = tl.load(l_base + offs_s, mask=ms, other=float("-inf"))
        o = tl.load(o_base + offs_s[:, None] * stride_ms + offs_dv[None, :], mask=ms[:, None], other=0.0)
        m = tl.max(ls, 0)
        m_ref = tl.where(m == float("-inf"), 0.0, m)
        w = tl.exp2(ls - m_ref)
        acc = tl.sum(w[:, None] * o, 0)
        w_sum = tl.sum(w, 0)
    else:
        m = float("-inf")
        for s0 in range(0, num_splits, BLOCK_S):
            ls = tl.load(l_base + s0 + offs_s, mask=s0 + offs_s < num_splits, other=float("-inf"))
            m = tl.maximum(m, tl.max(ls, 0))
        m_ref = tl.where(m == float("-inf"), 0.0, m)

        acc = tl.zeros([DV], dtype=tl.float32)
        w_sum = 0.0
        # BLOCK_S splits per step, no data-dependent branch: the loads of a step
        # are independent and overlap (a scalar loop over splits was latency bound).
        for s0 in range(0, num_splits, BLOCK_S):
            ms = s0 + offs_s < num_splits
            w = tl.exp2(tl.load(l_base + s0 + offs_s, mask=ms, other=float("-inf")) - m_ref)
            o = tl.load(o_base + (s0 + offs_s)[:, None] * stride_ms + offs_dv[None, :], mask=ms[:, None], other=0.0)
            acc += tl.sum(w[:, None] * o, 0)
            w_sum += tl.sum(w, 0)

    has = w_sum > 0.0
    res = tl.where(has, acc / tl.where(has, w_sum, 1.0), 0.0) * out_scale
    tl.store(
        O + t.to(tl.int64) * stride_ot + h * stride_oh + offs_dv * stride_od,
        res.to(O.dtype.element_ty),
    )
    if WRITE_LSE:
        lse = tl.where(has, (m_ref + tl.log2(tl.where(has, w_sum, 1.0))) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + t.to(tl.int64) * stride_rt + h * stride_rh, lse)


class _Limits(NamedTuple):
    sms: int
    smem_per_block: int  # opt-in maximum of one program (bytes)
    smem_per_sm: int


_LIMITS: dict = {}
# CPU (the interpreter): no limits; 8 "SMs" keep the split paths exercised.
_CPU_LIMITS = _Limits(8, 1 << 30, 1 << 30)


def _device_limits(device: torch.device) -> _Limits:
    if device.type != "cuda":
        return _CPU_LIMITS
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _LIMITS:
        p = torch.cuda.get_device_properties(key)
        per_block = getattr(p, "shared_memory_per_block_optin", 0)
        if not per_block:  # older torch: ask triton's driver (the limit it checks at launch)
            try:
                per_block = triton.runtime.driver.active.utils.get_device_properties(key)["max_shared_mem"]
            except Exception:
                per_block = 101376  # the smallest of the GPUs this kernel is for (SM120)
        per_sm = getattr(p, "shared_memory_per_multiprocessor", 0) or per_block
        _LIMITS[key] = _Limits(p.multi_processor_count, per_block, per_sm)
    return _LIMITS[key]


class _Config(NamedTuple):
    block_h: int  # query heads per program (the M of the dots)
    block_n: int  # gathered cache rows per tile
    num_warps: int
    num_stages: int
    per_sm: int  # programs resident per SM on an H200
    smem: int  # bytes of shared memory per program


# Launch configurations. The shared memory is the larger of local sm_90 and
# sm_120 compiles (triton 3.6, bf16; q + KV buffers): a config is only chosen
# where it fits the device's per-program limit, which is 99 KB (101376 B) on
# SM120 parts against 227 KB on Hopper, so on SM120 the large head blocks below
# are never picked. The comments give registers and whether the gather of the
# next tile stays in flight while a tile is computed (the pipeliner's
# async_wait count > 0) (NOTES.md v6).
_CONFIGS = {
    # v6 default for H <= 16, H32 below 32 rows, H64 up to 2 rows, and everywhere
    # on parts with <= 99 KB per program (SM120):
    "h16_n32_w4_s3": _Config(16, 32, 4, 3, 2, 93184),  # 183 regs, 2 KV buffers, overlapped
    "h16_n32_w8_s3": _Config(16, 32, 8, 3, 2, 93184),  # 101 regs, overlapped
    "h16_n16_w4_s3": _Config(16, 16, 4, 3, 4, 55808),  # 128 regs, overlapped
    "h16_n64_w8_s2": _Config(16, 64, 8, 2, 2, 94208),  # 136 regs, 1 KV buffer: not overlapped
    "h32_n32_w8_s3": _Config(32, 32, 8, 3, 2, 112640),  # 169 regs, overlapped
    "h32_n16_w8_s3": _Config(32, 16, 8, 3, 2, 74752),  # 159 regs, overlapped (fits SM120; measured slower)
    "h32_n32_w8_s2": _Config(32, 32, 8, 2, 2, 75776),  # 174 regs, not overlapped (fits SM120; measured slower)
    # v6 default for 16 < H <= 32 from 32 rows on:
    "h32_n64_w8_s3": _Config(32, 64, 8, 3, 1, 188416),  # 174 regs, overlapped
    # v6 default for H64, 3 to 127 rows:
    "h64_n32_w8_s3": _Config(64, 32, 8, 3, 1, 184320),  # 241 regs, 3 KV buffers, overlapped
    "h64_n32_w8_s4": _Config(64, 32, 8, 4, 1, 221184),  # 240 regs, 4 KV buffers, overlapped
    # 64-key tiles halve the per-tile fixed cost (q re-read from shared memory
    # by both warpgroups, cross-warpgroup softmax exchange, dot waits); q and
    # two 64-key buffers fill shared memory, and with two the pipeliner waits
    # for each gather (not overlapped). Still the fastest at >= 128 rows.
    # v6 default for H64 from 128 rows on:
    "h64_n64_w8_s2": _Config(64, 64, 8, 2, 1, 221184),  # 255 regs + 48 B stack
}
# Where the preferred config does not fit: measured on the H200 among the
# configs that fit 99 KB, h16_n32_w4_s3 was the fastest or within 3 % of it
# for H 32 and 64 at every batch (NOTES.md v6); h16_n16_w4_s3 is the last resort.
_SMALL_FALLBACKS = ("h16_n32_w4_s3", "h16_n16_w4_s3")

# H64: from this many rows on, 64-key tiles (NOTES.md v5, v6).
_H64_N64_MIN_ROWS = 128
# H64, <= 2 rows: head blocks of 16 (NOTES.md v4-v6).
_H64_FEW_ROWS = "h16_n32_w4_s3"
# 16 < H <= 32: from this many rows on one 32-head block with 64-key tiles,
# below it head blocks of 16 (NOTES.md v6: batch 8 vs 32).
_H32_N64_MIN_ROWS = 32


def _num_splits(work: int, n_tiles: int, per_sm: int, sms: int) -> int:
    """Split the top-k range only as far as needed to give every SM its resident
    programs (going past one wave measured slower, NOTES.md v2), keeping >= 2
    tiles per split so the pipeline has something to overlap, and >= 4 once
    there are more programs than SMs (H8 batch 8: 16 splits of 4 tiles beat 32
    of 2, NOTES.md v6). work: programs per split."""
    splits = max(1, min(max(1, n_tiles // 2), (per_sm * sms) // work))
    if splits > 1 and n_tiles // splits < 4 and work * splits > sms:
        splits = max(1, min(splits, max(1, n_tiles // 4), max(1, sms // work)))
    return splits


def _config_dict(name: str, num_rows: int, num_heads: int, topk: int, device) -> dict:
    """Launch parameters of a named config; device: a torch.device or _Limits."""
    limits = device if isinstance(device, _Limits) else _device_limits(device)
    c = _CONFIGS[name]
    # Fewer programs fit an SM with less shared memory (1 KB per program is reserved).
    per_sm = max(1, min(c.per_sm, limits.smem_per_sm // (c.smem + 1024)))
    programs_per_split = num_rows * triton.cdiv(num_heads, c.block_h)
    n_tiles = max(1, triton.cdiv(topk, c.block_n))
    return dict(
        block_h=c.block_h,
        block_n=c.block_n,
        num_warps=c.num_warps,
        num_stages=c.num_stages,
        num_splits=_num_splits(programs_per_split, n_tiles, per_sm, limits.sms),
    )


def _preferred_config(num_rows: int, num_heads: int) -> str:
    """Per regime, from the H200 sweeps in NOTES.md (v6).

    * H <= 16: one config at every batch (the split rule adapts).
    * 16 < H <= 32: head blocks of 16 below 32 rows, else one 32-head block
      with 64-key tiles.
    * H64, <= 2 rows: head blocks of 16 (4 programs per row and split, 2 per
      SM) instead of one 64-head program per split on a quarter of the SMs.
    * H64 otherwise: 64-head blocks, 32-key tiles with 3 buffers; 64-key tiles
      (2 buffers, all that fits next to q) from 128 rows on.
    """
    if num_heads <= 16:
        return "h16_n32_w4_s3"
    if num_heads <= 32:
        return "h32_n64_w8_s3" if num_rows >= _H32_N64_MIN_ROWS else "h16_n32_w4_s3"
    if num_rows <= 2:
        return _H64_FEW_ROWS
    return "h64_n64_w8_s2" if num_rows >= _H64_N64_MIN_ROWS else "h64_n32_w8_s3"


def _pick_config(num_rows: int, num_heads: int, topk: int, limits: _Limits) -> dict:
    """The preferred config if its shared memory fits one program on this
    device, else the first fallback that fits (else the smallest)."""
    names = (_preferred_config(num_rows, num_heads),) + _SMALL_FALLBACKS
    name = next((n for n in names if _CONFIGS[n].smem <= limits.smem_per_block), names[-1])
    return dict(_config_dict(name, num_rows, num_heads, topk, limits), name=name)


# Per-tensor e4m3 cache: the 8-bit kernel from this many rows on; below it the generic
# kernel (batch 1: the per-program q scaling is paid by 32 splits, NOTES.md v9; the same
# scaling is in the 8-bit kernel). fp8_ds_mla has only the 8-bit kernel.
_FP8_KERNEL_MIN_ROWS = 8


def _pick_fp8_config(num_rows: int, num_heads: int, topk: int, limits: _Limits) -> dict:
    """The 8-bit kernel's config: the first of _fp8.FP8_PREFERRED that fits one program
    (else the last), with the split rule of the bf16 kernel under its own shared memory."""
    names = _fp8.FP8_PREFERRED
    name = next((n for n in names if _fp8.FP8_CONFIGS[n].smem <= limits.smem_per_block), names[-1])
    c = _fp8.FP8_CONFIGS[name]
    per_sm = max(1, min(c.per_sm, limits.smem_per_sm // (c.smem + 1024)))
    work = num_rows * triton.cdiv(num_heads, c.block_h)
    n_tiles = max(1, triton.cdiv(topk, c.block_n))
    return dict(
        block_h=c.block_h,
        block_n=c.block_n,
        num_warps=c.num_warps,
        num_stages=c.num_stages,
        pv_reload=c.pv_reload,
        num_splits=_num_splits(work, n_tiles, per_sm, limits.sms),
        name=name,
    )


def _uses_8bit_kernel(kv_format: str, num_rows: int, num_heads: int, limits: _Limits, rope_dim: int, dpe: int, dv: int) -> bool:
    """Whether the 8-bit kernel serves a call: always for fp8_ds_mla; for a per-tensor e4m3
    cache where the bf16 choice is a 16-head block (every SM120 pick; on Hopper the 64-head
    wgmma configs stay generic), from _FP8_KERNEL_MIN_ROWS rows on, with an unpadded rope."""
    if kv_format == "fp8_ds_mla":
        return True
    if kv_format != "fp8":
        return False
    return (
        _pick_config(num_rows, num_heads, 2048, limits)["block_h"] <= 16
        and num_rows >= _FP8_KERNEL_MIN_ROWS
        and (rope_dim == 0 or rope_dim == dpe)
        and dv >= 64
    )


def pick_launch(
    num_rows: int,
    num_heads: int,
    topk: int,
    limits: _Limits,
    kv_format: str = "bf16",
    rope_dim: int = 64,
    kv_lora_rank: int = 512,
) -> dict:
    """The launch parameters a call would get on a device with these limits; name: the config,
    kernel: "8bit" or "generic". kv_format: "bf16" (or "fp16"), "fp8" or "fp8_ds_mla"."""
    dpe = max(16, triton.next_power_of_2(max(rope_dim, 1)))
    if _uses_8bit_kernel(kv_format, num_rows, num_heads, limits, rope_dim, dpe, kv_lora_rank):
        return dict(_pick_fp8_config(num_rows, num_heads, topk, limits), kernel="8bit")
    return dict(_pick_config(num_rows, num_heads, topk, limits), kernel="generic")


def sparse_mla_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    kv_lora_rank: int = 512,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    *,
    kv_scale: float | None = None,
    kv_format: str | None = None,
    _config: dict | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention over per-row top-k KV slots.

    q:        [T, H, D] fp16/bf16, D = kv_lora_rank + rope_dim, already absorbed;
              rope_dim 0 (D = kv_lora_rank: rope-free MLA) or > 0 (64: DeepSeek V3.2, GLM-5).
    kv_cache: [num_blocks, block_size, D], same dtype as q, or float8_e4m3fn
              with ``kv_scale`` (per-tensor dequantisation scale), or with
              ``kv_format="fp8_ds_mla"`` uint8 [num_blocks, block_size, R]: per row the
              e4m3 latent (kv_lora_rank = 512 bytes), one fp32 scale per 128 latent
              values (16 bytes), the rope part as bf16 (R = 656 for rope 64; 528 rope-free)
              -- vLLM's fp8_ds_mla cache.
    indices:  [T, topk] int32 global slot ids (block * block_size + offset);
              negative = padding. A row with no valid index outputs zeros and
              lse = -inf.
    out:      optional [T, H, kv_lora_rank] (any strides); fully overwritten.
    Returns out, or (out, lse [T, H] float32, natural log) if return_lse.
    """
    if q.dim() != 3 or kv_cache.dim() != 3 or indices.dim() != 2:
        raise ValueError("expected q [T,H,D], kv_cache [blocks,block_size,D], indices [T,topk]")
    T, H, D = q.shape
    if indices.shape[0] != T:
        raise ValueError(f"indices has {indices.shape[0]} rows, q has {T}")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"q must be fp16 or bf16, got {q.dtype}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"indices must be int32 (or int64), got {indices.dtype}")
    dv = kv_lora_rank
    if dv <= 0 or dv & (dv - 1) or dv < 16:
        raise ValueError(f"kv_lora_rank must be a power of two >= 16, got {dv}")
    rope_dim = D - dv
    if rope_dim < 0:
        raise ValueError(f"kv_lora_rank {dv} > head dim {D}")
    if kv_format not in (None, "fp8_ds_mla"):
        raise ValueError(f"kv_format must be None or 'fp8_ds_mla', got {kv_format!r}")
    if kv_format == "fp8_ds_mla":
        row = _fp8.ds_mla_row_bytes(dv, rope_dim)
        if dv != 4 * _fp8.DS_MLA_TILE or rope_dim not in (0, 64):
            raise ValueError(f"fp8_ds_mla needs kv_lora_rank 512 and rope 0 or 64, got {dv} and {rope_dim}")
        if kv_cache.dtype != torch.uint8 or kv_cache.shape[-1] != row:
            raise ValueError(
                f"an fp8_ds_mla cache is uint8 [blocks, block_size, {row}], got {kv_cache.dtype} {tuple(kv_cache.shape)}"
            )
        if kv_cache.stride(2) != 1 or kv_cache.stride(1) % 16 or kv_cache.stride(0) % 16 or kv_cache.data_ptr() % 16:
            # the fp32 scales and 16-bit rope values are read in place: rows must start 16-byte aligned
            raise ValueError("an fp8_ds_mla cache needs contiguous rows, 16-byte aligned row strides and a 16-byte aligned start")
        kv_fp8, fmt = True, "fp8_ds_mla"
    else:
        if kv_cache.shape[-1] != D:
            raise ValueError(f"q last dim {D} != kv_cache last dim {kv_cache.shape[-1]}")
        kv_fp8 = kv_cache.dtype == getattr(torch, "float8_e4m3fn", None)
        fmt = "fp8" if kv_fp8 else "bf16"
        if kv_fp8:
            if kv_scale is None:
                raise ValueError("an fp8 kv_cache needs kv_scale")
        elif kv_cache.dtype != q.dtype:
            raise ValueError(f"kv_cache dtype {kv_cache.dtype} != q dtype {q.dtype}")
    scale = float(kv_scale) if fmt == "fp8" else 1.0

    if out is None:
        out = torch.empty((T, H, dv), dtype=q.dtype, device=q.device)
    elif tuple(out.shape) != (T, H, dv):
        raise ValueError(f"out must have shape {(T, H, dv)}, got {tuple(out.shape)}")
    lse = torch.empty((T, H), dtype=torch.float32, device=q.device) if return_lse else None
    if T == 0 or H == 0:
        return (out, lse) if return_lse else out
    topk = indices.shape[1]
    if topk == 0:
        out.zero_()
        if return_lse:
            lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out

    dpe = max(16, triton.next_power_of_2(max(rope_dim, 1)))
    limits = _device_limits(q.device)
    # The 8-bit kernel reads the cache as bytes and needs a contiguous row (even strides).
    eight_bit = _uses_8bit_kernel(fmt, T, H, limits, rope_dim, dpe, dv) and (fmt == "fp8_ds_mla" or kv_cache.stride(2) == 1)
    if _config and _config.get("kernel") in ("8bit", "generic") and fmt == "fp8":
        # a launch picked for other limits (pick_launch(..., SM120)): its kernel too
        eight_bit = _config["kernel"] == "8bit" and kv_cache.stride(2) == 1 and rope_dim in (0, dpe) and dv >= 64
    cfg = _pick_fp8_config(T, H, topk, limits) if eight_bit else _pick_config(T, H, topk, limits)
    if _config:
        cfg.update(_config)
    block_h, block_n = cfg["block_h"], cfg["block_n"]
    head_blocks = triton.cdiv(H, block_h)
    n_tiles = triton.cdiv(topk, block_n)
    num_splits = max(1, min(int(cfg["num_splits"]), n_tiles))
    tiles_per_split = triton.cdiv(n_tiles, num_splits)
    num_splits = triton.cdiv(n_tiles, tiles_per_split)  # no empty splits
    scale_log2 = float(sm_scale) * scale * _LOG2E
    block_size = kv_cache.shape[1]
    grid = (T * head_blocks * num_splits,)
    common = dict(
        DV=dv,
        DPE=dpe,
        PAGE=block_size,
        FLAT_KV=kv_cache.stride(0) == block_size * kv_cache.stride(1),
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    if eight_bit:
        stage1 = _fp8._sparse_mla_stage1_8bit
        kv_cache = kv_cache.view(torch.uint8)  # byte strides (e4m3: the same numbers)
        common.update(HAS_PE=rope_dim > 0, DS_MLA=fmt == "fp8_ds_mla", PV_RELOAD=bool(cfg.get("pv_reload", True)))
    else:
        stage1 = _sparse_mla_stage1
        common.update(
            PE_MASKED=rope_dim != dpe,
            HAS_PE=rope_dim > 0,
            KV_FP8=kv_fp8,
            DOT_F32=q.device.type == "cpu" and q.dtype == torch.bfloat16,
        )
    if num_splits == 1:
        lse_arg = lse if return_lse else out  # dummy pointer when unused
        stage1[grid](
            q,
            kv_cache,
            indices,
            out,
            lse_arg,
            scale_log2,
            scale,
            H,
            topk,
            rope_dim,
            tiles_per_split,
            num_splits,
            head_blocks,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            indices.stride(0),
            indices.stride(1),
            out.stride(0),
            out.stride(1),
            0,
            out.stride(2),
            lse.stride(0) if return_lse else 0,
            lse.stride(1) if return_lse else 0,
            0,
            IS_FINAL=True,
            WRITE_LSE=return_lse,
            **common,
        )
    else:
        mid_o = torch.empty((T, H, num_splits, dv), dtype=torch.float32, device=q.device)
        mid_l = torch.empty((T, H, num_splits), dtype=torch.float32, device=q.device)
        stage1[grid](
            q,
            kv_cache,
            indices,
            mid_o,
            mid_l,
            scale_log2,
            scale,
            H,
            topk,
            rope_dim,
            tiles_per_split,
            num_splits,
            head_blocks,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            indices.stride(0),
            indices.stride(1),
            mid_o.stride(0),
            mid_o.stride(1),
            mid_o.stride(2),
            mid_o.stride(3),
            mid_l.stride(0),
            mid_l.stride(1),
            mid_l.stride(2),
            IS_FINAL=False,
            WRITE_LSE=True,
            **common,
        )
        lse_arg = lse if return_lse else mid_l
        block_s = min(16, max(2, triton.next_power_of_2(num_splits)))
        _sparse_mla_stage2[(T * H,)](
            mid_o,
            mid_l,
            out,
            lse_arg,
            scale,
            H,
            num_splits,
            mid_o.stride(0),
            mid_o.stride(1),
            mid_o.stride(2),
            mid_l.stride(0),
            mid_l.stride(1),
            out.stride(0),
            out.stride(1),
            out.stride(2),
            lse.stride(0) if return_lse else 0,
            lse.stride(1) if return_lse else 0,
            DV=dv,
            BLOCK_S=block_s,
            ONE_STEP=num_splits <= block_s,
            WRITE_LSE=return_lse,
            num_warps=4,
        )
    return (out, lse) if return_lse else out


__all__ = ["sparse_mla_attention"]
