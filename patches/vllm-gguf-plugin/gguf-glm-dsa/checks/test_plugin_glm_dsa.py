"""CPU smoke checks for vllm-gguf-plugin gguf-glm-dsa (GLM-5 / split k_b,v_b DeepSeek GGUFs).

The plugin imports vLLM: point PATCHCTL_VLLM_TREE at an extracted vLLM source tree (>= 0.24, or
any release whose vllm.logger / vllm.config import on the CPU), or have vllm importable. Its
Triton kernels (vllm_gguf_plugin.ops, .quantization) need a GPU stack and are not exercised here:
the package __init__ is not run and those two modules are stubs (checklib.stubs), so that the
weight adapter, weight_utils and loader modules can be imported from the tree under test.
test_pristine_release_fails (marked pristine_fails) runs these same checks against the unpatched
release and requires each of them to fail there for the bug it targets.
"""
from __future__ import annotations

import importlib
import os
import pathlib
import re
import types

import pytest

from checklib import gguf_fixtures as gf
from checklib import stubs
from checklib.pristine import run_checks_on_pristine

torch = pytest.importorskip("torch")
TP_SIZES = (2, 4, 8)


@pytest.fixture(scope="session")
def plugin(patched_tree, tmp_path_factory):
    vllm_tree = os.environ.get("PATCHCTL_VLLM_TREE")
    if vllm_tree:
        gf.use_tree(pathlib.Path(vllm_tree), tmp_path_factory.mktemp("vllm-cache"))
    else:
        os.environ["VLLM_CACHE_ROOT"] = str(tmp_path_factory.mktemp("vllm-cache"))
    try:
        importlib.import_module("vllm.logger")
    except ImportError as exc:
        pytest.skip(f"vllm not importable (set PATCHCTL_VLLM_TREE to an extracted vLLM tree): {exc}")
    stubs.package_without_init("vllm_gguf_plugin", patched_tree / "vllm_gguf_plugin")
    stubs.install("vllm_gguf_plugin.ops", "vllm_gguf_plugin.quantization")
    default = importlib.import_module("vllm_gguf_plugin.weights_adapter.default")
    loader = importlib.import_module("vllm_gguf_plugin.loader")
    assert pathlib.Path(default.__file__).is_relative_to(patched_tree)
    return types.SimpleNamespace(default=default, loader=loader)


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return {
        "glm": gf.build_mla_gguf(d / "glm5-tiny.gguf", "glm-dsa", seed=1),
        "ds_split": gf.build_mla_gguf(d / "dsv3-split.gguf", "deepseek2", seed=2),
        "llama_missing": gf.build_llama_gguf(d / "llama-missing.gguf", seed=5,
                                             drop=("blk.1.ffn_norm.weight",)),
    }


def model_config(tiny):
    return types.SimpleNamespace(model=str(tiny.path), model_weights=None, hf_config=tiny.config,
                                 trust_remote_code=False, revision=None, dtype=torch.float32)


def load(plugin, tiny):
    adapter = plugin.default.GGUFWeightsAdapter(tiny.config)
    mc = model_config(tiny)
    adapter.config = mc.hf_config
    adapter.load_spec = None
    # prepare_loading = patch_hf_config (GGUF metadata) + name map + type map; the tiny files
    # carry no llama.cpp metadata, so the config is taken as is
    adapter.patch_hf_config = lambda path, cfg: cfg
    spec = adapter.prepare_loading(str(tiny.path), mc)
    weights = {}
    for name, tensor in adapter.prepare_weights(mc):
        assert name not in weights, f"{name} yielded twice"
        weights[name] = tensor
    return spec, weights


@pytest.fixture(scope="session")
def glm(plugin, files):
    return load(plugin, files["glm"])


def test_glm_map_covers_every_tensor(glm, files):
    spec, _ = glm
    m = spec.gguf_to_hf_name_map
    assert not [k for k in m if k.endswith(".")], "empty-suffix map entries"
    split = {g for g in files["glm"].stored if re.fullmatch(r"blk\.\d+\.attn_[kv]_b\.weight", g)}
    assert not sorted(set(files["glm"].stored) - split - set(m))


def test_glm_indexer_float_and_suffix_only(glm, files):
    spec, weights = glm
    tiny = files["glm"]
    assert not [n for n in weights if "qweights_proj" in n]
    for layer in range(tiny.config.num_hidden_layers):
        attn = f"model.layers.{layer}.self_attn"
        for leaf in ("wq_b.weight", "wk.weight", "weights_proj.weight", "k_norm.weight", "k_norm.bias"):
            name = f"{attn}.indexer.{leaf}"
            assert name in weights and weights[name].is_floating_point(), name
            torch.testing.assert_close(weights[name].float(), torch.from_numpy(tiny.hf[name]), rtol=0, atol=0)
        for module in ("kv_b_proj", "indexer.wq_b", "indexer.wk", "indexer.weights_proj",
                       "indexer.k_norm", "indexer.wk_weights_proj"):
            assert f"{attn}.{module}" in spec.unquantized_modules, module


@pytest.mark.parametrize("key", ["glm", "ds_split"])
def test_kv_b_proj_rebuilt_and_tp_shards(plugin, files, key):
    tiny = files[key]
    _, weights = load(plugin, tiny)
    c = tiny.config
    H, nope = c.num_attention_heads, c.qk_nope_head_dim
    for layer in range(c.num_hidden_layers):
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        assert name in weights, f"{name} was not loaded"
        w = weights[name].float()
        torch.testing.assert_close(w, torch.from_numpy(tiny.hf[name]), rtol=0, atol=0)
        k_b = torch.from_numpy(tiny.stored[f"blk.{layer}.attn_k_b.weight"].values)
        v_b = torch.from_numpy(tiny.stored[f"blk.{layer}.attn_v_b.weight"].values)
        for tp in TP_SIZES:
            rows = w.shape[0] // tp
            for rank in range(tp):
                shard = w[rank * rows:(rank + 1) * rows].reshape(H // tp, -1, c.kv_lora_rank)
                heads = range(rank * H // tp, (rank + 1) * H // tp)
                assert torch.equal(shard[:, :nope], torch.stack([k_b[h].T for h in heads])), (tp, rank)
                assert torch.equal(shard[:, nope:], torch.stack([v_b[h] for h in heads])), (tp, rank)


def test_missing_weight_is_an_error_naming_the_parameter(plugin, files):
    tiny = files["llama_missing"]
    expected = {"model.layers.1.post_attention_layernorm.weight", "model.norm.weight"}

    class Fake(torch.nn.Module):
        def named_parameters(self, *a, **k):
            return iter([(n, None) for n in sorted(expected)])

        def load_weights(self, weights):
            return {n for n, _ in weights}

    obj = plugin.loader.GGUFModelLoader.__new__(plugin.loader.GGUFModelLoader)
    obj.load_config = types.SimpleNamespace(download_dir=None, ignore_patterns=None)
    with pytest.raises(ValueError, match=re.escape("model.layers.1.post_attention_layernorm.weight")):
        obj.load_weights(Fake(), model_config(tiny))


PRISTINE_FAILS = {
    "test_glm_map_covers_every_tensor": "Unknown gguf model_type: glm_moe_dsa",
    "test_glm_indexer_float_and_suffix_only": "Unknown gguf model_type: glm_moe_dsa",
    "test_kv_b_proj_rebuilt_and_tp_shards[glm]": "Unknown gguf model_type: glm_moe_dsa",
    "test_kv_b_proj_rebuilt_and_tp_shards[ds_split]": "Failed to map GGUF parameters",
    "test_missing_weight_is_an_error_naming_the_parameter": "DID NOT RAISE",
}


@pytest.mark.pristine_fails
def test_pristine_release_fails(pristine_tree, tmp_path, plugin):
    results = run_checks_on_pristine(pathlib.Path(__file__).parent, pristine_tree, tmp_path)
    problems = []
    for test, needle in PRISTINE_FAILS.items():
        outcome, message = results.get(test, ("absent", ""))
        # "error": the shared fixture that loads the GLM file raised (setup of the test)
        if outcome not in ("failed", "error") or needle not in message:
            problems.append(f"{test}: {outcome}, expected a failure mentioning {needle!r}: {message[:300]}")
    assert not problems, "\n".join(problems)
