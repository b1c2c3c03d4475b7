"""vLLM 0.16-0.23: CUDA attention-backend selection for a sparse MLA (DSA) layer, on a CPU, with
the device capability stubbed, through the real CudaPlatform code of the tree."""

from __future__ import annotations

import pytest
from _tsm_probe import run

TRITON = "TritonMLASparseBackend"


def _before_v24(tree) -> None:
    # 0.24+ has an SM12x sparse backend of its own: test_backend_selection_v24.py checks those.
    if (tree / "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm120.py").is_file():
        pytest.skip("vLLM 0.24+ (upstream has an SM12x sparse backend): test_backend_selection_v24.py")


@pytest.fixture(scope="module")
def patched(patched_tree):
    _before_v24(patched_tree)
    return run(patched_tree, "select")


@pytest.fixture(scope="module")
def pristine(pristine_tree):
    _before_v24(pristine_tree)
    return run(pristine_tree, "select")


def _backend(res: dict) -> str:
    assert res["ok"], res["error"]
    return res["backend"]


@pytest.mark.parametrize("case", ["sm120_bf16", "sm120_fp16", "sm121_bf16"])
def test_sm12x_chooses_triton_sparse_mla(patched, case):
    assert _backend(patched[case]) == TRITON
    assert patched[case]["path"] == ("vllm.v1.attention.backends.mla.triton_mla_sparse.TritonMLASparseBackend")


@pytest.mark.pristine_fails
@pytest.mark.parametrize("case", ["sm120_bf16", "sm120_fp16", "sm121_bf16"])
def test_pristine_sm12x_has_no_valid_backend(pristine, case):
    # What the patch fixes: upstream refuses every sparse MLA backend on 12.x.
    assert pristine["has_enum"] is False
    assert not pristine[case]["ok"]
    assert "No valid attention backend" in pristine[case]["error"]


@pytest.mark.parametrize("case", ["sm90_bf16", "sm100_bf16", "sm100_fp8", "sm90_env_off"])
def test_sm90_sm100_keep_upstream_choice(patched, pristine, case):
    assert patched[case] == pristine[case]
    if patched[case]["ok"]:
        assert patched[case]["backend"] != TRITON


def test_sm90_upstream_choice_is_flashmla_sparse(patched):
    assert _backend(patched["sm90_bf16"]) == "FlashMLASparseBackend"


@pytest.mark.parametrize("case", ["sm90_env", "sm100_env_fp16"])
def test_env_override_forces_triton_sparse_mla(patched, case):
    assert _backend(patched[case]) == TRITON


def test_attention_backend_flag_forces_triton_sparse_mla(patched):
    assert patched["has_enum"] is True
    assert _backend(patched["sm90_flag"]) == TRITON


def test_explicit_choice_still_wins_on_sm120(patched):
    # --attention-backend FLASHMLA_SPARSE on 12.x is not silently replaced.
    assert not patched["sm120_flag_flashmla"]["ok"]
    assert "compute capability not supported" in patched["sm120_flag_flashmla"]["error"]
