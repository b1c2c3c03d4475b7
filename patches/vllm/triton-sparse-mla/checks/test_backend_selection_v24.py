"""vLLM 0.24+: CUDA attention-backend selection for a sparse MLA (DSA) layer, on a CPU, through
the real CudaPlatform code of the tree: capability stubbed (12.0 / 12.1 / 9.0 / 10.0), bf16 and
fp16 activations, KV cache auto / bfloat16 / float16 / fp8 / fp8_ds_mla, and FlashInfer as the
pinned releases present themselves (`none`: no sparse MLA decode API; `old`: the API without
`kv_scale_format`, 0.6.12 / 0.6.13 as pinned by vLLM 0.24.0 / 0.25.x; `new`: 0.6.14+). The KV
cache dtype reported is what mla_attention's canonicalization leaves for the chosen backend.

The rule checked: on 12.x upstream's FLASHINFER_MLA_SPARSE_SM120 is kept wherever it runs (bf16,
auto/fp8/fp8_ds_mla cache, a FlashInfer with kv_scale_format); TRITON_MLA_SPARSE is chosen where it
does not and ours can (and the cache is then left as asked); 9.x / 10.x are the pristine tree's
choice unless forced."""

from __future__ import annotations

import itertools
import pathlib

import pytest
from _tsm_probe import run

TRITON = "TritonMLASparseBackend"
SM120 = "FlashInferMLASparseSM120Backend"
SM12X = ("12.0", "12.1")
DTYPES = ("bf16", "fp16")
CACHES = ("auto", "bfloat16", "float16", "fp8", "fp8_ds_mla")
FLASHINFER = ("none", "old", "new")


def _has_sm12x_backend(tree: pathlib.Path) -> bool:
    return (tree / "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py").is_file()


@pytest.fixture(scope="module")
def patched(patched_tree):
    if not _has_sm12x_backend(patched_tree):
        pytest.skip("before vLLM 0.24 (no upstream SM12x sparse backend): test_backend_selection.py")
    return run(patched_tree, "select_v24")


@pytest.fixture(scope="module")
def pristine(pristine_tree):
    if not _has_sm12x_backend(pristine_tree):
        pytest.skip("before vLLM 0.24 (no upstream SM12x sparse backend): test_backend_selection.py")
    return run(pristine_tree, "select_v24")


def _upstream_runs(dtype: str, cache: str, fi: str) -> bool:
    # FLASHINFER_MLA_SPARSE_SM120 (index_topk 2048 here): bf16 only, auto/fp8/fp8_ds_mla only, and
    # a FlashInfer whose MLA decode takes the kv_scale_format its call passes.
    return fi == "new" and dtype == "bf16" and cache in ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")


def _ours_serves(dtype: str, cache: str) -> bool:
    return cache in ("auto", "fp8") or {"bfloat16": "bf16", "float16": "fp16"}.get(cache) == dtype


SM12X_CASES = list(itertools.product(SM12X, DTYPES, CACHES, FLASHINFER))


@pytest.mark.parametrize("cap, dtype, cache, fi", SM12X_CASES)
def test_sm12x_selection(patched, pristine, cap, dtype, cache, fi):
    key = f"{cap}/{dtype}/{cache}/{fi}"
    got, base = patched["table"][key], pristine["table"][key]
    if _upstream_runs(dtype, cache, fi):
        assert got == base and got["backend"] == SM120, (got, base)  # upstream's choice kept
        assert got["cache"] == "fp8_ds_mla"
    elif _ours_serves(dtype, cache):
        assert got["ok"], got
        assert got["backend"] == TRITON, got
        assert got["cache"] == cache, got  # not rewritten to fp8_ds_mla
    elif cache == "fp8_ds_mla" and base["ok"]:
        # an explicit fp8_ds_mla cache is upstream's format only: left to upstream
        assert got == base, (got, base)
    else:
        assert not got["ok"] and "No valid attention backend" in got["error"], got


@pytest.mark.pristine_fails
@pytest.mark.parametrize("cap", SM12X)
def test_pristine_sm12x_gaps(pristine, cap):
    # What the patch fixes, in the release code: fp16 activations and an explicit bf16 cache have
    # no backend on 12.x, and a FlashInfer without kv_scale_format still gets the SM120 backend.
    t = pristine["table"]
    assert pristine["has_enum"] is False
    for cache, fi in itertools.product(CACHES, FLASHINFER):
        assert not t[f"{cap}/fp16/{cache}/{fi}"]["ok"], (cache, fi)
    for fi in FLASHINFER:
        assert not t[f"{cap}/bf16/bfloat16/{fi}"]["ok"], fi
    assert t[f"{cap}/bf16/auto/old"]["backend"] == SM120
    assert t[f"{cap}/bf16/auto/old"]["cache"] == "fp8_ds_mla"


@pytest.mark.parametrize("key", [k for k in itertools.product(("9.0", "10.0"), DTYPES, CACHES, ("none",))])
def test_sm90_sm100_keep_upstream_choice(patched, pristine, key):
    k = "/".join(key)
    assert patched["table"][k] == pristine["table"][k]
    if patched["table"][k]["ok"]:
        assert patched["table"][k]["backend"] != TRITON


def test_index_topk_other_than_2048_falls_back(patched, pristine):
    assert not pristine["topk1024_sm120_bf16_new"]["ok"]
    assert patched["topk1024_sm120_bf16_new"]["backend"] == TRITON


@pytest.mark.parametrize("case", ["env_sm90_bf16", "env_sm100_fp16", "env_sm120_bf16_new"])
def test_env_override_forces_triton_sparse_mla(patched, case):
    assert patched[case]["ok"], patched[case]
    assert patched[case]["backend"] == TRITON
    assert patched[case]["cache"] == "auto"


@pytest.mark.parametrize("case", ["env_off_sm90", "env_off_sm120_bf16_new"])
def test_env_off_is_upstream_choice(patched, pristine, case):
    assert patched[case] == pristine[case]


@pytest.mark.parametrize("case", ["flag_sm90", "flag_sm120_fi_old"])
def test_attention_backend_flag_forces_triton_sparse_mla(patched, case):
    assert patched["has_enum"] is True
    assert patched[case]["ok"] and patched[case]["backend"] == TRITON, patched[case]


def test_explicit_upstream_choice_still_wins(patched, pristine):
    # --attention-backend FLASHINFER_MLA_SPARSE_SM120 with fp16 is refused, not replaced.
    assert patched["flag_sm120_upstream_fp16"] == pristine["flag_sm120_upstream_fp16"]
    assert "is not valid for this configuration" in patched["flag_sm120_upstream_fp16"]["error"]


def test_deepseek_v32_bf16_cache_stays_bf16_on_sm12x(patched, pristine):
    # DeepSeek V3.2's model config turns bfloat16 into auto (FLASHMLA_SPARSE's name for it); on
    # 12.x auto then becomes fp8_ds_mla, so the patch keeps bfloat16 there, and only there.
    assert pristine["dsv32_cache"]["12.0/bfloat16"] == "auto"
    assert patched["dsv32_cache"]["12.0/bfloat16"] == "bfloat16"
    for other in ("9.0/bfloat16", "10.0/bfloat16", "12.0/auto", "9.0/auto"):
        assert patched["dsv32_cache"][other] == pristine["dsv32_cache"][other], other


# ---------------------------------------------------------------- GLM-5.3-Flash (glm5_next, rope-free)
# vLLM 0.33+: the same table for GLM-5.3-Flash's rope-free sparse MLA layers, from the same probe
# runs (glm5_next: kv_lora_rank 512, qk_rope_head_dim 0, attention head_size 512), as above for
# the 576-wide layout:
# capability 12.0 / 12.1 / 9.0 / 10.0 x bf16 / fp16 x KV cache auto / bfloat16 / float16 / fp8 /
# fp8_ds_mla x FlashInfer none / old (no kv_scale_format) / new.
# In 0.33.0 upstream's FLASHINFER_MLA_SPARSE_SM120 declares head size 512 (flashinfer_mla_sparse.py
# `get_supported_head_sizes` -> [512, 576]) and FlashInfer 0.7.2.post1 (its pin) has a GLM-5.3 NoPE
# path (`glm53_nope` in flashinfer/mla/_core.py), so the rule is the one of the 576 layout: upstream's
# choice is kept wherever it runs; TRITON_MLA_SPARSE takes what it does not (fp16, an explicit 16-bit
# cache, index_topk other than 2048, a FlashInfer without kv_scale_format); 9.x / 10.x stay upstream's
# (FLASHMLA_SPARSE / FLASHINFER_MLA_SPARSE_SM90 / the SM100 backend) unless forced.


def _has_glm5next(tree: pathlib.Path) -> bool:
    return (tree / "vllm/models/glm5next").is_dir()


@pytest.fixture(scope="module")
def patched_glm5next(patched, patched_tree):
    if not _has_glm5next(patched_tree):
        pytest.skip("this vLLM has no glm5_next model (vllm/models/glm5next: 0.33+)")
    return patched["glm5next"]


@pytest.fixture(scope="module")
def pristine_glm5next(pristine, pristine_tree):
    if not _has_glm5next(pristine_tree):
        pytest.skip("this vLLM has no glm5_next model (vllm/models/glm5next: 0.33+)")
    return pristine["glm5next"]


@pytest.mark.parametrize("cap, dtype, cache, fi", list(itertools.product(SM12X, DTYPES, CACHES, FLASHINFER)))
def test_glm5next_sm12x_selection(patched_glm5next, pristine_glm5next, cap, dtype, cache, fi):
    key = f"{cap}/{dtype}/{cache}/{fi}"
    got, base = patched_glm5next[key], pristine_glm5next[key]
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
def test_pristine_glm5next_sm12x_gaps(pristine_glm5next, cap):
    # The release's gaps for the rope-free layer on 12.x: fp16 activations and an explicit
    # bf16 cache have no backend; a FlashInfer without kv_scale_format still gets SM120's.
    for cache, fi in itertools.product(CACHES, FLASHINFER):
        assert not pristine_glm5next[f"{cap}/fp16/{cache}/{fi}"]["ok"], (cache, fi)
    for fi in FLASHINFER:
        assert not pristine_glm5next[f"{cap}/bf16/bfloat16/{fi}"]["ok"], fi
    assert pristine_glm5next[f"{cap}/bf16/auto/old"]["backend"] == SM120
    assert not pristine_glm5next["topk1024_sm120_bf16_new"]["ok"]


@pytest.mark.parametrize("key", ["/".join(k) for k in itertools.product(("9.0", "10.0"), DTYPES, CACHES, ("none",))])
def test_glm5next_sm90_sm100_keep_upstream_choice(patched_glm5next, pristine_glm5next, key):
    assert patched_glm5next[key] == pristine_glm5next[key]
    if patched_glm5next[key]["ok"]:
        assert patched_glm5next[key]["backend"] != TRITON


def test_glm5next_index_topk_other_than_2048_falls_back(patched_glm5next):
    assert patched_glm5next["topk1024_sm120_bf16_new"]["backend"] == TRITON


@pytest.mark.parametrize("case", ["env_sm90_bf16", "env_sm120_bf16_new"])
def test_glm5next_env_forces_triton_sparse_mla(patched_glm5next, case):
    assert patched_glm5next[case]["ok"], patched_glm5next[case]
    assert patched_glm5next[case]["backend"] == TRITON
    assert patched_glm5next[case]["cache"] == "auto"
