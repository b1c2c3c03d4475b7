"""Runs inside a fresh interpreter with one vLLM source tree first on sys.path
(`python _glm5next_tiny_model_probe.py TREE`; the check calls run()); reports one result
(checklib.probe).

A tiny random GLM-5.3-Flash (glm5_next) model built by the release's own model class on a CPU,
then loaded from a checkpoint transformers wrote:
  1. a Glm5NextTextConfig with the real MLA / indexer geometry (kv_lora_rank 512,
     qk_nope_head_dim 256, qk_rope_head_dim 0, index_kpool 16, KDA + DSA hybrid layer types) and a
     small width / depth / MoE / index_topk; the attributes vLLM's model reads that transformers'
     config does not define are set to stated guesses (GUESSED; the real config.json was not read);
  2. the CPU platform is the current one (the model builds on a CPU), except that the attention
     backend of a sparse layer is chosen by the release's CudaPlatform.get_attn_backend_cls with
     capability 12.0 stubbed (the CPU platform refuses sparse attention outright); the kernels are
     never run;
  3. transformers' own Glm5NextTextModel with random bf16 weights -> save_pretrained (safetensors);
     vLLM's Glm5NextForCausalLM.load_weights over those tensors (prefixed "model.", as the causal-LM
     wrapper names them, plus a random lm_head); a few parameters compared with their sources.
Errors are reported, not raised.
"""

from __future__ import annotations

import glob
import importlib
import sys
import tempfile
from typing import Any

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
# Read by vLLM's glm5_next model, absent from transformers' Glm5NextTextConfig: guesses. mhc=False
# because the hyper-connection path needs tilelang at construction (so no hc_* weights are loaded).
GUESSED = {
    "mhc": False,
    "mla_use_nope": True,
    "indexer_rope_interleave": False,
    "num_nextn_predict_layers": 0,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
}
MAX_LEN = 4096


def _config(transformers_cls: Any) -> Any:  # the release's class, imported late
    return transformers_cls(
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
        kv_lora_rank=512,
        qk_nope_head_dim=256,
        qk_rope_head_dim=0,
        architectures=["Glm5NextForCausalLM"],
        **GUESSED,
    )


def main() -> None:
    tree = sys.argv[1]
    sys.path.insert(0, tree)
    res: dict = {}
    try:
        from transformers import Glm5NextTextConfig
        from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextModel
    except ImportError as e:
        probe.emit({"no_transformers_class": str(e)})
        return
    stubs.stub_missing(*MISSING_OK)
    stubs.install("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C", kind="empty")
    stubs.install("vllm.v1.attention.backends.mla.cutlass_mla", kind="absent")
    stubs.install("vllm.vllm_flash_attn", kind="anything")
    import torch
    import vllm
    import vllm.model_executor.models.registry as registry
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    res["vllm_file"] = vllm.__file__
    cpu = CpuPlatform()
    platforms._current_platform = cpu
    for mod in list(sys.modules.values()):
        cur = getattr(mod, "current_platform", None)
        if cur is not None and cur is not cpu and not isinstance(cur, CpuPlatform):
            try:
                vars(mod)["current_platform"] = cpu
            except Exception:  # noqa: BLE001 - a module that refuses the attribute keeps its own
                pass
    CudaPlatform.get_device_capability = classmethod(lambda cls, device_id=0: DeviceCapability(12, 0))
    cpu_select = CpuPlatform.get_attn_backend_cls.__func__
    cuda_select = CudaPlatform.get_attn_backend_cls.__func__
    chosen: list = []

    def _select(cls: Any, selected_backend: Any, attn_selector_config: Any, num_heads: int | None = None) -> str:
        if attn_selector_config.use_sparse:
            got = cuda_select(CudaPlatform, selected_backend, attn_selector_config, num_heads)
            chosen.append({"head_size": attn_selector_config.head_size, "backend": got})
            return got
        return cpu_select(cls, selected_backend, attn_selector_config, num_heads)

    CpuPlatform.get_attn_backend_cls = classmethod(_select)
    # The registry inspects a model class in a subprocess; the stubs above do not reach it.
    registry._run_in_subprocess = lambda fn: fn()

    cfg = _config(Glm5NextTextConfig)
    folder = tempfile.mkdtemp(prefix="glm5next-tiny-model-")
    cfg.save_pretrained(folder)
    ckpt = tempfile.mkdtemp(prefix="glm5next-tiny-ckpt-")
    torch.manual_seed(0)
    Glm5NextTextModel(cfg).to(torch.bfloat16).save_pretrained(ckpt)
    import safetensors.torch as st

    sd: dict = {}
    for f in glob.glob(f"{ckpt}/*.safetensors"):
        sd.update(st.load_file(f))
    res["checkpoint"] = {"tensors": len(sd), "hc": sum(".hc_" in k for k in sd)}

    import vllm.triton_utils as triton_utils
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig
    from vllm.config.vllm import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    step = "config"
    try:
        mc = ModelConfig(model=folder, dtype="bfloat16", max_model_len=MAX_LEN)
        # The CPU platform turns prefix caching off for MLA after the hybrid config set
        # mamba_block_size = block_size, which VllmConfig then refuses; max_model_len is the value
        # it takes without prefix caching.
        # 0.34's CPU platform refuses an x86 machine without a working Triton while it checks the
        # config (its CPU model runner needs triton-cpu); this check builds the model and loads
        # weights and runs no kernel, so the flag is raised for that check alone. The model's
        # modules are imported first, so they keep the Triton vLLM found (its placeholder here).
        importlib.import_module("vllm.models.glm5next")
        has_triton, triton_utils.HAS_TRITON = triton_utils.HAS_TRITON, True
        try:
            vc = VllmConfig(
                model_config=mc,
                parallel_config=ParallelConfig(),
                cache_config=CacheConfig(enable_prefix_caching=False, mamba_block_size=MAX_LEN),
                device_config=DeviceConfig(device="cpu"),
            )
        finally:
            triton_utils.HAS_TRITON = has_triton
        hf = mc.hf_text_config
        res["model"] = {
            "hybrid": bool(mc.is_hybrid),
            "mla": bool(mc.use_mla),
            "head_size": mc.get_head_size(),
            "kv_lora_rank": hf.kv_lora_rank,
            "qk_rope_head_dim": hf.qk_rope_head_dim,
            "layer_types": list(hf.layer_types),
        }
        step = "build"
        with set_current_vllm_config(vc):
            init_distributed_environment(
                world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"file://{tempfile.mktemp()}"
            )
            initialize_model_parallel(1, 1)
            model_cls, _ = registry.ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
            # As vLLM's model loader does: parameters (and the layers' attention dtype) in the
            # model's dtype.
            torch.set_default_dtype(mc.dtype)
            with torch.device("cpu"):
                model = model_cls(vllm_config=vc, prefix="")
            torch.set_default_dtype(torch.float32)
            res["built"] = type(model).__name__
            layers = []
            for name, mod in model.named_modules():
                backend = getattr(mod, "attn_backend", None)
                if backend is not None and hasattr(mod, "impl"):
                    layers.append(
                        {
                            "name": name,
                            "backend": backend.get_name(),
                            "head_size": getattr(mod, "head_size", None),
                            "impl": type(mod.impl).__name__,
                        }
                    )
            res["attn_layers"], res["sparse_selections"] = layers, chosen
            step = "load"
            # hc_* (hyper-connection) tensors are written by transformers even with mhc off; the
            # model built without mhc has no parameters for them.
            w = [("model." + k, v) for k, v in sd.items() if ".hc_" not in k]
            w.append(("lm_head.weight", torch.randn(cfg.vocab_size, cfg.hidden_size, dtype=torch.bfloat16)))
            params = dict(model.named_parameters())
            loaded = set(model.load_weights(iter(w)))
            res["load"] = {
                "params": len(params),
                "loaded": len(loaded & set(params)),
                "missing": sorted(set(params) - loaded)[:20],
            }
            lay = next(i for i, t in enumerate(hf.layer_types) if t != "linear_attention")
            emb = params["model.embed_tokens.weight"].data
            w13 = params[f"model.layers.{lay}.mlp.experts.routed_experts.w13_weight"].data[1]
            qkv = params[f"model.layers.{lay}.self_attn.fused_qkv_a_proj.weight"].data
            pre = f"layers.{lay}."
            res["equal"] = {
                "embed_tokens": bool(torch.equal(emb, sd["embed_tokens.weight"][: emb.shape[0]])),
                "expert1_w13": bool(
                    torch.equal(
                        w13, torch.cat([sd[pre + "mlp.experts.1.gate_proj.weight"], sd[pre + "mlp.experts.1.up_proj.weight"]])
                    )
                ),
                "fused_qkv_a": bool(
                    torch.equal(
                        qkv, torch.cat([sd[pre + "self_attn.q_a_proj.weight"], sd[pre + "self_attn.kv_a_proj_with_mqa.weight"]])
                    )
                ),
            }
    except Exception as e:  # noqa: BLE001 - reported to the check
        res["error"] = {"step": step, "what": f"{type(e).__name__}: {e}"[:2000]}
    probe.emit(res)


if __name__ == "__main__":
    main()
