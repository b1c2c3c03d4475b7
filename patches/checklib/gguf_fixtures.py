"""Tiny GGUF files for smoke checks, written the way llama.cpp's converter writes them.

Nothing here downloads anything: models are random tiny configs (seeded), converted to GGUF with
gguf-py. gguf-py has no K-quant quantizer, so Q4_K and Q5_K tensors are written as valid raw blocks
(256 values per block, rows of 256) and the HF reference values are the dequantized blocks; Q8_0,
Q4_0 and Q5_0 go through gguf-py's own quantizer.
For every quantized tensor the HF reference is set to what the file really holds, so a
correct loader must reproduce it exactly.

Checks import it as `from checklib import gguf_fixtures as gf`.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
from typing import Any

import numpy as np

Q: Any = None  # gguf.GGMLQuantizationType, bound lazily (gguf is imported after sys.path is set)

FLOAT_TYPES = ("F32", "F16", "BF16")


def _gguf() -> Any:
    """The gguf module (imported after sys.path is set), Q bound to its quant types."""
    import gguf

    global Q
    Q = gguf.GGMLQuantizationType
    return gguf


# ---------------------------------------------------------------------------------------------
# Raw quantized data
# ---------------------------------------------------------------------------------------------

# K-quant block parts after d and dmin (f16): 12 bytes of 6-bit scales/mins, Q5_K's 32 bytes of
# high bits, 128 bytes of low 4-bit quants (drawn one part at a time, as Q4_K always was)
_K_BLOCK_PARTS = {"Q4_K": (12, 128), "Q5_K": (12, 32, 128)}


def k_quant_blocks(rng: np.random.Generator, qtype: str, rows_shape: tuple[int, ...], cols: int) -> np.ndarray:
    """Valid raw Q4_K / Q5_K data: per block of 256 values d, dmin (f16, small and positive, so
    the values stay finite), then random scales and quants (144 / 176 bytes a block).
    Returns uint8 [..., cols/256*block bytes]."""
    assert cols % 256 == 0, f"{qtype} rows are made of 256-value blocks"
    nblocks = int(np.prod(rows_shape)) * (cols // 256)
    d = rng.uniform(0.002, 0.02, size=(nblocks, 1)).astype(np.float16)
    dmin = rng.uniform(0.0, 0.01, size=(nblocks, 1)).astype(np.float16)
    parts = [rng.integers(0, 256, size=(nblocks, n), dtype=np.uint8) for n in _K_BLOCK_PARTS[qtype]]
    raw = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), *parts], axis=1)
    return raw.reshape(*rows_shape, (cols // 256) * raw.shape[1])


def q4_k_blocks(rng: np.random.Generator, rows_shape: tuple[int, ...], cols: int) -> np.ndarray:
    """Valid raw Q4_K data (k_quant_blocks)."""
    return k_quant_blocks(rng, "Q4_K", rows_shape, cols)


def encode(rng: np.random.Generator, values: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(data to write, values the file really holds) for float `values` stored as `qtype`."""
    gguf = _gguf()
    if qtype == "F32":
        data = values.astype(np.float32)
        return data, data.copy()
    if qtype == "F16":
        data = values.astype(np.float16)
        return data, data.astype(np.float32)
    if qtype in ("Q8_0", "Q4_0", "Q5_0"):  # gguf-py quantizes these itself
        data = gguf.quants.quantize(values.astype(np.float32), getattr(Q, qtype))
        return data, gguf.quants.dequantize(data, getattr(Q, qtype)).astype(np.float32)
    if qtype in _K_BLOCK_PARTS:
        data = k_quant_blocks(rng, qtype, values.shape[:-1], values.shape[-1])
        return data, gguf.quants.dequantize(data, getattr(Q, qtype)).astype(np.float32)
    raise ValueError(qtype)


@dataclasses.dataclass
class Stored:
    gguf_name: str
    qtype: str
    values: np.ndarray  # what the file holds, dequantized, in the GGUF tensor's own layout


@dataclasses.dataclass
class TinyGGUF:
    path: pathlib.Path
    config: object  # transformers PretrainedConfig
    hf: dict  # HF checkpoint name -> np.float32 array (reference, equal to the file's content)
    stored: dict  # gguf name -> Stored
    # HF checkpoint name as vLLM's load_weights consumes it -> (gguf name, qtype)
    # routed experts appear as ...mlp.experts.0.{gate,up,down}_proj.weight (3-D), like vLLM's map
    ckpt: dict


def _writer(path: pathlib.Path, arch: str) -> Any:
    gguf = _gguf()
    w = gguf.GGUFWriter(str(path), arch)
    return w


def _write(w: Any, name: str, data: np.ndarray, qtype: str) -> None:
    if qtype in ("F32", "F16"):
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, data, raw_dtype=getattr(Q, qtype))


def _finish(w: Any) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------

MLA_DIMS = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=256,
    moe_intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=8,  # 8 heads: tensor parallel 2, 4 and 8 all get whole heads
    num_key_value_heads=8,
    q_lora_rank=256,
    kv_lora_rank=64,
    qk_nope_head_dim=32,  # != v_head_dim, like GLM-5 (192 vs 256): layout errors show
    qk_rope_head_dim=16,
    v_head_dim=48,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    max_position_embeddings=128,
)


def glm_dsa_config(**overrides: Any) -> Any:
    """overrides: config fields on top of the tiny dims (e.g. topk_method="noaux_tc", which GLM-5's
    config.json sets and vLLM reads to build the router's e_score_correction_bias)."""
    from transformers import GlmMoeDsaConfig

    return GlmMoeDsaConfig(**{**MLA_DIMS, "index_head_dim": 32, "index_n_heads": 4, "index_topk": 8, **overrides})


def deepseek_v3_config() -> Any:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(**MLA_DIMS)


def llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )


def hf_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# Conversion (llama.cpp's layout)
# ---------------------------------------------------------------------------------------------


# GGUF type per tensor (GLM-5 Q4_K_XL-like mix). Per-layer variations make the indexer's wk and
# weights_proj arrive in different types, and k_b/v_b quantized in one layer and not the other.
def _glm_type(gname: str, layer: int | None, overrides: dict | None = None) -> str:
    if gname.endswith((".bias",)) or "norm" in gname or "ffn_gate_inp" in gname:
        return "F32"
    if gname.startswith("token_embd"):
        return "F16"
    if gname.startswith("output"):
        return "Q8_0"
    kind = gname.split(".", 2)[2].rsplit(".", 1)[0]
    table = {
        "attn_q_a": "Q8_0",
        "attn_q_b": "Q4_K",
        "attn_kv_a_mqa": "Q8_0",
        "attn_output": "Q8_0",
        "attn_k_b": ("Q8_0", "F16"),
        "attn_v_b": ("F16", "F16"),
        "attn_kv_b": "Q8_0",
        "indexer.attn_q_b": "Q4_K",
        "indexer.attn_k": ("Q8_0", "F16"),
        "indexer.proj": ("F16", "Q4_K"),
        "ffn_gate": "Q4_K",
        "ffn_up": "Q4_K",
        "ffn_down": "Q4_K",
        "ffn_gate_exps": "Q4_K",
        "ffn_up_exps": "Q4_K",
        "ffn_down_exps": "Q4_K",
        "ffn_gate_shexp": "Q8_0",
        "ffn_up_shexp": "Q8_0",
        "ffn_down_shexp": "Q8_0",
    }
    t = (overrides or {}).get(kind, table[kind])
    if isinstance(t, tuple):
        assert layer is not None, f"{gname}: a per-layer type needs a layer"
        return t[layer % 2]
    return t


def build_mla_gguf(
    path: pathlib.Path,
    kind: str,
    seed: int = 0,
    split_kv_b: bool = True,
    drop: tuple[str, ...] = (),
    config_overrides: dict | None = None,
    type_overrides: dict | None = None,
) -> TinyGGUF:
    """kind: "glm-dsa" (GlmMoeDsaConfig) or "deepseek2" (DeepseekV3Config).

    config_overrides: extra config fields (glm-dsa only); type_overrides: {tensor kind: type or
    (layer 0 type, layer 1 type)} over the Q4_K_XL-like table of _glm_type, e.g. attn_q_a and
    attn_kv_a_mqa in different types (one fused vLLM parameter, one shard each)."""
    gguf = _gguf()
    config = glm_dsa_config(**(config_overrides or {})) if kind == "glm-dsa" else deepseek_v3_config()
    shapes = hf_shapes(config)
    rng = np.random.default_rng(seed)
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == kind)
    tmap = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    H = config.num_attention_heads
    nope, vdim, rank = config.qk_nope_head_dim, config.v_head_dim, config.kv_lora_rank
    I = config.moe_intermediate_size

    w = _writer(path, kind)
    hf: dict[str, np.ndarray] = {}
    stored: dict[str, Stored] = {}
    ckpt: dict[str, tuple[str, str]] = {}

    def put(gname: str, values: np.ndarray, layer: int | None, hf_name_for_ckpt: str | None) -> np.ndarray:
        qtype = _glm_type(gname, layer, type_overrides)
        data, held = encode(rng, values, qtype)
        if gname not in drop:
            _write(w, gname, data, qtype)
            stored[gname] = Stored(gname, qtype, held)
            if hf_name_for_ckpt is not None:
                ckpt[hf_name_for_ckpt] = (gname, qtype)
        return held

    for name, shape in shapes.items():
        values = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        pre = f"blk.{layer}." if layer is not None else ""
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H] -> gate, up [E, I, H]
            g = put(pre + "ffn_gate_exps.weight", values[:, :I], layer, f"model.layers.{layer}.mlp.experts.0.gate_proj.weight")
            u = put(pre + "ffn_up_exps.weight", values[:, I:], layer, f"model.layers.{layer}.mlp.experts.0.up_proj.weight")
            hf[name] = np.concatenate([g, u], axis=1)
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            hf[name] = put(pre + "ffn_down_exps.weight", values, layer, f"model.layers.{layer}.mlp.experts.0.down_proj.weight")
        elif name.endswith("self_attn.kv_b_proj.weight") and split_kv_b:
            # llama.cpp: view(H, nope + v, rank), split, k_b transposed to [H, rank, nope]
            kv = values.reshape(H, nope + vdim, rank)
            k_b = np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1))
            v_b = np.ascontiguousarray(kv[:, nope:, :])
            k_held = put(pre + "attn_k_b.weight", k_b, layer, None)
            v_held = put(pre + "attn_v_b.weight", v_b, layer, None)
            hf[name] = np.concatenate([k_held.transpose(0, 2, 1), v_held], axis=1).reshape(H * (nope + vdim), rank)
            ckpt[name] = ("attn_k_b+attn_v_b", "split")
        elif name.endswith("e_score_correction_bias"):
            hf[name] = put(pre + "exp_probs_b.bias", values, layer, name)
        else:
            base, suffix = name.rsplit(".", 1)
            gbase = tmap.get_name(base)
            assert gbase is not None, f"no GGUF name for {name}"
            hf[name] = put(f"{gbase}.{suffix}", values, layer, name)
    _finish(w)
    return TinyGGUF(path, config, hf, stored, ckpt)


def build_llama_gguf(path: pathlib.Path, seed: int = 0, drop: tuple[str, ...] = ()) -> TinyGGUF:
    gguf = _gguf()
    config = llama_config()
    shapes = hf_shapes(config)
    rng = np.random.default_rng(seed)
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    w = _writer(path, "llama")
    hf, stored, ckpt = {}, {}, {}
    for name, shape in shapes.items():
        values = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        base, suffix = name.rsplit(".", 1)
        gname = f"{tmap.get_name(base)}.{suffix}"
        qtype = "F32" if "norm" in gname else ("F16" if "token_embd" in gname else ("Q4_K" if shape[-1] % 256 == 0 else "Q8_0"))
        data, held = encode(rng, values, qtype)
        hf[name] = held
        if gname in drop:
            continue
        _write(w, gname, data, qtype)
        stored[gname] = Stored(gname, qtype, held)
        ckpt[name] = (gname, qtype)
    _finish(w)
    return TinyGGUF(path, config, hf, stored, ckpt)


# ---------------------------------------------------------------------------------------------
# Importing the engine tree (the rerun against the pristine release: checklib.pristine)
# ---------------------------------------------------------------------------------------------


def use_tree(tree: pathlib.Path, cache_dir: pathlib.Path) -> None:
    """Import vllm (or vllm_gguf_plugin) from `tree`; VLLM_CACHE_ROOT goes to a temp dir."""
    os.environ["VLLM_CACHE_ROOT"] = str(cache_dir)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    path = str(tree)
    if path not in sys.path:
        sys.path.insert(0, path)
