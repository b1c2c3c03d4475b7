"""The DSA indexer's DeepGEMM logits wrappers fall back to PyTorch (CPU check)."""

from __future__ import annotations

import pytest
from _dif_probe import run


@pytest.fixture(scope="module")
def res(patched_tree):
    return run(patched_tree, "fallback")


def test_prefill_logits_match_reference(res):
    p = res["prefill"]
    assert p["ok"], p
    assert p["shape"] == [5, 23]
    assert p["inf_pattern_equal"]
    assert p["max_abs_err"] < 1e-3, p


@pytest.mark.parametrize("case", ["next_n=1,2d=False", "next_n=1,2d=True", "next_n=2,2d=False", "next_n=2,2d=True"])
def test_paged_decode_logits_match_reference(res, case):
    c = res["paged"][case]
    n = int(case.split(",")[0].split("=")[1])
    assert c["shape"] == [3 * n, 80]
    assert c["sched_shape"] == [9, 2]
    assert c["inf_pattern_equal"], c
    assert c["max_abs_err"] < 1e-3, c


def test_fallback_switch(res):
    assert res["env0_off"]
    assert res["cpu_platform_off"]


@pytest.mark.pristine_fails
def test_pristine_wrapper_needs_deepgemm(pristine_tree):
    r = run(pristine_tree, "wrapper", {"VLLM_DSA_INDEXER_FALLBACK": "1"})
    # "... is not available or outdated" up to 0.20, "... is unavailable in the current vLLM
    # environment" from 0.21
    assert any(m in r["wrapper"] for m in ("DeepGEMM backend is not available", "DeepGEMM backend is unavailable")), r
