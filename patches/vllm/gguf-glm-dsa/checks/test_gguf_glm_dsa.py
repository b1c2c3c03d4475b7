"""CPU smoke checks for gguf-glm-dsa: GLM-5 (glm_moe_dsa) and split-k_b/v_b DeepSeek GGUFs load.

Tiny random models (seeded) are converted to GGUF the way llama.cpp does, then vLLM's own
GGUFModelLoader (imported from the release tree under test) maps and iterates them. No hub, no
GPU. test_pristine_release_fails (marked pristine_fails) runs these same checks against the
unpatched release and requires each patch-specific check to fail there for the bug it targets.
"""

from __future__ import annotations

import pathlib
import re
import types

import pytest

from checklib import gguf_fixtures as gf
from checklib.pristine import run_checks_on_pristine

torch = pytest.importorskip("torch")

FLOAT_MODULE = re.compile(r"model\.layers\.\d+\.self_attn\.(kv_b_proj|indexer\.(wq_b|wk|k_norm|weights_proj))\.(weight|bias)")
TP_SIZES = (2, 4, 8)


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gguf_loader(patched_tree, tmp_path_factory):
    gf.use_tree(patched_tree, tmp_path_factory.mktemp("vllm-cache"))
    from vllm.model_executor.model_loader import gguf_loader as module

    assert pathlib.Path(module.__file__).is_relative_to(patched_tree), module.__file__
    return module


@pytest.fixture(scope="session")
def loader(gguf_loader):
    obj = gguf_loader.GGUFModelLoader.__new__(gguf_loader.GGUFModelLoader)
    obj.load_config = types.SimpleNamespace(
        download_dir=None, ignore_patterns=None, model_loader_extra_config=None, load_format="gguf"
    )
    return obj


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return {
        "glm": gf.build_mla_gguf(d / "glm5-tiny.gguf", "glm-dsa", seed=1),
        "ds_split": gf.build_mla_gguf(d / "dsv3-split.gguf", "deepseek2", seed=2),
        "ds_legacy": gf.build_mla_gguf(d / "dsv3-legacy.gguf", "deepseek2", seed=3, split_kv_b=False),
        "llama": gf.build_llama_gguf(d / "llama-tiny.gguf", seed=4),
        "llama_missing": gf.build_llama_gguf(d / "llama-missing.gguf", seed=5, drop=("blk.1.ffn_norm.weight",)),
    }


def model_config(tiny: gf.TinyGGUF):
    return types.SimpleNamespace(
        model=str(tiny.path),
        model_weights=None,
        hf_config=tiny.config,
        trust_remote_code=False,
        revision=None,
        dtype=torch.float32,
        quantization="gguf",
    )


def ckpt_map(tiny: gf.TinyGGUF) -> dict[str, str]:
    """The GGUF -> HF map a correct loader builds (kv_b_proj only from a real attn_kv_b)."""
    m = {g: hf for hf, (g, qt) in tiny.ckpt.items() if qt != "split"}
    for layer in range(tiny.config.num_hidden_layers):
        m.setdefault(f"blk.{layer}.attn_kv_b.weight", f"model.layers.{layer}.self_attn.kv_b_proj.weight")
    return m


def expected_names(tiny: gf.TinyGGUF) -> set[str]:
    """Names vLLM's DeepseekV2/GlmMoeDsa load_weights consumes for this file."""
    out = set()
    for hf, (_, qtype) in tiny.ckpt.items():
        if qtype in gf.FLOAT_TYPES or qtype == "split" or FLOAT_MODULE.fullmatch(hf):
            out.add(hf)
        else:
            base = hf[: -len("weight")]
            out |= {base + "qweight", base + "qweight_type"}
    return out


def set_diff(got: set, want: set) -> str:
    return "unexpected: " + ", ".join(sorted(got - want)) + " | missing: " + ", ".join(sorted(want - got))


def iterate(loader, tiny, name_map=None) -> dict[str, torch.Tensor]:
    mc = model_config(tiny)
    name_map = ckpt_map(tiny) if name_map is None else name_map
    out = {}
    for name, tensor in loader._get_weights_iterator(mc, str(tiny.path), name_map):
        assert name not in out, f"{name} yielded twice"
        out[name] = tensor
    return out


@pytest.fixture(scope="session")
def glm_weights(loader, files):
    return iterate(loader, files["glm"])


# ---------------------------------------------------------------------------------------------
# GLM-5 (glm-dsa)
# ---------------------------------------------------------------------------------------------


def test_glm_map_covers_every_tensor(loader, files):
    tiny = files["glm"]
    m = loader._get_gguf_weights_map(model_config(tiny))
    assert not [k for k in m if k.endswith(".")], "empty-suffix map entries"
    split = {g for g in tiny.stored if re.fullmatch(r"blk\.\d+\.attn_[kv]_b\.weight", g)}
    assert split, "fixture must carry attn_k_b/attn_v_b"
    unmapped = sorted(set(tiny.stored) - split - set(m))
    assert not unmapped, f"GGUF tensors without a map entry: {unmapped}"
    for g, hf in ckpt_map(tiny).items():
        assert m.get(g) == hf, (g, m.get(g), hf)


def test_glm_iterator_yields_expected_names(loader, files, glm_weights):
    got, want = set(glm_weights), expected_names(files["glm"])
    assert got == want, set_diff(got, want)


def test_glm_kv_b_proj_rebuilt_equals_hf(files, glm_weights):
    tiny = files["glm"]
    for layer in range(tiny.config.num_hidden_layers):
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        assert name in glm_weights, f"{name} was not loaded (attn_k_b/attn_v_b skipped)"
        w = glm_weights[name]
        assert w.is_floating_point(), f"{name} arrives as {w.dtype}"
        torch.testing.assert_close(w.float(), torch.from_numpy(tiny.hf[name]), rtol=0, atol=0)


@pytest.mark.parametrize("tp", TP_SIZES)
def test_glm_kv_b_proj_tp_row_shards_hold_own_heads(files, glm_weights, tp):
    """ColumnParallelLinear gives rank r rows [r*n/tp, (r+1)*n/tp): they must be exactly
    the k and v rows of heads r*H/tp ... (r+1)*H/tp-1, read straight from attn_k_b/attn_v_b."""
    tiny = files["glm"]
    c = tiny.config
    H, nope, vdim = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim
    for layer in range(c.num_hidden_layers):
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        assert name in glm_weights, f"{name} was not loaded (attn_k_b/attn_v_b skipped)"
        w = glm_weights[name].float()
        k_b = torch.from_numpy(tiny.stored[f"blk.{layer}.attn_k_b.weight"].values)  # [H, rank, nope]
        v_b = torch.from_numpy(tiny.stored[f"blk.{layer}.attn_v_b.weight"].values)  # [H, v, rank]
        rows = w.shape[0] // tp
        for rank in range(tp):
            shard = w[rank * rows : (rank + 1) * rows].reshape(H // tp, nope + vdim, -1)
            for i, head in enumerate(range(rank * H // tp, (rank + 1) * H // tp)):
                assert torch.equal(shard[i, :nope], k_b[head].T), f"layer {layer} tp{tp} rank {rank}: k of head {head}"
                assert torch.equal(shard[i, nope:], v_b[head]), f"layer {layer} tp{tp} rank {rank}: v of head {head}"


def test_glm_indexer_weights_arrive_as_float(files, glm_weights):
    tiny = files["glm"]
    quantized_in_file = 0
    for layer in range(tiny.config.num_hidden_layers):
        for leaf in ("wq_b.weight", "wk.weight", "weights_proj.weight", "k_norm.weight", "k_norm.bias"):
            name = f"model.layers.{layer}.self_attn.indexer.{leaf}"
            quantized_in_file += tiny.ckpt[name][1] not in gf.FLOAT_TYPES
            yielded = sorted(k for k in glm_weights if ".indexer." in k and f"layers.{layer}." in k)
            assert name in glm_weights, f"{name} not yielded (got {yielded})"
            w = glm_weights[name]
            assert w.is_floating_point(), f"{name} arrives as {w.dtype}"
            torch.testing.assert_close(w.float(), torch.from_numpy(tiny.hf[name]), rtol=0, atol=0)
    assert quantized_in_file >= 3, "fixture must quantize some indexer weights"


def test_glm_load_model_builds_indexer_and_kv_b_unquantized(gguf_loader, loader, files, monkeypatch):
    """Runs the loader's load_model with the model construction stubbed (no device needed)."""
    tiny = files["glm"]
    want = expected_names(tiny)
    seen = {}

    class FakeModel(torch.nn.Module):
        def named_parameters(self, *a, **k):  # the parameters the model expects
            return iter([(n, None) for n in sorted(want)])

        def load_weights(self, weights):
            for n, t in weights:
                seen[n] = t
            return set(seen)

    monkeypatch.setattr(gguf_loader, "initialize_model", lambda **kw: FakeModel())
    monkeypatch.setattr(gguf_loader, "process_weights_after_loading", lambda *a, **k: None)
    quant = types.SimpleNamespace(unquantized_modules=[])
    vllm_config = types.SimpleNamespace(
        device_config=types.SimpleNamespace(device="cpu"), quant_config=quant, model_config=model_config(tiny)
    )
    loader.load_model(vllm_config, vllm_config.model_config)
    assert set(seen) == want, set_diff(set(seen), want)
    unquant = set(quant.unquantized_modules)
    for layer in range(tiny.config.num_hidden_layers):
        attn = f"model.layers.{layer}.self_attn"
        for module in (
            "kv_b_proj",
            "indexer.wq_b",
            "indexer.wk",
            "indexer.weights_proj",
            "indexer.k_norm",
            "indexer.wk_weights_proj",
        ):
            assert f"{attn}.{module}" in unquant, f"{attn}.{module} not in unquantized modules"


# ---------------------------------------------------------------------------------------------
# DeepSeek V3 (deepseek2): split k_b/v_b and legacy attn_kv_b
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["ds_split", "ds_legacy"])
def test_deepseek2_map_with_fused_experts(loader, files, key):
    tiny = files[key]
    m = loader._get_gguf_weights_map(model_config(tiny))
    assert not [k for k in m if k.endswith(".")], "empty-suffix map entries"
    for g, hf in ckpt_map(tiny).items():
        assert m.get(g) == hf, (g, m.get(g), hf)


@pytest.mark.parametrize("key", ["ds_split", "ds_legacy"])
def test_deepseek2_kv_b_proj_loaded_as_float(loader, files, key):
    tiny = files[key]
    weights = iterate(loader, tiny)
    assert set(weights) == expected_names(tiny), set_diff(set(weights), expected_names(tiny))
    for layer in range(tiny.config.num_hidden_layers):
        name = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        assert name in weights, f"{name} was not loaded"
        assert weights[name].is_floating_point()
        torch.testing.assert_close(weights[name].float(), torch.from_numpy(tiny.hf[name]), rtol=0, atol=0)
        H = tiny.config.num_attention_heads
        for tp in TP_SIZES:
            rows = weights[name].shape[0] // tp
            for rank in range(tp):
                want = tiny.hf[name].reshape(H, -1, tiny.config.kv_lora_rank)[rank * H // tp : (rank + 1) * H // tp]
                assert torch.equal(
                    weights[name][rank * rows : (rank + 1) * rows].float(), torch.from_numpy(want.reshape(rows, -1))
                ), (tp, rank)


# ---------------------------------------------------------------------------------------------
# Missing weights are an error; unrelated architectures load as before
# ---------------------------------------------------------------------------------------------


def llama_expected(tiny: gf.TinyGGUF) -> set[str]:
    out = set()
    for hf in tiny.hf:
        g, qtype = tiny.ckpt.get(hf, (None, None))
        if qtype is None or qtype in gf.FLOAT_TYPES:
            out.add(hf)
        else:
            out |= {hf[:-6] + "qweight", hf[:-6] + "qweight_type"}
    return out


class _Recorder(torch.nn.Module):
    def __init__(self, names):
        super().__init__()
        self.names = sorted(names)
        self.seen = {}

    def named_parameters(self, *a, **k):
        return iter([(n, None) for n in self.names])

    def load_weights(self, weights):
        for n, t in weights:
            self.seen[n] = t
        return set(self.seen)


def test_missing_weight_is_an_error_naming_the_parameter(loader, files):
    tiny = files["llama_missing"]
    model = _Recorder(llama_expected(tiny))
    with pytest.raises(ValueError, match=re.escape("model.layers.1.post_attention_layernorm.weight")):
        loader.load_weights(model, model_config(tiny))


def test_llama_loads_as_before(loader, files):
    """Regression guard: passes on the pristine release too."""
    tiny = files["llama"]
    model = _Recorder(llama_expected(tiny))
    loader.load_weights(model, model_config(tiny))
    assert set(model.seen) == llama_expected(tiny), set_diff(set(model.seen), llama_expected(tiny))
    for hf, (_g, qtype) in tiny.ckpt.items():
        if qtype in gf.FLOAT_TYPES:
            torch.testing.assert_close(model.seen[hf].float(), torch.from_numpy(tiny.hf[hf]), rtol=0, atol=0)
        else:
            assert model.seen[hf[:-6] + "qweight"].dtype == torch.uint8
            assert int(model.seen[hf[:-6] + "qweight_type"]) == int(getattr(gf.Q, qtype))


# ---------------------------------------------------------------------------------------------
# Routed experts whose gate and up differ in type are refused
# ---------------------------------------------------------------------------------------------

# equal row widths in bytes first (Q4_K / Q4_0: 144 per 256 values, Q5_K / Q5_0: 176): the fused
# w13 takes both shards and only its single type is wrong; Q8_0 / Q4_K differ in width
MIXED_EXPERTS = [("Q4_K", "Q4_0"), ("Q5_K", "Q5_0"), ("Q4_0", "Q4_K"), ("Q8_0", "Q4_K")]


@pytest.mark.parametrize("gate,up", MIXED_EXPERTS, ids=[f"{g}-{u}" for g, u in MIXED_EXPERTS])
def test_mixed_expert_types_refused_at_load(loader, tmp_path, gate, up):
    tiny = gf.build_mla_gguf(
        tmp_path / "glm5-mixed-experts.gguf", "glm-dsa", seed=21, type_overrides={"ffn_gate_exps": gate, "ffn_up_exps": up}
    )
    moe_layers = [i for i in range(tiny.config.num_hidden_layers) if f"blk.{i}.ffn_gate_exps.weight" in tiny.stored]
    assert moe_layers, "fixture must have routed experts"
    model = _Recorder(expected_names(tiny))
    with pytest.raises(ValueError) as err:
        loader.load_weights(model, model_config(tiny))
    message = str(err.value)
    for i in moe_layers:
        assert f"layer {i}: blk.{i}.ffn_gate_exps.weight is {gate}, blk.{i}.ffn_up_exps.weight is {up}" in message, message
    assert "one type for ffn_gate_exps and ffn_up_exps" in message, message
    assert not model.seen, "weights reached the model before the refusal"


def test_fused_moe_keeps_one_w13_type(gguf_loader):
    """Why such a file is refused rather than loaded: the release's FusedMoE.weight_loader keeps
    one GGUF type for w13, the last shard's (gate Q4_K then up Q4_0 leaves Q4_0 for both halves),
    and GGUFMoEMethod.apply hands that one type to the MoE kernels. Passes on the pristine release
    too; fails once vLLM keeps a type per w13 shard."""
    from vllm.model_executor.layers.fused_moe.layer import FusedMoE

    # the attributes weight_loader reads before its GGUF type branch
    standin = types.SimpleNamespace(
        quant_config=types.SimpleNamespace(get_name=lambda: "gguf"),
        quant_method=object(),
        _map_global_expert_id_to_local_expert_id=lambda expert_id: expert_id,
    )
    param = torch.nn.Parameter(torch.empty(1, dtype=torch.uint8), requires_grad=False)
    param.is_gguf_weight_type = True
    param.weight_type = 0
    Q = gf._gguf().GGMLQuantizationType
    for shard_id, qtype in (("w1", Q.Q4_K), ("w3", Q.Q4_0)):
        FusedMoE.weight_loader(
            standin,
            param,
            torch.tensor(int(qtype), dtype=torch.uint8),
            "experts.w13_qweight_type",
            shard_id=shard_id,
            expert_id=0,
        )
    assert param.weight_type == int(Q.Q4_0), param.weight_type


# ---------------------------------------------------------------------------------------------
# The same checks on the pristine release
# ---------------------------------------------------------------------------------------------

# test -> text its failure must contain on the unpatched release (the bug it targets)
PRISTINE_FAILS = {
    "test_glm_map_covers_every_tensor": "Unknown gguf model_type: glm_moe_dsa",
    "test_glm_iterator_yields_expected_names": "qweights_proj",
    "test_glm_kv_b_proj_rebuilt_equals_hf": "kv_b_proj.weight was not loaded",
    **{f"test_glm_kv_b_proj_tp_row_shards_hold_own_heads[{tp}]": "kv_b_proj.weight was not loaded" for tp in TP_SIZES},
    "test_glm_indexer_weights_arrive_as_float": "not yielded",
    "test_glm_load_model_builds_indexer_and_kv_b_unquantized": "Unknown gguf model_type: glm_moe_dsa",
    "test_deepseek2_map_with_fused_experts[ds_split]": "Failed to map GGUF parameters",
    "test_deepseek2_map_with_fused_experts[ds_legacy]": "Failed to map GGUF parameters",
    "test_deepseek2_kv_b_proj_loaded_as_float[ds_split]": "kv_b_proj.weight",
    "test_deepseek2_kv_b_proj_loaded_as_float[ds_legacy]": "kv_b_proj.qweight",
    "test_missing_weight_is_an_error_naming_the_parameter": "DID NOT RAISE",
    # the unpatched release cannot map a GLM-5 file at all (what a mixed file would meet there:
    # test_fused_moe_keeps_one_w13_type)
    **{f"test_mixed_expert_types_refused_at_load[{g}-{u}]": "Unknown gguf model_type: glm_moe_dsa" for g, u in MIXED_EXPERTS},
}
PRISTINE_PASSES = {"test_llama_loads_as_before", "test_fused_moe_keeps_one_w13_type"}


@pytest.mark.pristine_fails
def test_pristine_release_fails(pristine_tree, tmp_path):
    results = run_checks_on_pristine(pathlib.Path(__file__).parent, pristine_tree, tmp_path)
    problems = []
    for test, needle in PRISTINE_FAILS.items():
        outcome, message = results.get(test, ("absent", ""))
        if outcome != "failed" or needle not in message:
            problems.append(f"{test}: {outcome}, expected a failure mentioning {needle!r}: {message[:300]}")
    for test in PRISTINE_PASSES:
        outcome, message = results.get(test, ("absent", ""))
        if outcome != "passed":
            problems.append(f"{test}: {outcome} on pristine (must be unaffected): {message[:300]}")
    assert not problems, "\n".join(problems)
