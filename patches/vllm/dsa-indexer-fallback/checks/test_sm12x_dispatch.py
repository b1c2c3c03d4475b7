"""Who computes the DSA indexer's logits on which GPU (CPU check, capability stubbed).

The release's own DeepGEMM wrappers (and on 0.24.x its sparse_attn_indexer decode step and
SparseAttnIndexer constructor) with a DeepGEMM stand-in that refuses the GPUs its build lacks as
DeepGEMM does (see _dif_dispatch_probe). Where the release enables DeepGEMM on 12.x (0.24.x):
the fallback only once DeepGEMM refused the GPU (or is missing), a DeepGEMM that accepts 12.x
keeps running, and the cooperative top-k is not launched on 12.x. Where it does not (0.16,
0.19-0.23): the fallback on 12.x without asking DeepGEMM. Everywhere: 9.0 / 10.0 unchanged;
VLLM_DSA_INDEXER_FALLBACK=1 forces the fallback and =0 leaves DeepGEMM's answer (or error).
"""

from __future__ import annotations

import pytest
from _dif_dispatch_probe import run

CALLS = ("prefill", "metadata", "paged", "prefill_again")


@pytest.fixture(scope="module")
def res(patched_tree):
    return run(patched_tree, "dispatch")


@pytest.fixture(scope="module")
def absent(patched_tree):
    res = run(patched_tree, "absent")
    if res["has_deep_gemm"]:
        pytest.skip("DeepGEMM is importable in this environment: no check without it")
    return res


def _constructor(res):
    built = res["constructor"]
    if isinstance(built, str):
        pytest.skip(f"this release has no SparseAttnIndexer layer ({built})")
    if not res["constructor_needs_deep_gemm"]:
        pytest.skip("this release's SparseAttnIndexer does not ask for DeepGEMM (before 0.19)")
    return built


@pytest.fixture(scope="module")
def pristine_res(pristine_tree):
    return run(pristine_tree, "dispatch")


def _who(case):
    return [case[c] for c in CALLS]


def _fallback_correct(case):
    assert _who(case) == ["fallback"] * 4, case
    assert case["prefill_inf_pattern_equal"], case
    assert case["prefill_max_abs_err"] < 1e-3, case


@pytest.mark.parametrize("name", ["sm120_pin", "sm121_pin"])
def test_12x_with_a_deepgemm_that_refuses_it_uses_the_fallback(res, name):
    case = res["cases"][name]
    _fallback_correct(case)
    if res["release_enables_deep_gemm_on_12x"]:
        # DeepGEMM is asked once, refuses, and is not asked again
        assert case["deep_gemm_calls"] == ["mqa"], case
    else:
        assert case["deep_gemm_calls"] == [], case


def test_12x_with_a_deepgemm_that_accepts_it(res):
    case = res["cases"]["sm120_sm120dg"]
    if res["release_enables_deep_gemm_on_12x"]:
        assert _who(case) == ["deep_gemm"] * 4, case
    else:
        _fallback_correct(case)
        assert case["deep_gemm_calls"] == [], case


@pytest.mark.parametrize("name", ["sm90", "sm100"])
def test_deepgemm_gpus_keep_the_upstream_path(res, name):
    case = res["cases"][name]
    assert _who(case) == ["deep_gemm"] * 4, case
    assert case["deep_gemm_calls"] == ["mqa", "metadata", "paged", "mqa"], case


def test_a_refusal_on_a_deepgemm_gpu_is_not_hidden(res):
    case = res["cases"]["sm100_refused"]
    assert all("Unsupported architecture" in w for w in _who(case)), case


@pytest.mark.parametrize("name", ["sm120_env1", "sm90_env1"])
def test_env_forces_the_fallback(res, name):
    case = res["cases"][name]
    _fallback_correct(case)
    assert case["deep_gemm_calls"] == [], case


def test_env_0_leaves_deepgemm(res):
    case = res["cases"]["sm120_pin_env0"]
    assert all("Unsupported architecture" in w for w in _who(case)), case


def _indexer(res):
    if not res.get("has_cooperative_topk"):
        pytest.skip("this release's sparse_attn_indexer has no cooperative top-k (0.24.x has)")
    return res["indexer"]


def test_12x_decode_step_uses_fallback_and_persistent_topk(res):
    run_ = _indexer(res)["sm120_pin"]
    assert "error" not in run_, run_
    assert run_["topk_op"] == ["persistent_topk"], run_
    assert run_["deep_gemm_calls"] == ["paged"], run_  # refused once
    assert run_["topk_equals_reference"] == [True, True, True], run_


def test_12x_decode_step_with_accepting_deepgemm_skips_cooperative_topk(res):
    run_ = _indexer(res)["sm120_sm120dg"]
    assert "error" not in run_, run_
    assert run_["topk_op"] == ["persistent_topk"], run_


@pytest.mark.parametrize("name", ["sm90", "sm100"])
def test_decode_step_on_deepgemm_gpus_unchanged(res, name):
    run_ = _indexer(res)[name]
    assert "error" not in run_, run_
    assert run_["topk_op"] == ["cooperative_topk"], run_


def test_without_deepgemm_12x_falls_back_and_9x_reports_it(absent):
    _fallback_correct(absent["sm120"])
    assert all("DeepGEMM backend is" in w for w in _who(absent["sm90"])), absent["sm90"]


def test_indexer_builds_without_deepgemm_on_12x_only(absent):
    built = _constructor(absent)
    assert built["sm120"] == "built", built
    assert "requires DeepGEMM" in built["sm90"], built


@pytest.mark.pristine_fails
def test_pristine_12x_dies_on_deepgemm_refusal(pristine_res):
    case = pristine_res["cases"]["sm120_pin"]
    assert all("Unsupported architecture" in w for w in _who(case)), case


@pytest.mark.pristine_fails
def test_pristine_12x_launches_cooperative_topk(pristine_res):
    run_ = _indexer(pristine_res)["sm120_sm120dg"]
    assert run_["topk_op"] == ["cooperative_topk"], run_


@pytest.mark.pristine_fails
def test_pristine_indexer_needs_deepgemm_on_12x(pristine_tree):
    res = run(pristine_tree, "absent")
    if res["has_deep_gemm"]:
        pytest.skip("DeepGEMM is importable in this environment: no check without it")
    built = _constructor(res)
    assert "requires DeepGEMM" in built["sm120"], built
