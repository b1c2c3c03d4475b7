# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Sparse MLA (DeepSeek V3.2 / GLM-5 DSA) attention through a Triton kernel.

Downstream backport (patchctl patch `triton-sparse-mla`). Before vLLM 0.24 no
sparse-MLA backend accepts compute capability 12.x (FLASHMLA_SPARSE is SM90 /
SM100 only, TRITON_MLA rejects sparse models), so a DSA model cannot start on
RTX PRO 6000 / RTX 50xx Blackwell. This backend runs decode and prefill rows
alike over the indexer's top-k token indices with one Triton kernel, on a
bf16 or fp16 KV cache (fp16 activations included), or an fp8 (e4m3) KV cache
with a per-tensor scale.

Selection: chosen automatically for sparse MLA models on compute capability
12.x; `VLLM_TRITON_SPARSE_MLA=1` forces it on any CUDA GPU; it can also be
asked for with `--attention-backend TRITON_MLA_SPARSE`.
"""

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from vllm.config import VllmConfig
from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionLayer,
    AttentionMetadata,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MultipleOf,
    SparseMLAAttentionImpl,
)
from vllm.v1.kv_cache_interface import AttentionSpec

if TYPE_CHECKING:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

logger = init_logger(__name__)

TRITON_SPARSE_MLA_ENV = "VLLM_TRITON_SPARSE_MLA"


def triton_sparse_mla_forced() -> bool:
    """`VLLM_TRITON_SPARSE_MLA=1` forces this backend for sparse MLA models."""
    return os.environ.get(TRITON_SPARSE_MLA_ENV, "0").strip().lower() in (
        "1",
        "true",
        "yes",
    )


def maybe_select_triton_sparse_mla(
    selected_backend: "AttentionBackendEnum | None",
    device_capability: DeviceCapability | None,
    attn_selector_config: Any,
) -> "AttentionBackendEnum | None":
    """Backend to use for this layer on CUDA, given the user's choice.

    An explicit `--attention-backend` always wins. Otherwise a sparse MLA
    layer gets TRITON_MLA_SPARSE when forced by the environment, or on
    compute capability 12.x where no upstream sparse MLA backend of this
    release accepts the GPU. Every other case keeps upstream's choice.
    """
    if selected_backend is not None:
        return selected_backend
    if not (
        getattr(attn_selector_config, "use_mla", False)
        and getattr(attn_selector_config, "use_sparse", False)
    ):
        return None
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if triton_sparse_mla_forced():
        logger.info_once(
            "%s=1: using TRITON_MLA_SPARSE for sparse MLA.", TRITON_SPARSE_MLA_ENV
        )
        return AttentionBackendEnum.TRITON_MLA_SPARSE
    if device_capability is not None and device_capability.major == 12:
        logger.info_once(
            "No upstream sparse MLA backend supports compute capability %s; "
            "using TRITON_MLA_SPARSE.",
            device_capability.as_version_str(),
        )
        return AttentionBackendEnum.TRITON_MLA_SPARSE
    return None


class TritonMLASparseBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = [
        "auto",
        "bfloat16",
        "float16",
        "fp8",  # e4m3 with a per-tensor scale (not DeepSeek's fp8_ds_mla)
        "fp8_e4m3",
    ]

    @staticmethod
    def get_supported_kernel_block_sizes() -> list[int | MultipleOf]:
        # The DSA indexer's cache shares the block size and wants 64.
        return [64]

    @staticmethod
    def get_name() -> str:
        return "TRITON_MLA_SPARSE"

    @staticmethod
    def get_builder_cls() -> type["TritonMLASparseMetadataBuilder"]:
        return TritonMLASparseMetadataBuilder

    @staticmethod
    def get_impl_cls() -> type["TritonMLASparseImpl"]:
        return TritonMLASparseImpl

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        # DeepSeek V3.2 / GLM-5 latent layout: 512 NoPE + 64 RoPE.
        return [576]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        # Portable Triton kernel. Automatic selection is limited to 12.x
        # (see maybe_select_triton_sparse_mla); elsewhere it is opt-in.
        return capability.major >= 8

    @classmethod
    def supports_combination(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: "CacheDType | None",
        block_size: int | None,
        use_mla: bool,
        has_sink: bool,
        use_sparse: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        # A 16-bit cache is read in the activation dtype.
        cache_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            str(kv_cache_dtype)
        )
        if cache_dtype is not None and cache_dtype != dtype:
            return "kv_cache_dtype must match the activation dtype"
        return None

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,  # assumed to be 1 for MLA
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        return (num_blocks, block_size, head_size)


@dataclass
class TritonMLASparseMetadata(AttentionMetadata):
    num_reqs: int
    max_query_len: int
    max_seq_len: int

    num_actual_tokens: int  # Number of tokens excluding padding.
    query_start_loc: torch.Tensor
    slot_mapping: torch.Tensor

    block_table: torch.Tensor
    # Request index of every token row (the indexer's top-k ids are
    # positions inside that request's sequence).
    req_id_per_token: torch.Tensor
    block_size: int = 64
    topk_tokens: int = 2048


def convert_req_index_to_global_slot(
    req_id_per_token: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Per-request token positions [T, topk] -> global cache slots.

    slot = block_table[req, pos // block_size] * block_size + pos % block_size;
    -1 padding (and any position outside the block table) stays -1. Pure
    tensor ops: no host sync, so it can be captured in a CUDA graph.
    """
    token_indices = token_indices.to(torch.int64)
    max_blocks = block_table.shape[1]
    block_id = torch.div(token_indices, block_size, rounding_mode="floor")
    valid = (token_indices >= 0) & (block_id < max_blocks)
    block_id = torch.where(valid, block_id, torch.zeros_like(block_id))
    req = req_id_per_token.to(torch.int64).unsqueeze(1).expand_as(block_id)
    base = block_table.to(torch.int64)[req, block_id]
    slots = base * block_size + token_indices % block_size
    slots = torch.where(valid, slots, torch.full_like(slots, -1))
    return slots.to(torch.int32)


class TritonMLASparseMetadataBuilder(
    AttentionMetadataBuilder[TritonMLASparseMetadata]
):
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        self.vllm_config = vllm_config
        self.layer_names = layer_names
        self.kv_cache_spec = kv_cache_spec
        self.model_config = vllm_config.model_config
        self.device = device
        # Same batch reordering as the other sparse MLA backends (decodes
        # first), which the DSA indexer's metadata relies on.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.topk_tokens = vllm_config.model_config.hf_config.index_topk
        self.req_id_per_token_buffer = torch.zeros(
            (vllm_config.scheduler_config.max_num_batched_tokens,),
            dtype=torch.int32,
            device=device,
        )

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> TritonMLASparseMetadata:
        cm = common_attn_metadata
        num_tokens = cm.num_actual_tokens
        starts = np.asarray(cm.query_start_loc_cpu, dtype=np.int32)
        seg_lengths = np.diff(starts)
        req_id_per_token = np.repeat(
            np.arange(seg_lengths.shape[0], dtype=np.int32), seg_lengths
        )
        # Zero-fill for cudagraphs (padded rows read request 0).
        self.req_id_per_token_buffer.fill_(0)
        self.req_id_per_token_buffer[: req_id_per_token.shape[0]].copy_(
            torch.from_numpy(req_id_per_token), non_blocking=True
        )
        return TritonMLASparseMetadata(
            num_reqs=cm.num_reqs,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            num_actual_tokens=cm.num_actual_tokens,
            query_start_loc=cm.query_start_loc,
            slot_mapping=cm.slot_mapping,
            block_table=cm.block_table_tensor,
            req_id_per_token=self.req_id_per_token_buffer[:num_tokens],
            block_size=self.kv_cache_spec.block_size,
            topk_tokens=self.topk_tokens,
        )


class TritonMLASparseImpl(SparseMLAAttentionImpl[TritonMLASparseMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None,
        attn_type: str,
        kv_sharing_target_layer_name: str | None,
        # MLA Specific Arguments
        indexer: Any | None = None,
        **mla_args,
    ) -> None:
        if kv_cache_dtype not in ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3"):
            raise NotImplementedError(
                "TRITON_MLA_SPARSE supports a bf16/fp16 or fp8 (e4m3) KV cache, "
                f"not {kv_cache_dtype!r}"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.softmax_scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_lora_rank: int = mla_args["kv_lora_rank"]
        assert indexer is not None, "TRITON_MLA_SPARSE needs the DSA indexer"
        self.topk_indices_buffer: torch.Tensor | None = indexer.topk_indices_buffer

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: TritonMLASparseMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Decode and prefill rows alike: MQA over the latent cache
        # (576 = kv_lora_rank + rope), restricted to the top-k tokens.
        from vllm.v1.attention.ops.triton_sparse_mla import sparse_mla_attention

        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        num_tokens = q.shape[0]
        assert self.topk_indices_buffer is not None
        topk_indices = self.topk_indices_buffer[:num_tokens]
        slots = convert_req_index_to_global_slot(
            attn_metadata.req_id_per_token[:num_tokens],
            attn_metadata.block_table,
            topk_indices,
            attn_metadata.block_size,
        )
        kv_cache = kv_c_and_k_pe_cache.view(
            -1, attn_metadata.block_size, kv_c_and_k_pe_cache.shape[-1]
        )
        if self.kv_cache_dtype.startswith("fp8"):
            # The MLA layer hands over the fp8 view of the cache; the kernel
            # dequantizes with the layer's per-tensor scale.
            if kv_cache.dtype == torch.uint8:
                kv_cache = kv_cache.view(torch.float8_e4m3fn)
            attn_out = sparse_mla_attention(
                q,
                kv_cache,
                slots,
                self.softmax_scale,
                kv_lora_rank=self.kv_lora_rank,
                kv_scale=float(getattr(layer, "_k_scale_float", 1.0)),
            )
        else:
            assert kv_cache.dtype == q.dtype, (
                f"TRITON_MLA_SPARSE: KV cache dtype {kv_cache.dtype} must match "
                f"the query dtype {q.dtype}"
            )
            attn_out = sparse_mla_attention(
                q,
                kv_cache,
                slots,
                self.softmax_scale,
                kv_lora_rank=self.kv_lora_rank,
            )
        return attn_out, None
