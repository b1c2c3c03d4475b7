# SPDX-License-Identifier: Apache-2.0
"""Stage 1 of the sparse-MLA kernel for 8-bit caches (NOTES.md v10).

Two cache layouts, both read one byte per latent element:

* per-tensor e4m3 (``--kv-cache-dtype fp8`` on this backend): a row is D e4m3
  values (latent then rope), one dequantisation scale for the whole cache;
* ``fp8_ds_mla`` (what vLLM's ``concat_and_cache_ds_mla`` kernel writes for DSA
  models): a row is 512 e4m3 latent bytes, 4 fp32 scales (one per 128-value
  tile of the latent), then the rope part as 64 16-bit values (656 bytes): bf16,
  or fp16 where the activations are (the writer copies their bits; read in q's dtype). The
  rope-free variant (D 512, GLM-5.3-Flash) is the same without the rope part
  (528 bytes).

Why this shape (the v9 word kernel was slower than bf16 on the SM120 path): it
read 16-bit words into registers one tile ahead (no cp.async) and split the
latent into even and odd halves (twice the dots). Here the latent is four
[BLOCK_N, DV/4] byte tiles in natural order, each converted to fp16 with two
integer ops (the value * 2**-8, exact, subnormals included) and used by one
Q.K^T dot and one P.V dot, so the MMA count is the bf16 kernel's; the byte
tiles are plain loads the pipeliner can stage through shared memory, and at
one byte per element a 64-key tile costs what a 32-key bf16 tile costs, so the
fp8 configs double BLOCK_N within SM120's 99 KB. The per-tile scales of
``fp8_ds_mla`` are applied to the [BLOCK_H, BLOCK_N] partial scores (Q.K^T) and
to P's columns (P.V), never per cache element.

Imports only torch and triton (copied beside triton_sparse_mla.py).
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

# fp8_ds_mla: 4 fp32 scales per row, one per 128 latent values (vLLM's writer).
DS_MLA_TILE = 128
DS_MLA_SCALE_BYTES = 16
_SCALE_BYTES = tl.constexpr(DS_MLA_SCALE_BYTES)  # the same, readable inside a kernel


def ds_mla_row_bytes(kv_lora_rank: int, rope_dim: int) -> int:
    """Bytes of one fp8_ds_mla cache row: e4m3 latent, fp32 tile scales, bf16 rope."""
    return kv_lora_rank + 4 * (kv_lora_rank // DS_MLA_TILE) + 2 * rope_dim


@triton.jit
def _f16_of_e4m3(b):
    # e4m3 bytes (uint8) as the fp16 of value * 2**-8: sign and the 7 exponent/mantissa
    # bits moved up (exact for subnormals too; 2**8 is taken back by the caller).
    w = b.to(tl.int32)
    return (((w & 0x80) << 8) | ((w & 0x7F) << 7)).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _load_chunk(row_ptr, offs, valid):
    return _f16_of_e4m3(tl.load(row_ptr[:, None] + offs[None, :], mask=valid[:, None], other=0))


@triton.jit
def _load_chunk_again(row_ptr, offs, valid):
    # The same bytes for the P.V dot, as a load of its own: an 8-bit tile cannot be read
    # transposed from shared memory (no ldmatrix.trans for bytes), so one load feeding both
    # dots gets a register shuffle for P.V and stays out of the pipeliner (NOTES.md v8, v10).
    # Two loads with one user each are both staged with cp.async; the second reads lines the
    # first has just brought into L2. other=1 (padding rows only, where P is 0) keeps the
    # compiler from merging the two loads.
    return _f16_of_e4m3(tl.load(row_ptr[:, None] + offs[None, :], mask=valid[:, None], other=1))


@triton.jit
def _scale_col(row_ptr, DV: tl.constexpr, c: tl.constexpr, valid):
    # fp32 scale of latent tile c of each row (fp8_ds_mla), 0 for padding.
    sp = (row_ptr + DV + 4 * c).to(tl.pointer_type(tl.float32), bitcast=True)
    return tl.load(sp, mask=valid, other=0.0)


@triton.jit
def _p_scaled(p, s):
    # P's columns times one latent tile's scales, as fp16 in [0, 1]: divided by the
    # tile's largest scale (returned, multiplied back into the fp32 product).
    smax = tl.max(s, 0)
    smax = tl.where(smax > 0.0, smax, 1.0)
    return (p * (s / smax)[None, :]).to(tl.float16), smax


@triton.jit
def _sparse_mla_stage1_8bit(
    Q,
    KV,
    IDX,
    O,
    LSE,
    scale_log2,
    out_scale,
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
    HAS_PE: tl.constexpr,
    DS_MLA: tl.constexpr,
    PAGE: tl.constexpr,
    FLAT_KV: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IS_FINAL: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    PV_RELOAD: tl.constexpr,
):
    """KV: the cache as bytes (strides in bytes; rope_dim and stride_kvd are the generic
    kernel's arguments, unused: the launcher checks a contiguous row). scale_log2: sm_scale * log2(e), times the
    per-tensor scale for e4m3 (1 for fp8_ds_mla, whose scales are in the rows)."""
    pid = tl.program_id(0)
    hb = pid % num_head_blocks
    rest = pid // num_head_blocks
    split = rest % num_splits
    t = rest // num_splits
    CH: tl.constexpr = DV // 4
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < num_heads
    offs_c = tl.arange(0, CH)
    offs_pe = tl.arange(0, DPE)

    # q in fp16 scaled by a power of two that puts its largest |value| in [2**13, 2**14]
    # (a bf16 q may lie outside fp16's range); the factor leaves through the scores.
    q_row = Q + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    mq = mask_h[:, None]
    q0 = tl.load(q_row + (0 * CH + offs_c)[None, :] * stride_qd, mask=mq, other=0.0).to(tl.float32)
    q1 = tl.load(q_row + (1 * CH + offs_c)[None, :] * stride_qd, mask=mq, other=0.0).to(tl.float32)
    q2 = tl.load(q_row + (2 * CH + offs_c)[None, :] * stride_qd, mask=mq, other=0.0).to(tl.float32)
    q3 = tl.load(q_row + (3 * CH + offs_c)[None, :] * stride_qd, mask=mq, other=0.0).to(tl.float32)
    q_abs = tl.maximum(
        tl.maximum(tl.max(tl.max(tl.abs(q0), 1), 0), tl.max(tl.max(tl.abs(q1), 1), 0)),
        tl.maximum(tl.max(tl.max(tl.abs(q2), 1), 0), tl.max(tl.max(tl.abs(q3), 1), 0)),
    )
    if HAS_PE:
        q_pe = tl.load(q_row + (DV + offs_pe)[None, :] * stride_qd, mask=mq, other=0.0).to(tl.float32)
        if not DS_MLA:  # e4m3 rope: same fp16 dots, same q scaling
            q_abs = tl.maximum(q_abs, tl.max(tl.max(tl.abs(q_pe), 1), 0))
    # 1e-30, not smaller: a constant below fp32's normal range would make the scale fp64.
    q_shift = tl.where(q_abs > 0.0, tl.ceil(tl.log2(tl.maximum(q_abs, 1e-30))) - 14.0, 0.0)
    q_mul = tl.exp2(-q_shift)
    q0 = (q0 * q_mul).to(tl.float16)
    q1 = (q1 * q_mul).to(tl.float16)
    q2 = (q2 * q_mul).to(tl.float16)
    q3 = (q3 * q_mul).to(tl.float16)
    if HAS_PE:
        if not DS_MLA:
            q_pe16 = (q_pe * q_mul).to(tl.float16)
    nope_scale = 256.0 / q_mul  # the cache's 2**-8 and q's power of two

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, CH], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, CH], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_H, CH], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_H, CH], dtype=tl.float32)

    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, topk)
    idx_row = IDX + t.to(tl.int64) * stride_it
    # Indices one tile ahead, as in the 16-bit kernel (NOTES.md v6).
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
        k0 = _load_chunk(row_ptr, 0 * CH + offs_c, valid)
        k1 = _load_chunk(row_ptr, 1 * CH + offs_c, valid)
        k2 = _load_chunk(row_ptr, 2 * CH + offs_c, valid)
        k3 = _load_chunk(row_ptr, 3 * CH + offs_c, valid)
        if DS_MLA:
            s0 = _scale_col(row_ptr, DV, 0, valid)
            s1 = _scale_col(row_ptr, DV, 1, valid)
            s2 = _scale_col(row_ptr, DV, 2, valid)
            s3 = _scale_col(row_ptr, DV, 3, valid)
            qk = tl.dot(q0, tl.trans(k0)) * s0[None, :]
            qk += tl.dot(q1, tl.trans(k1)) * s1[None, :]
            qk += tl.dot(q2, tl.trans(k2)) * s2[None, :]
            qk += tl.dot(q3, tl.trans(k3)) * s3[None, :]
            qk = qk * nope_scale
            if HAS_PE:
                # The rope after the scales, 16-bit values as the writer got them (vLLM's
                # concat_and_cache_ds_mla copies the activations' bits: bf16 for bf16 models,
                # fp16 for fp16), so in q's dtype. fp32 operands (exact in tf32 on the GPU:
                # bf16 and fp16 values fit its mantissa) keep q's own range.
                pe_ptr = (row_ptr + DV + _SCALE_BYTES).to(tl.pointer_type(Q.dtype.element_ty), bitcast=True)
                k_pe = tl.load(pe_ptr[:, None] + offs_pe[None, :], mask=valid[:, None], other=0.0)
                qk += tl.dot(q_pe, tl.trans(k_pe.to(tl.float32)))
        else:
            qk = tl.dot(q0, tl.trans(k0))
            qk = tl.dot(q1, tl.trans(k1), qk)
            qk = tl.dot(q2, tl.trans(k2), qk)
            qk = tl.dot(q3, tl.trans(k3), qk)
            if HAS_PE:
                qk = tl.dot(q_pe16, tl.trans(_load_chunk(row_ptr, DV + offs_pe, valid)), qk)
            qk = qk * nope_scale
        qk = tl.where(valid[None, :], qk * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(qk - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if PV_RELOAD:
            k0 = _load_chunk_again(row_ptr, 0 * CH + offs_c, valid)
            k1 = _load_chunk_again(row_ptr, 1 * CH + offs_c, valid)
            k2 = _load_chunk_again(row_ptr, 2 * CH + offs_c, valid)
            k3 = _load_chunk_again(row_ptr, 3 * CH + offs_c, valid)
        if DS_MLA:
            p0, c0 = _p_scaled(p, s0)
            p1, c1 = _p_scaled(p, s1)
            p2, c2 = _p_scaled(p, s2)
            p3, c3 = _p_scaled(p, s3)
            acc0 = acc0 * alpha[:, None] + tl.dot(p0, k0) * c0
            acc1 = acc1 * alpha[:, None] + tl.dot(p1, k1) * c1
            acc2 = acc2 * alpha[:, None] + tl.dot(p2, k2) * c2
            acc3 = acc3 * alpha[:, None] + tl.dot(p3, k3) * c3
        else:
            p16 = p.to(tl.float16)
            acc0 = acc0 * alpha[:, None] + tl.dot(p16, k0)
            acc1 = acc1 * alpha[:, None] + tl.dot(p16, k1)
            acc2 = acc2 * alpha[:, None] + tl.dot(p16, k2)
            acc3 = acc3 * alpha[:, None] + tl.dot(p16, k3)
        m_i = m_new

    has = l_i > 0.0
    inv = tl.where(has, 256.0 / tl.where(has, l_i, 1.0), 0.0)
    lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    if IS_FINAL:
        inv = inv * out_scale
    o_row = O + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh + split * stride_os
    ty = O.dtype.element_ty
    tl.store(o_row + (0 * CH + offs_c)[None, :] * stride_od, (acc0 * inv[:, None]).to(ty), mask=mq)
    tl.store(o_row + (1 * CH + offs_c)[None, :] * stride_od, (acc1 * inv[:, None]).to(ty), mask=mq)
    tl.store(o_row + (2 * CH + offs_c)[None, :] * stride_od, (acc2 * inv[:, None]).to(ty), mask=mq)
    tl.store(o_row + (3 * CH + offs_c)[None, :] * stride_od, (acc3 * inv[:, None]).to(ty), mask=mq)
    l_ptr = LSE + t.to(tl.int64) * stride_lt + offs_h * stride_lh + split * stride_ls
    if IS_FINAL:
        if WRITE_LSE:
            tl.store(l_ptr, lse2 * 0.6931471805599453, mask=mask_h)
    else:
        tl.store(l_ptr, lse2, mask=mask_h)


class Fp8Config(NamedTuple):
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    per_sm: int  # programs per SM it was sized for (capped by the device's shared memory)
    smem: int  # bytes of shared memory per program: the largest sm_120 compile (triton 3.8)
    pv_reload: bool  # P.V reads its own copy of the latent tile (both pipelined; see the kernel)


# Launch configs of the 8-bit kernel (16-head blocks: SM120's only choice, NOTES.md v6/v7).
# Shared memory from sm_120 compiles (triton 3.8, the largest of e4m3/fp8_ds_mla x rope or not
# x fp16/bf16 x split/final: compile_sizes.py). Unmeasured on a GPU: the benchmark's --sweep
# times them all; the order below is a choice by structure, not by measurement.
FP8_CONFIGS = {
    # Default: every latent tile staged by cp.async, 2 tiles in flight (the bf16 default's
    # structure at half the DRAM bytes per tile); the P.V copy costs L2 reads, not DRAM.
    "f8_h16_n32_w4_s3_rl": Fp8Config(16, 32, 4, 3, 1, 100352, True),
    # 64-key tiles, one in flight: half the tiles (per-tile fixed cost) per byte. fp8_ds_mla
    # needs 104448 B (over SM120's 101376): picked for e4m3 only where it fits (the sweep).
    "f8_h16_n64_w4_s2_rl": Fp8Config(16, 64, 4, 2, 1, 104448, True),
    # One latent load per tile (P.V through a register shuffle, not staged): about half the
    # shared memory (n64: 38912 B e4m3, 53248 B fp8_ds_mla; n32 less), so at n32 two programs
    # fit an SM120 SM.
    "f8_h16_n64_w4_s3": Fp8Config(16, 64, 4, 3, 2, 53248, False),
    "f8_h16_n32_w4_s3": Fp8Config(16, 32, 4, 3, 2, 38912, False),
}
FP8_PREFERRED = ("f8_h16_n32_w4_s3_rl", "f8_h16_n32_w4_s3")
