"""Runs inside a fresh interpreter with one vLLM source tree first on sys.path
(`python _glm5next_block_probe.py TREE CAP MLA_BACKEND [BLOCK_SIZE]`; the check calls run());
reports one result (checklib.probe).

The GLM-5.3-Flash (glm5_next) KV-cache block-size path of vLLM 0.33+, through the release's own
code on a CPU: a tiny glm5_next config with the real geometry (kv_lora_rank 512,
qk_rope_head_dim 0, index_kpool 16, KDA + DSA hybrid layers) written as a model folder; the real
ModelConfig / CacheConfig / VllmConfig built from it; then, with the CUDA platform standing in as
the current platform (capability CAP stubbed):
  1. `Platform.update_block_size_for_backend` (the start-up block-size choice: backend
     preference, the hybrid KDA/attention page alignment) with the attention backends the model's
     layers report: the MLA backend MLA_BACKEND (`sm120`: FLASHINFER_MLA_SPARSE_SM120, `triton`:
     our TRITON_MLA_SPARSE, where the tree has it), the kpool indexer (Glm5NextIndexerBackend)
     and its tail ring (KpoolTailBackend). The model is not built (a CPU has no kernels for it),
     so the layer -> backend list is given, not discovered;
  2. the layers' KV-cache specs as the model makes them (MLAAttentionSpec for the MLA layer,
     Glm5NextIndexerCache / Glm5NextTailCache get_kv_cache_spec for the indexer, the KDA MambaSpec
     from the model class's state shape), grouped by the release's get_kv_cache_groups;
  3. per group, the worker's kernel block size (select_common_block_size) for the backends of its
     layers: what the indexer's DeepGEMM paged-logits kernel receives is that kernel block over
     index_kpool tokens per state (DeepGEMM on arch 12 takes 32 or 64 states; vLLM declares 64).
Errors are reported, not raised.
"""

from __future__ import annotations

import sys
import tempfile

from checklib import probe, stubs

# Imported at module level by 0.33's model / attention packages; never called on this path.
MISSING_OK = (
    "uvloop",
    "prometheus_client",
    "xgrammar",
    "fastapi",
    "partial_json_parser",
    "llguidance",
    "torchvision",
    "compressed_tensors",
)


def _tiny_config_dir() -> str:
    from transformers import Glm5NextTextConfig

    # Real MLA / indexer / KDA geometry; few layers, tiny hidden and MoE (page sizes depend only
    # on the geometry kept: kv_lora_rank, rope dim, index head dim, kpool, KDA heads x head dim).
    cfg = Glm5NextTextConfig(
        num_hidden_layers=8,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        n_routed_experts=4,
        num_experts_per_tok=2,
        vocab_size=1024,
        pad_token_id=0,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=64,
        index_topk=64,
        index_n_heads=4,
        architectures=["Glm5NextForCausalLM"],
    )
    folder = tempfile.mkdtemp(prefix="glm5next-tiny-")
    cfg.save_pretrained(folder)
    return folder


def main() -> None:
    tree, cap_s, mla = sys.argv[1], sys.argv[2], sys.argv[3]
    user_block = int(sys.argv[4]) if len(sys.argv) > 4 else None
    sys.path.insert(0, tree)
    stubs.stub_missing(*MISSING_OK)
    stubs.install("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", kind="empty")
    stubs.install("vllm.v1.attention.backends.mla.cutlass_mla", kind="absent")
    stubs.install("vllm.vllm_flash_attn", kind="anything")
    import torch
    import vllm
    import vllm.model_executor.models.registry as registry
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    cap = tuple(int(x) for x in cap_s.split("."))
    CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(*cap))
    # The registry inspects a model class in a subprocess (to keep CUDA out of this one); the
    # stubs above do not reach it, and this CPU has no CUDA to protect.
    registry._run_in_subprocess = lambda fn: fn()

    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.config.vllm import set_current_vllm_config

    res: dict = {"vllm_file": vllm.__file__}
    mc = ModelConfig(model=_tiny_config_dir(), dtype="bfloat16", max_model_len=4096)
    model_cls, _ = registry.ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
    res["model"] = {
        "hybrid": bool(mc.is_hybrid),
        "mla": bool(mc.use_mla),
        "head_size": mc.get_head_size(),
        "model_type": mc.hf_text_config.model_type,
        "kpool": mc.hf_text_config.index_kpool,
    }

    # From here the CUDA platform is the current one: in vllm.platforms and in every module that
    # bound the (CPU-side) platform object at import.
    before = platforms.current_platform
    cuda = CudaPlatform()
    platforms._current_platform = cuda
    for mod in list(sys.modules.values()):
        if getattr(mod, "current_platform", None) is before:
            mod.current_platform = cuda

    cc = CacheConfig(block_size=user_block) if user_block else CacheConfig()
    vc = VllmConfig(model_config=mc, cache_config=cc, parallel_config=ParallelConfig())
    res["user_specified"] = bool(cc.user_specified_block_size)

    from vllm.v1.attention.backends.mla.indexer import Glm5NextIndexerBackend, KpoolTailBackend

    if mla == "sm120":
        from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import (
            FlashInferMLASparseSM120Backend as mla_backend,
        )
    else:
        try:
            from vllm.v1.attention.backends.mla.triton_mla_sparse import (
                TritonMLASparseBackend as mla_backend,
            )
        except ModuleNotFoundError as e:
            probe.emit({**res, "no_backend": str(e)})
            return
    backends = [mla_backend, Glm5NextIndexerBackend, KpoolTailBackend]
    CudaPlatform._find_non_ssm_backends = classmethod(lambda cls, vllm_config: list(backends))

    try:
        CudaPlatform.update_block_size_for_backend(vc)
        res["startup"] = {"ok": True, "block_size": cc.block_size}
    except Exception as e:  # noqa: BLE001 - reported to the check
        res["startup"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:1500]}
        probe.emit(res)
        return

    from vllm.models.glm5next.common.attention import Glm5NextIndexerCache, Glm5NextTailCache

    try:  # 0.33: planning split out of kv_cache_utils
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
    except ModuleNotFoundError:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    from vllm.v1.kv_cache_interface import MambaSpec, MLAAttentionSpec
    from vllm.v1.worker.utils import select_common_block_size

    hf = mc.hf_text_config
    if cc.mamba_block_size is None:
        cc.mamba_block_size = mc.max_model_len
    specs: dict = {}
    backend_of: dict = {}
    with set_current_vllm_config(vc):
        for i, kind in enumerate(hf.layer_types):
            base = f"model.layers.{i}.self_attn"
            if kind == "linear_attention":
                specs[base] = MambaSpec(
                    shapes=tuple(model_cls.get_mamba_state_shape_from_config(vc)),
                    dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vc)),
                    block_size=cc.mamba_block_size,
                    page_size_padded=cc.mamba_page_size_padded,
                )
                continue
            specs[f"{base}.attn"] = MLAAttentionSpec(
                block_size=cc.block_size,
                num_kv_heads=1,
                head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                dtype=torch.bfloat16,
                cache_dtype_str=cc.cache_dtype,
                is_index_group_leader=True,
            )
            backend_of[f"{base}.attn"] = mla_backend
            head = hf.index_head_dim + hf.index_head_dim // 128 * 4
            k_cache = Glm5NextIndexerCache(
                head_dim=head, dtype=torch.uint8, prefix=f"{base}.indexer.k_cache", cache_config=cc, index_kpool=hf.index_kpool
            )
            tail = Glm5NextTailCache(
                head_dim=hf.index_head_dim,
                dtype=torch.bfloat16,
                prefix=f"{base}.indexer.tail_cache",
                cache_config=cc,
                index_kpool=hf.index_kpool,
            )
            for layer, backend in ((k_cache, Glm5NextIndexerBackend), (tail, KpoolTailBackend)):
                try:
                    specs[layer.prefix] = layer.get_kv_cache_spec(vc)
                except Exception as e:  # noqa: BLE001
                    res["spec_error"] = f"{layer.prefix}: {type(e).__name__}: {e}"[:800]
                    probe.emit(res)
                    return
                backend_of[layer.prefix] = backend
        # As the engine core does before planning (core.py: resolve_kv_cache_layout with the
        # layouts every backend of the worker supports).
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )

        layouts = [m.name for m in get_supported_kv_cache_layouts(backends)]
        try:
            res["layout"] = str(resolve_kv_cache_layout(vc, [layouts], list(specs.values())))
            groups = get_kv_cache_groups(vc, specs)
        except Exception as e:  # noqa: BLE001
            res["groups_error"] = f"{type(e).__name__}: {e}"[:1500]
            probe.emit(res)
            return
        kernel = []
        for g in groups:
            names = [n for n in g.layer_names if n in backend_of]
            if not names:
                continue
            bs = sorted({backend_of[n] for n in names}, key=lambda b: b.get_name())
            gspecs = [specs[next(n for n in names if backend_of[n] is b)] for b in bs]
            entry = {"backends": [b.get_name() for b in bs], "block_size": g.kv_cache_spec.block_size}
            try:
                entry["kernel_block"] = select_common_block_size(g.kv_cache_spec.block_size, bs, gspecs)
                tps = getattr(gspecs[0], "tokens_per_state", 1)
                entry["states_per_kernel_block"] = int(entry["kernel_block"] // tps)
            except Exception as e:  # noqa: BLE001
                entry["error"] = f"{type(e).__name__}: {e}"[:800]
            kernel.append(entry)
    res["groups"] = kernel
    probe.emit(res)


if __name__ == "__main__":
    main()
