"""Forward path of the patched backend on a CPU: metadata builder -> per-request
top-k ids (-1 padded) -> global slots -> the shipped Triton kernel under
TRITON_INTERPRET=1, against a dense fp32 reference (decode + prefill rows)."""
from __future__ import annotations

import importlib.util

import pytest
from _tsm_probe import run


def test_forward_matches_reference(patched_tree):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernel cannot run (even interpreted)")
    kernel = patched_tree / "vllm/v1/attention/ops/triton_sparse_mla.py"
    assert kernel.is_file(), "the patch must ship the kernel"
    res = run(patched_tree, "forward", {"TRITON_INTERPRET": "1"})
    tol = {"float16": 5e-3, "bfloat16": 3e-2}
    for dtype, r in ((k, v) for k, v in res.items() if k in tol):
        assert r["shape"] == [7, 4, 512], r
        assert r["dtype"] == f"torch.{dtype}", r
        assert r["lse_is_none"], r
        assert r["max_abs_err"] < tol[dtype], (dtype, r)
    assert set(tol) <= set(res), res
