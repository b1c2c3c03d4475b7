"""Shared helpers for the NSA/DSA backend-default checks (CPU tier)."""

import pathlib

import pytest

from checklib.sglang import _nsa_resolution  # shared with the guard patch's checks

HERE = pathlib.Path(__file__).resolve().parent

SCENARIOS = {
    # name: (capability, kv_cache_dtype, user prefill, user decode)
    "sm120_fp8": ((12, 0), "fp8_e4m3", None, None),
    "sm121_fp8": ((12, 1), "fp8_e4m3", None, None),
    "sm120_fp8_user_decode": ((12, 0), "fp8_e4m3", None, "flashmla_kv"),
    "sm120_fp8_user_prefill": ((12, 0), "fp8_e4m3", "flashmla_sparse", None),
    "sm120_fp8_user_both": ((12, 0), "fp8_e4m3", "flashmla_sparse", "flashmla_kv"),
    "sm120_bf16": ((12, 0), "bfloat16", None, None),
    "sm90_fp8": ((9, 0), "fp8_e4m3", None, None),
    "sm90_bf16": ((9, 0), "bfloat16", None, None),
    "sm100_fp8": ((10, 0), "fp8_e4m3", None, None),
    "sm100_bf16": ((10, 0), "bfloat16", None, None),
}


def resolve_backends(tree: pathlib.Path, tmp_path_factory) -> dict:
    """Run _dsa_probe.py against one release tree in a fresh interpreter."""
    names = list(SCENARIOS)
    payload = [_nsa_resolution.scenario(*SCENARIOS[n]) for n in names]
    results = _nsa_resolution.run_scenarios(HERE / "_dsa_probe.py", tree, payload, tmp_path_factory.mktemp("dsa"))
    return dict(zip(names, results, strict=False))


@pytest.fixture(scope="session")
def patched_backends(patched_tree, tmp_path_factory):
    return resolve_backends(patched_tree, tmp_path_factory)


@pytest.fixture(scope="session")
def pristine_backends(pristine_tree, tmp_path_factory):
    return resolve_backends(pristine_tree, tmp_path_factory)
