# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Sparse MLA (DeepSeek V3.2 / GLM-5 DSA) attention through a Triton kernel:
the fallback for what upstream's SM12x sparse backend cannot run.

Downstream (patchctl patch `triton-sparse-mla`, vLLM 0.24+). On compute
capability 12.x upstream offers one sparse MLA backend,
FLASHINFER_MLA_SPARSE_SM120: bf16 activations, index_topk 2048 and an
fp8_ds_mla cache only, and only with a FlashInfer whose MLA decode takes the
`kv_scale_format=` it passes (0.6.14+; vLLM 0.24.0 / 0.25.x pin 0.6.12 /
0.6.13). TRITON_MLA_SPARSE runs decode and prefill rows alike over the
indexer's top-k tokens with one Triton kernel, bf16 or fp16 activations, on a
bf16/fp16 KV cache (or an fp8 e4m3 cache with a per-tensor scale).

Selection (maybe_select_triton_sparse_mla, called from
CudaPlatform.get_attn_backend_cls for sparse MLA layers): an explicit
`--attention-backend` always wins; `VLLM_TRITON_SPARSE_MLA=1` forces this
backend on any CUDA GPU; on 12.x it is chosen only where upstream's own
candidates give no backend that can run (none valid, or FlashInfer without the
SM12x sparse decode). Every other case keeps upstream's choice.

It plugs into the release's sparse MLA abstractions: the metadata builder and
metadata of upstream's SM12x backend (FlashInferMLASparseMetadataBuilder), and
from 0.26 the common sparse MLA implementation base (SparseMLACommonImpl);
0.24-0.25 have only the MQA-only SparseMLAAttentionImpl.
"""

import functools
import inspect
import os
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from vllm.config.cache import CacheDType
from vllm.logger import init_logger
from vllm.platforms.interface import DeviceCapability
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionLayer,
    AttentionType,
    MultipleOf,
)
from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import (
    FlashInferMLASparseMetadata,
    FlashInferMLASparseMetadataBuilder,
)

try:  # 0.26+: the common sparse MLA implementation base
    from vllm.model_executor.layers.attention.sparse_mla_attention import (
        SparseMLACommonImpl as _SparseImplBase,
    )

    _COMMON_IMPL = True
except ImportError:  # 0.24-0.25
    from vllm.v1.attention.backend import (  # type: ignore[assignment]
        SparseMLAAttentionImpl as _SparseImplBase,
    )

    _COMMON_IMPL = False

if TYPE_CHECKING:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

logger = init_logger(__name__)

TRITON_SPARSE_MLA_ENV = "VLLM_TRITON_SPARSE_MLA"
# Upstream's SM12x sparse backend, the one this falls back from.
SM12X_UPSTREAM_BACKEND = "FLASHINFER_MLA_SPARSE_SM120"
_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3")


def triton_sparse_mla_forced() -> bool:
    """`VLLM_TRITON_SPARSE_MLA=1` forces this backend for sparse MLA models."""
    return os.environ.get(TRITON_SPARSE_MLA_ENV, "0").strip().lower() in (
        "1",
        "true",
        "yes",
    )


def accepts_keyword(fn: Any, name: str) -> bool:
    """Whether `fn` can be called with keyword `name` (True if unknowable)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


@functools.cache
def flashinfer_sm12x_sparse_decode_usable() -> bool:
    """Whether the installed FlashInfer's MLA decode takes the call
    FLASHINFER_MLA_SPARSE_SM120 makes.

    Its `kv_scale_format=` (and the SM12x sparse dispatch behind it) first
    appear in FlashInfer 0.6.14; 0.6.12/0.6.13 (vLLM 0.24.0, 0.25.x) pass
    upstream's own availability check and raise TypeError at the first
    decode.
    """
    try:
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
    except Exception:  # noqa: BLE001 - not importable: upstream says unavailable
        return False
    return accepts_keyword(trtllm_batch_decode_with_kv_cache_mla, "kv_scale_format")


def maybe_select_triton_sparse_mla(
    platform_cls: Any,
    selected_backend: "AttentionBackendEnum | None",
    device_capability: DeviceCapability | None,
    attn_selector_config: Any,
    num_heads: int | None = None,
) -> "AttentionBackendEnum | None":
    """Backend to use for this sparse MLA layer on CUDA, given the user's choice
    (None: let upstream choose)."""
    if selected_backend is not None:
        return selected_backend
    if not (
        getattr(attn_selector_config, "use_mla", False)
        and getattr(attn_selector_config, "use_sparse", False)
    ):
        return None
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    ours = AttentionBackendEnum.TRITON_MLA_SPARSE
    if triton_sparse_mla_forced():
        logger.info_once(
            "%s=1: using TRITON_MLA_SPARSE for sparse MLA.", TRITON_SPARSE_MLA_ENV
        )
        return ours
    if device_capability is None or device_capability.major != 12:
        return None
    valid, invalid = platform_cls.get_valid_backends(
        device_capability=device_capability,
        attn_selector_config=attn_selector_config,
        num_heads=num_heads,
    )
    if valid:
        best = min(valid, key=lambda candidate: candidate.priority)
        if (
            best.backend.name != SM12X_UPSTREAM_BACKEND
            or flashinfer_sm12x_sparse_decode_usable()
        ):
            return None  # upstream's choice runs: keep it
        why = "the installed FlashInfer's MLA decode does not take kv_scale_format"
    else:
        why = "; ".join(
            f"{backend.name}: {', '.join(reasons)}"
            for backend, (_, reasons) in invalid.items()
        )
    reasons = TritonMLASparseBackend.validate_configuration(
        device_capability=device_capability, **attn_selector_config._asdict()
    )
    if reasons:
        return None  # ours cannot run it either: upstream reports the error
    logger.info_once(
        "No upstream sparse MLA backend can run this configuration on compute "
        "capability %s (%s); using TRITON_MLA_SPARSE.",
        device_capability.as_version_str(),
        why,
    )
    return ours


class TritonMLASparseBackend(AttentionBackend):
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[CacheDType]] = list(_KV_CACHE_DTYPES)

    @staticmethod
    def get_supported_kernel_block_sizes(
        kv_cache_spec: Any = None,
    ) -> list[int | MultipleOf]:
        # The kernel takes any page size that tiles by 64. The DSA indexer's cache shares the
        # MLA layer's KV-cache group and asks for its own size (DeepSeek V3.2 / GLM-5: exactly
        # 64; GLM-5.3-Flash's kpool indexer on 12.x: index_kpool * 64 = 1024 tokens, in a
        # hybrid-forced block of e.g. 5120): an exact [64] here left the group no common
        # kernel block ("No common block size") at KV-cache setup.
        return [MultipleOf(64)]

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
        # 576: DeepSeek V3.2 / GLM-5 latent layout, 512 NoPE + 64 RoPE.
        # 512: rope-free MLA (GLM-5.3-Flash, glm5_next: qk_rope_head_dim = 0),
        # the latent alone; the kernel then runs without its rope part.
        return [512, 576]

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability: DeviceCapability) -> bool:
        # Portable Triton kernel; automatic selection is limited to 12.x.
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
        use_mm_prefix: bool,
        device_capability: DeviceCapability,
    ) -> str | None:
        # A 16-bit cache is read in the activation dtype.
        cache_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            str(kv_cache_dtype)
        )
        if cache_dtype is not None and cache_dtype != dtype:
            return "kv_cache_dtype must match the activation dtype"
        return None

    # Asked by vLLM 0.24-0.28; from 0.29 the layout comes from the KV cache spec
    # ([blocks, block_size, 576 or 512] in the activation dtype, or fp8 e4m3).
    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,  # assumed to be 1 for MLA
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        return (num_blocks, block_size, head_size)


# The metadata of upstream's SM12x sparse backend: per-token request ids,
# block table, block size, top-k; the kernel needs nothing else.
TritonMLASparseMetadata = FlashInferMLASparseMetadata


class TritonMLASparseMetadataBuilder(FlashInferMLASparseMetadataBuilder):
    """Upstream's SM12x sparse metadata builder (from 0.26 on the common sparse
    MLA builder), under this backend."""


def convert_req_index_to_global_slot(
    req_id_per_token: torch.Tensor,
    block_table: torch.Tensor,
    token_indices: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """Per-request token positions [T, topk] -> global cache slots.

    slot = block_table[req, pos // block_size] * block_size + pos % block_size;
    -1 padding (and any position outside the block table) stays -1. Pure
    tensor ops: no host sync, so it can be captured in a CUDA graph. The
    kernel addresses slot // block_size through the cache's block stride, so
    blocks need not be adjacent.
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


def _is_hisparse(index_group: Any) -> bool:
    try:  # 0.30+
        from vllm.v1.attention.backends.mla.index_group import HiSparseMLAIndexGroup
    except ImportError:
        return False
    return isinstance(index_group, HiSparseMLAIndexGroup)


class TritonMLASparseImpl(_SparseImplBase[TritonMLASparseMetadata]):  # type: ignore[misc,valid-type]
    is_sparse = True
    # 0.28+: every row (prefill too) goes through the sparse kernel, as with
    # upstream's SM12x backend; upstream's dense-MHA prefill is not used.
    supports_dense_mha_prefill = False

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
        indexer: Any | None = None,
        **mla_args: Any,
    ) -> None:
        if any([alibi_slopes, sliding_window, logits_soft_cap]):
            raise NotImplementedError(
                "TRITON_MLA_SPARSE does not support alibi_slopes / "
                "sliding_window / logits_soft_cap"
            )
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                "TRITON_MLA_SPARSE only supports decoder self-attention"
            )
        if kv_cache_dtype not in _KV_CACHE_DTYPES:
            raise NotImplementedError(
                "TRITON_MLA_SPARSE supports a bf16/fp16 or fp8 (e4m3) KV cache, "
                f"not {kv_cache_dtype!r}"
            )
        # Layers that skip the indexer (index_topk_freq) get the shared
        # buffer through mla_args instead of an indexer.
        topk_indices_buffer = mla_args.pop("topk_indices_buffer", None)
        if _COMMON_IMPL:
            super().__init__(
                num_heads,
                head_size,
                scale,
                num_kv_heads,
                alibi_slopes,
                sliding_window,
                kv_cache_dtype,
                logits_soft_cap,
                attn_type,
                kv_sharing_target_layer_name,
                indexer=indexer,
                topk_indices_buffer=topk_indices_buffer,
                **mla_args,
            )
        else:
            self.num_heads = num_heads
            self.head_size = head_size
            self.scale = float(scale)
            self.num_kv_heads = num_kv_heads
            self.kv_cache_dtype = kv_cache_dtype
            self.kv_lora_rank: int = mla_args["kv_lora_rank"]
            self.topk_indices_buffer: torch.Tensor | None = (
                indexer.topk_indices_buffer
                if indexer is not None
                else topk_indices_buffer
            )
        self.softmax_scale = float(scale)
        self.supports_quant_query_input = False
        assert self.topk_indices_buffer is not None, (
            "TRITON_MLA_SPARSE needs the DSA indexer's top-k buffer"
        )

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: TritonMLASparseMetadata,
        layer: AttentionLayer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Decode and prefill rows alike: MQA over the latent cache
        # (576 = kv_lora_rank + rope, or 512 for rope-free MLA), restricted to
        # the top-k tokens.
        from vllm.v1.attention.ops.triton_sparse_mla import sparse_mla_attention

        if _is_hisparse(getattr(self, "index_group", None)):
            raise NotImplementedError("TRITON_MLA_SPARSE does not support HiSparse")
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        num_tokens = q.shape[0]
        assert self.topk_indices_buffer is not None
        topk_indices = self.topk_indices_buffer[:num_tokens]
        block_size = attn_metadata.block_size
        slots = convert_req_index_to_global_slot(
            attn_metadata.req_id_per_token[:num_tokens],
            attn_metadata.block_table,
            topk_indices,
            block_size,
        )
        kv_cache = kv_c_and_k_pe_cache
        if kv_cache.dim() != 3:
            kv_cache = kv_cache.view(-1, block_size, kv_cache.shape[-1])
        kwargs: dict[str, Any] = {}
        if self.kv_cache_dtype.startswith("fp8"):
            # The MLA layer hands over the fp8 view of the cache; the kernel
            # dequantizes with the layer's per-tensor scale.
            if kv_cache.dtype == torch.uint8:
                kv_cache = kv_cache.view(torch.float8_e4m3fn)
            kwargs["kv_scale"] = float(getattr(layer, "_k_scale_float", 1.0))
        elif kv_cache.dtype != q.dtype:
            raise ValueError(
                f"TRITON_MLA_SPARSE: KV cache dtype {kv_cache.dtype} must match "
                f"the query dtype {q.dtype}"
            )
        attn_out = sparse_mla_attention(
            q,
            kv_cache,
            slots,
            self.softmax_scale,
            kv_lora_rank=self.kv_lora_rank,
            **kwargs,
        )
        return attn_out, None
