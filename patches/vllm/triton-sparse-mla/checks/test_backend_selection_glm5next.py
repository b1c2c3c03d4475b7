"""vLLM 0.33+: backend selection for GLM-5.3-Flash's rope-free sparse MLA layers (glm5_next:
kv_lora_rank 512, qk_rope_head_dim 0, attention head_size 512), on a CPU, through the real
CudaPlatform code of the tree, as test_backend_selection_v24.py does for the 576-wide layout:
capability 12.0 / 12.1 / 9.0 / 10.0 x bf16 / fp16 x KV cache auto / bfloat16 / float16 / fp8 /
fp8_ds_mla x FlashInfer none / old (no kv_scale_format) / new.

In 0.33.0 upstream's FLASHINFER_MLA_SPARSE_SM120 declares head size 512 (flashinfer_mla_sparse.py
`get_supported_head_sizes` -> [512, 576]) and FlashInfer 0.7.2.post1 (its pin) has a GLM-5.3 NoPE
path (`glm53_nope` in flashinfer/mla/_core.py), so the rule is the one of the 576 layout: upstream's
choice is kept wherever it runs; TRITON_MLA_SPARSE takes what it does not (fp16, an explicit 16-bit
cache, index_topk other than 2048, a FlashInfer without kv_scale_format); 9.x / 10.x stay upstream's
(FLASHMLA_SPARSE / FLASHINFER_MLA_SPARSE_SM90 / the SM100 backend) unless forced."""
from __future__ import annotations

import itertools
import pathlib

import pytest
from _tsm_probe import run
from test_backend_selection_v24 import CACHES, DTYPES, FLASHINFER, SM12X, SM120, TRITON, _ours_serves, _upstream_runs


def _has_glm5next(tree: pathlib.Path) -> bool:
    return (tree / "vllm/models/glm5next").is_dir()


@pytest.fixture(scope="module")
def patched(patched_tree):
    if not _has_glm5next(patched_tree):
        pytest.skip("this vLLM has no glm5_next model (vllm/models/glm5next: 0.33+)")
    return run(patched_tree, "select_v24")["glm5next"]


@pytest.fixture(scope="module")
def pristine(pristine_tree):
    if not _has_glm5next(pristine_tree):
        pytest.skip("this vLLM has no glm5_next model (vllm/models/glm5next: 0.33+)")
    return run(pristine_tree, "select_v24")["glm5next"]


@pytest.mark.parametrize("cap, dtype, cache, fi", list(itertools.product(SM12X, DTYPES, CACHES, FLASHINFER)))
def test_glm5next_sm12x_selection(patched, pristine, cap, dtype, cache, fi):
    key = f"{cap}/{dtype}/{cache}/{fi}"
    got, base = patched[key], pristine[key]
    if _upstream_runs(dtype, cache, fi):
        assert got == base and got["backend"] == SM120, (got, base)  # upstream's choice kept
        assert got["cache"] == "fp8_ds_mla"
    elif _ours_serves(dtype, cache):
        assert got["ok"], got
        assert got["backend"] == TRITON, got
        assert got["cache"] == cache, got  # not rewritten to fp8_ds_mla
    elif cache == "fp8_ds_mla" and base["ok"]:
        assert got == base, (got, base)  # upstream's packed format: left to upstream
    else:
        assert not got["ok"] and "No valid attention backend" in got["error"], got


@pytest.mark.pristine_fails
@pytest.mark.parametrize("cap", SM12X)
def test_pristine_glm5next_sm12x_gaps(pristine, cap):
    # The release's gaps for the rope-free layer on 12.x: fp16 activations and an explicit
    # bf16 cache have no backend; a FlashInfer without kv_scale_format still gets SM120's.
    for cache, fi in itertools.product(CACHES, FLASHINFER):
        assert not pristine[f"{cap}/fp16/{cache}/{fi}"]["ok"], (cache, fi)
    for fi in FLASHINFER:
        assert not pristine[f"{cap}/bf16/bfloat16/{fi}"]["ok"], fi
    assert pristine[f"{cap}/bf16/auto/old"]["backend"] == SM120
    assert not pristine["topk1024_sm120_bf16_new"]["ok"]


@pytest.mark.parametrize("key", ["/".join(k) for k in itertools.product(("9.0", "10.0"), DTYPES, CACHES, ("none",))])
def test_glm5next_sm90_sm100_keep_upstream_choice(patched, pristine, key):
    assert patched[key] == pristine[key]
    if patched[key]["ok"]:
        assert patched[key]["backend"] != TRITON


def test_glm5next_index_topk_other_than_2048_falls_back(patched):
    assert patched["topk1024_sm120_bf16_new"]["backend"] == TRITON


@pytest.mark.parametrize("case", ["env_sm90_bf16", "env_sm120_bf16_new"])
def test_glm5next_env_forces_triton_sparse_mla(patched, case):
    assert patched[case]["ok"], patched[case]
    assert patched[case]["backend"] == TRITON
    assert patched[case]["cache"] == "auto"
