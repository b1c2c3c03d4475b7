"""vLLM 0.30+ (glm5_next): a tiny random GLM-5.3-Flash model built by the release's own
Glm5NextForCausalLM on a CPU with our backend serving its sparse (rope-free) MLA layers, and
loaded from a checkpoint transformers' Glm5NextTextModel.save_pretrained wrote
(_glm5next_tiny_model_probe.py says how: real MLA geometry, kv_lora_rank 512 / qk_rope_head_dim 0
-> head size 512; the sparse layers' backend chosen by the release's CUDA selection at capability
12.0 with no FlashInfer sparse MLA API; a few config attributes guessed; no forward pass).

What fails without the patch: the pristine release has no backend for those layers there, so the
model does not build ("No valid attention backend")."""

from __future__ import annotations

import os
import pathlib
import tempfile

import pytest

from checklib import probe

PROBE = pathlib.Path(__file__).with_name("_glm5next_tiny_model_probe.py")
OURS = "TRITON_MLA_SPARSE"


def _run(tree: pathlib.Path) -> dict:
    if not (tree / "vllm/models/glm5next").is_dir():
        pytest.skip("this vLLM has no glm5_next model (vllm/models/glm5next: 0.30+)")
    env = {
        "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT") or tempfile.mkdtemp(prefix="g5n-vllm-cache-"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p),
    }
    res = probe.run_probe(tree, PROBE, env=env)
    if "no_transformers_class" in res:
        pytest.skip(
            "transformers in the smoke env has no Glm5NextTextConfig / Glm5NextTextModel: " + res["no_transformers_class"]
        )
    probe.assert_imported_from(res, "vllm_file", tree)
    model = res["model"]
    assert (model["hybrid"], model["mla"], model["head_size"], model["kv_lora_rank"], model["qk_rope_head_dim"]) == (
        True,
        True,
        512,
        512,
        0,
    ), model
    assert "indexed_attention" in model["layer_types"] and "linear_attention" in model["layer_types"]
    return res


@pytest.fixture(scope="module")
def patched(patched_tree: pathlib.Path) -> dict:
    return _run(patched_tree)


def test_sparse_layers_get_ours_with_head_size_512(patched: dict) -> None:
    assert "error" not in patched, patched["error"]
    assert patched["built"] == "Glm5NextForCausalLM"
    layers = patched["attn_layers"]
    n_sparse = patched["model"]["layer_types"].count("indexed_attention")
    assert len(layers) == n_sparse, layers
    for layer in layers:
        assert (layer["backend"], layer["head_size"], layer["impl"]) == (OURS, 512, "TritonMLASparseImpl"), layer
    assert patched["sparse_selections"] and all(s["head_size"] == 512 for s in patched["sparse_selections"])


def test_transformers_checkpoint_loads_into_every_parameter(patched: dict) -> None:
    assert "error" not in patched, patched["error"]
    load = patched["load"]
    assert load["params"] > 0 and load["loaded"] == load["params"], load
    assert load["missing"] == []
    # Loaded, not just named: the tensors equal their sources, through the model's renames and
    # fusions (per-expert gate/up -> w13, q_a_proj + kv_a_proj_with_mqa -> fused_qkv_a_proj).
    assert patched["equal"] == {"embed_tokens": True, "expert1_w13": True, "fused_qkv_a": True}


@pytest.mark.pristine_fails
def test_pristine_release_cannot_build_it(pristine_tree: pathlib.Path) -> None:
    res = _run(pristine_tree)
    assert res.get("error", {}).get("step") == "build", res
    assert "No valid attention backend" in res["error"]["what"], res["error"]
