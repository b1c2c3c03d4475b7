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
import json
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest
import yaml

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
    importlib.import_module("_glm5_model_probe").serving_standins()
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
        "llama_missing": gf.build_llama_gguf(d / "llama-missing.gguf", seed=5, drop=("blk.1.ffn_norm.weight",)),
    }


def model_config(tiny):
    return types.SimpleNamespace(
        model=str(tiny.path),
        model_weights=None,
        hf_config=tiny.config,
        trust_remote_code=False,
        revision=None,
        dtype=torch.float32,
    )


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
        for module in (
            "kv_b_proj",
            "indexer.wq_b",
            "indexer.wk",
            "indexer.weights_proj",
            "indexer.k_norm",
            "indexer.wk_weights_proj",
        ):
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
                shard = w[rank * rows : (rank + 1) * rows].reshape(H // tp, -1, c.kv_lora_rank)
                heads = range(rank * H // tp, (rank + 1) * H // tp)
                assert torch.equal(shard[:, :nope], torch.stack([k_b[h].T for h in heads])), (tp, rank)
                assert torch.equal(shard[:, nope:], torch.stack([v_b[h] for h in heads])), (tp, rank)


# Routed experts with gate and up in different types: the first two pairs have equal row widths
# in bytes (Q4_K / Q4_0: 144 bytes per 256 values, Q5_K / Q5_0: 176), so the fused w13 takes both
# shards and only its single type is wrong; Q8_0 / Q4_K differ in width (272 vs 144).
MIXED_EXPERTS = [("Q4_K", "Q4_0"), ("Q5_K", "Q5_0"), ("Q4_0", "Q4_K"), ("Q8_0", "Q4_K")]


@pytest.mark.parametrize("gate,up", MIXED_EXPERTS, ids=[f"{g}-{u}" for g, u in MIXED_EXPERTS])
def test_mixed_expert_types_refused_at_load(plugin, tmp_path, gate, up):
    tiny = gf.build_mla_gguf(
        tmp_path / "glm5-mixed-experts.gguf", "glm-dsa", seed=21, type_overrides={"ffn_gate_exps": gate, "ffn_up_exps": up}
    )
    moe_layers = [i for i in range(tiny.config.num_hidden_layers) if f"blk.{i}.ffn_gate_exps.weight" in tiny.stored]
    assert moe_layers, "fixture must have routed experts"
    with pytest.raises(ValueError) as err:
        load(plugin, tiny)
    message = str(err.value)
    for i in moe_layers:
        assert f"layer {i}: blk.{i}.ffn_gate_exps.weight is {gate}, blk.{i}.ffn_up_exps.weight is {up}" in message, message
    assert "one type for ffn_gate_exps and ffn_up_exps" in message, message


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


# ---------------------------------------------------------------------------------------------
# The real GLM-5 model classes (one process per companion vLLM tree: _glm5_model_probe.py)
# ---------------------------------------------------------------------------------------------

HERE = pathlib.Path(__file__).resolve().parent
COMPANIONS = tuple(ref.split("@", 1)[1] for ref in yaml.safe_load((HERE.parent / "patch.yaml").read_text())["smoke"]["with"])
# the files _glm5_model_probe.py loads (its VARIANTS)
PROBE_VARIANTS = ("standard", "mixed", "mixed_experts", "mixed_experts_unguarded")
# the class GlmMoeDsaForCausalLM resolves to on CUDA: deepseek_v2's subclass up to 0.28, the DSA
# model package's own implementation from 0.29
DSA_PACKAGE_FROM = (0, 29)


def _tree_version(tree: str) -> str | None:
    found = (
        re.search(r"^__version__ = version = '([^']+)'", (pathlib.Path(tree) / "vllm" / "_version.py").read_text(), re.M)
        if (pathlib.Path(tree) / "vllm" / "_version.py").is_file()
        else None
    )
    return found.group(1) if found else None


def companion_trees() -> dict[str, str]:
    """{version: tree} from PATCHCTL_VLLM_TREES ("VERSION=PATH" entries, os.pathsep between them,
    one per `smoke.with`) and PATCHCTL_VLLM_TREE (version read from the tree)."""
    trees = {}
    for entry in filter(None, os.environ.get("PATCHCTL_VLLM_TREES", "").split(os.pathsep)):
        version, _, tree = entry.partition("=")
        trees[version] = tree
    single = os.environ.get("PATCHCTL_VLLM_TREE")
    if single and _tree_version(single):
        trees.setdefault(_tree_version(single), single)
    return trees


@pytest.fixture(scope="session")
def real_models(patched_tree, tmp_path_factory):
    """{vllm version: {variant: report}}, the probes of every companion tree run side by side."""
    out = tmp_path_factory.mktemp("glm5-real-models")
    trees = {v: t for v, t in companion_trees().items() if v in COMPANIONS}
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(pathlib.Path(gf.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]),
    )
    procs = {
        v: subprocess.Popen(
            [sys.executable, str(HERE / "_glm5_model_probe.py"), tree, str(patched_tree), str(out / f"{v}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for v, tree in trees.items()
    }
    reports = {}
    for version, proc in procs.items():
        log = proc.communicate(timeout=900)[0]
        path = out / f"{version}.json"
        reports[version] = (
            json.loads(path.read_text()) if path.is_file() else {variant: {"error": log[-3000:]} for variant in PROBE_VARIANTS}
        )
    return reports


def _real_report(real_models, version, variant):
    if version not in real_models:
        pytest.skip(
            f"no companion tree for vllm@{version}: smoke passes it in PATCHCTL_VLLM_TREES "
            f"(have: {sorted(real_models) or 'none'})"
        )
    r = real_models[version].get(variant, {"error": f"the probe reported no {variant!r} variant"})
    if r.get("plugin_incompatible"):
        pytest.skip(f"this plugin release does not import against vLLM {version}: {r['plugin_incompatible']}")
    return r


LOADING_VARIANTS = ("standard", "mixed")


@pytest.mark.parametrize("variant", LOADING_VARIANTS)
@pytest.mark.parametrize("version", COMPANIONS)
def test_real_glm5_model_takes_exactly_the_plugin_weights(real_models, version, variant):
    """The names the patched plugin yields for a llama.cpp GLM-5 GGUF are exactly what the
    release's GLM-5 model consumes in load_weights, and every parameter holds the file's value.
    "mixed": attn_q_a / attn_kv_a_mqa (and the shared expert's gate / up) in different types."""
    r = _real_report(real_models, version, variant)
    assert r["error"] is None, r["error"]
    assert r["vllm_version"] == version
    new = tuple(int(x) for x in version.split(".")[:2]) >= DSA_PACKAGE_FROM
    assert r["model_class"] == (
        "vllm.models.deepseek_v32.nvidia.model.DeepseekV32ForCausalLM"
        if new
        else "vllm.model_executor.models.deepseek_v2.GlmMoeDsaForCausalLM"
    )
    params = set(r["params"])
    assert set(r["loaded"]) == params, (sorted(params - set(r["loaded"])), sorted(set(r["loaded"]) - params))
    assert not r["unconsumed"], f"yielded but taken by no weight loader: {r['unconsumed']}"
    assert not r["value_mismatches"], r["value_mismatches"]
    # every parameter but the type tags was compared (fused GGUF ones once per shard)
    values = {c.split(" ")[0].split("[")[0] for c in r["values_checked"]}
    assert {p for p in params if not p.endswith("qweight_type")} <= values
    for fused in ("fused_qkv_a_proj", "indexer.wk_weights_proj"):
        assert any(fused in p for p in params), f"{fused} is not a parameter of {r['model_class']}"


@pytest.mark.parametrize("version", COMPANIONS)
def test_real_glm5_mixed_expert_types_refused(real_models, version):
    """Routed experts' ffn_gate_exps Q4_K and ffn_up_exps Q4_0 (equal row width): load_model stops
    with the refusal naming both tensors and types, before any weight reaches the model."""
    r = _real_report(real_models, version, "mixed_experts")
    assert r["file_types"]["blk.1.ffn_gate_exps.weight"] == "Q4_K", r["file_types"]
    assert r["file_types"]["blk.1.ffn_up_exps.weight"] == "Q4_0", r["file_types"]
    assert r["error"] is not None, f"loaded without an error; value mismatches: {r.get('value_mismatches')}"
    assert r["error"].startswith("ValueError: GGUF routed experts store gate and up in different types"), r["error"]
    assert "layer 1: blk.1.ffn_gate_exps.weight is Q4_K, blk.1.ffn_up_exps.weight is Q4_0" in r["error"]
    assert not r["yielded"], "weights reached the model before the refusal"


@pytest.mark.parametrize("version", COMPANIONS)
def test_real_glm5_moe_keeps_one_w13_type(real_models, version):
    """Why the file is refused rather than loaded: the same file with the refusal switched off
    loads without an error into the release's GLM-5 model, and the routed experts' fused w13
    carries one quant type (the gate's, Q4_K) for both halves, so the up half (Q4_0 in the file)
    would be decoded as Q4_K. When the plugin keeps a type per w13 shard, this check fails:
    then the refusal can give way to loading the file."""
    r = _real_report(real_models, version, "mixed_experts_unguarded")
    assert r["error"] is None, r["error"]
    q4_k = int(gf._gguf().GGMLQuantizationType.Q4_K)
    # the only mismatch: both halves' bytes are where the kernels read them, the type is one
    want = re.compile(rf"model\.layers\.1\.mlp\.experts\.(\w+\.)?w13_qweight: type {q4_k}, file has Q4_0")
    assert len(r["value_mismatches"]) == 1 and want.fullmatch(r["value_mismatches"][0]), r["value_mismatches"]


PRISTINE_FAILS = {
    "test_glm_map_covers_every_tensor": "Unknown gguf model_type: glm_moe_dsa",
    "test_glm_indexer_float_and_suffix_only": "Unknown gguf model_type: glm_moe_dsa",
    "test_kv_b_proj_rebuilt_and_tp_shards[glm]": "Unknown gguf model_type: glm_moe_dsa",
    "test_kv_b_proj_rebuilt_and_tp_shards[ds_split]": "Failed to map GGUF parameters",
    "test_missing_weight_is_an_error_naming_the_parameter": "DID NOT RAISE",
    # the unpatched plugin cannot map a GLM-5 file at all (a mixed-type file of a model it maps
    # loads silently: test_real_glm5_moe_keeps_one_w13_type shows it on the patched loader)
    **{f"test_mixed_expert_types_refused_at_load[{g}-{u}]": "Unknown gguf model_type: glm_moe_dsa" for g, u in MIXED_EXPERTS},
}
REAL_PRISTINE_FAILS = "Unknown gguf model_type: glm_moe_dsa"


@pytest.mark.pristine_fails
def test_pristine_release_fails(pristine_tree, tmp_path, plugin, real_models):
    results = run_checks_on_pristine(pathlib.Path(__file__).parent, pristine_tree, tmp_path)
    problems = []
    expected = dict(PRISTINE_FAILS)
    # the real-model checks, where they ran on the patched plugin (a tree was passed, the plugin
    # release imports against it)
    ran = [v for v, reports in real_models.items() if not any(r.get("plugin_incompatible") for r in reports.values())]
    expected.update(
        {
            f"test_real_glm5_model_takes_exactly_the_plugin_weights[{v}-{variant}]": REAL_PRISTINE_FAILS
            for v in ran
            for variant in LOADING_VARIANTS
        }
    )
    expected.update(
        {
            f"test_real_glm5_{test}[{v}]": REAL_PRISTINE_FAILS
            for v in ran
            for test in ("mixed_expert_types_refused", "moe_keeps_one_w13_type")
        }
    )
    for test, needle in expected.items():
        outcome, message = results.get(test, ("absent", ""))
        # "error": the shared fixture that loads the GLM file raised (setup of the test)
        if outcome not in ("failed", "error") or needle not in message:
            problems.append(f"{test}: {outcome}, expected a failure mentioning {needle!r}: {message[:300]}")
    assert not problems, "\n".join(problems)
