"""Forward path of the patched backend on a CPU: metadata builder -> per-request top-k ids (-1
padded) -> global slots -> the shipped Triton kernel under TRITON_INTERPRET=1, against a dense
fp32 reference (decode + prefill rows). From vLLM 0.24 through the release's own sparse metadata
builder (upstream's SM12x one; from 0.26 on the common sparse MLA builder) on a real
CommonAttentionMetadata, the impl on the release's sparse impl base, and a cache whose blocks
are not adjacent."""

from __future__ import annotations

import importlib.util

import pytest
from _tsm_probe import run


def _v24(tree) -> bool:
    return (tree / "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py").is_file()


def test_forward_matches_reference(patched_tree):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernel cannot run (even interpreted)")
    kernel = patched_tree / "vllm/v1/attention/ops/triton_sparse_mla.py"
    assert kernel.is_file(), "the patch must ship the kernel"
    v24 = _v24(patched_tree)
    res = run(patched_tree, "forward_v24" if v24 else "forward", {"TRITON_INTERPRET": "1"})
    tol = {"float16": 5e-3, "bfloat16": 3e-2}
    for dtype, r in ((k, v) for k, v in res.items() if k in tol):
        assert r["shape"] == [7, 4, 512], r
        assert r["dtype"] == f"torch.{dtype}", r
        assert r["lse_is_none"], r
        assert r["max_abs_err"] < tol[dtype], (dtype, r)
        if v24:
            assert r["req_id_per_token"] == [0, 1, 2, 2, 2, 2, 2], r
            assert r["block_size"] == 16, r
    assert set(tol) <= set(res), res
    if v24:
        assert "FlashInferMLASparseMetadataBuilder" in res["builder_bases"], res
        has_common = (patched_tree / "vllm/model_executor/layers/attention/sparse_mla_attention.py").is_file()
        assert res["common_impl"] is has_common, res  # on SparseMLACommonImpl wherever it exists
        if has_common:
            assert "SparseMLACommonMetadataBuilder" in res["builder_bases"], res
        assert res["skip_topk_layer_buffer"] is True, res


def test_rope_free_forward_matches_reference(patched_tree):
    """GLM-5.3-Flash's rope-free layer (qk_rope_head_dim 0, D = kv_lora_rank = 512) through the
    same builder -> impl -> kernel path (vLLM 0.33+, which has the model)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernel cannot run (even interpreted)")
    if not (patched_tree / "vllm/models/glm5next").is_dir():
        pytest.skip("this vLLM has no glm5_next model (vllm/models/glm5next: 0.33+)")
    res = run(patched_tree, "forward_v24_rope_free", {"TRITON_INTERPRET": "1"})
    tol = {"float16": 5e-3, "bfloat16": 3e-2}
    for dtype in tol:
        r = res[dtype]
        assert r["shape"] == [7, 4, 512], r
        assert r["dtype"] == f"torch.{dtype}", r
        assert r["max_abs_err"] < tol[dtype], (dtype, r)
        assert r["req_id_per_token"] == [0, 1, 2, 2, 2, 2, 2], r
