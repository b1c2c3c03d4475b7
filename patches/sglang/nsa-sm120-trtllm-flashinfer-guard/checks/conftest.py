"""Shared helpers for the SM12x trtllm-gen start-up guard checks (CPU tier).

A fake `flashinfer` package (made under tmp, never imported) carries only what the guard reads:
`flashinfer/data/include/flashinfer/trtllm/fmha/fmhaRunner.cuh`, as installed from a wheel, and a
dist-info with its version. The architecture checks below are the statements stock wheels ship.
"""

import pathlib

import pytest

from checklib.sglang import _nsa_resolution  # shared with the default patch's checks

HERE = pathlib.Path(__file__).resolve().parent

# TllmGenFmhaRunner's architecture check as shipped in flashinfer-python 0.6.3 ... 0.6.15.post1
STOCK_063 = (
    "      : mSM(getSMVersion()), mDtypeQ(dtypeQ), mDtypeKv(dtypeKv), mDtypeOut(dtypeOut) {\n"
    '    FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103, "Unsupported architecture");\n'
)
# ... and in 0.6.16.post3 ... 0.7.4 (one more SM, split over two lines; the same statement in
# 0.6.16.post3, 0.6.18, 0.7.0.post1, 0.7.2.post1 and 0.7.4, the newest on the index in 2026-12)
STOCK_072 = (
    "        mDtypeOut(dtypeOut) {\n"
    "    FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103 || mSM == kSM_107,\n"
    '                     "Unsupported architecture");\n'
)
# a build with SM12x trtllm-gen FMHA kernels
SM12X = (
    "      : mSM(getSMVersion()), mDtypeQ(dtypeQ), mDtypeKv(dtypeKv), mDtypeOut(dtypeOut) {\n"
    "    FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_103 || mSM == kSM_120 ||\n"
    '                         mSM == kSM_121, "Unsupported architecture");\n'
)
SM120_ONLY = (
    "      : mSM(getSMVersion()), mDtypeQ(dtypeQ), mDtypeKv(dtypeKv), mDtypeOut(dtypeOut) {\n"
    '    FLASHINFER_CHECK(mSM == kSM_100 || mSM == kSM_120, "Unsupported architecture");\n'
)
HEADERS = {
    "stock_063": ("0.6.3", STOCK_063),
    "stock_072": ("0.7.2.post1", STOCK_072),
    "stock_074": ("0.7.4", STOCK_072),
    "sm12x": ("0.7.2.post1+sm12x", SM12X),
    "sm120_only": ("0.7.2.post1+sm120", SM120_ONLY),
    "no_header": ("0.6.3", None),
}

_BODY = (
    '#pragma once\n\n#include "fmhaKernels.cuh"\n\nclass TllmGenFmhaRunner {\n public:\n'
    "  explicit TllmGenFmhaRunner(Data_type dtypeQ, Data_type dtypeKv, Data_type dtypeOut)\n"
    "{check}"
    "    FLASHINFER_CHECK(mDtypeQ == DATA_TYPE_E4M3 || mDtypeQ == DATA_TYPE_BF16,\n"
    '                     "Unsupported Q data type: " + std::string(toStr(mDtypeQ)));\n'
    "  }\n};\n"
)

GLM = "GlmMoeDsaForCausalLM"
DEEPSEEK = "DeepseekV32ForCausalLM"  # a DSA model that 0.5.17+ do not send to flashinfer_sparse_mla

# name: (fake flashinfer, capability, kv_cache_dtype, user prefill, user decode, env[, arch])
# (arch GLM unless given; "auto" goes through the release's KV-cache dtype default first)
SCENARIOS = {
    "stock_sm120_fp8": ("stock_063", (12, 0), "fp8_e4m3", None, None, {}),
    "stock_sm121_fp8": ("stock_063", (12, 1), "fp8_e4m3", None, None, {}),
    "stock072_sm120_fp8": ("stock_072", (12, 0), "fp8_e4m3", None, None, {}),
    "stock_sm120_bf16": ("stock_063", (12, 0), "bfloat16", None, None, {}),
    "stock_sm120_user_trtllm_decode": ("stock_063", (12, 0), "fp8_e4m3", "flashmla_sparse", "trtllm", {}),
    "stock_sm120_user_both": ("stock_063", (12, 0), "fp8_e4m3", "flashmla_sparse", "flashmla_kv", {}),
    "stock_sm120_skip_env": ("stock_063", (12, 0), "fp8_e4m3", None, "trtllm", {"SGLANG_SKIP_SM120_TRTLLM_CHECK": "1"}),
    "stock_sm90_user_trtllm": ("stock_063", (9, 0), "fp8_e4m3", None, "trtllm", {}),
    "stock_sm100_user_trtllm": ("stock_063", (10, 0), "fp8_e4m3", None, "trtllm", {}),
    "stock_sm100_bf16": ("stock_063", (10, 0), "bfloat16", None, None, {}),
    "sm12x_sm120_fp8": ("sm12x", (12, 0), "fp8_e4m3", None, "trtllm", {}),
    "sm12x_sm121_fp8": ("sm12x", (12, 1), "fp8_e4m3", None, "trtllm", {}),
    "sm120only_sm120": ("sm120_only", (12, 0), "fp8_e4m3", None, "trtllm", {}),
    "sm120only_sm121": ("sm120_only", (12, 1), "fp8_e4m3", None, "trtllm", {}),
    "noheader_sm120": ("no_header", (12, 0), "fp8_e4m3", None, "trtllm", {}),
    # what 0.5.17+ still resolve to trtllm on SM12x, and what they do not
    "stock074_sm120_bf16": ("stock_074", (12, 0), "bfloat16", None, None, {}),
    "stock074_sm121_bf16": ("stock_074", (12, 1), "bfloat16", None, None, {}),
    "stock074_sm120_auto": ("stock_074", (12, 0), "auto", None, None, {}),
    "stock074_sm120_deepseek_auto": ("stock_074", (12, 0), "auto", None, None, {}, DEEPSEEK),
    "stock074_sm120_deepseek_bf16": ("stock_074", (12, 0), "bfloat16", None, None, {}, DEEPSEEK),
    "stock074_sm120_bf16_skip_env": ("stock_074", (12, 0), "bfloat16", None, None, {"SGLANG_SKIP_SM120_TRTLLM_CHECK": "1"}),
    "stock074_sm90_bf16": ("stock_074", (9, 0), "bfloat16", None, None, {}),
    "stock074_sm100_auto": ("stock_074", (10, 0), "auto", None, None, {}),
    "sm12x_sm120_bf16": ("sm12x", (12, 0), "bfloat16", None, None, {}),
}


def make_fake_flashinfer(root: pathlib.Path, version: str, check) -> pathlib.Path:
    pkg = root / "flashinfer"
    pkg.mkdir(parents=True)
    # importing this would be a probe bug: the guard must only locate the package
    (pkg / "__init__.py").write_text('raise ImportError("fake flashinfer: not importable")\n')
    dist = root / f"flashinfer_python-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {version}\n")
    if check is not None:
        header = pkg / "data" / "include" / "flashinfer" / "trtllm" / "fmha" / "fmhaRunner.cuh"
        header.parent.mkdir(parents=True)
        header.write_text(_BODY.replace("{check}", check))
    return root


@pytest.fixture(scope="session")
def fake_flashinfers(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("fake_flashinfer")
    return {kind: make_fake_flashinfer(base / kind, version, check) for kind, (version, check) in HEADERS.items()}


def resolve(tree: pathlib.Path, tmp_path_factory, fakes: dict) -> dict:
    """Run _guard_probe.py against one release tree in a fresh interpreter."""
    names = list(SCENARIOS)
    payload = []
    for name in names:
        kind, cap, kv, prefill, decode, env, *arch = SCENARIOS[name]
        payload.append(
            _nsa_resolution.scenario(cap, kv, prefill, decode, flashinfer_root=str(fakes[kind]), env=env, arch=(arch or [GLM])[0])
        )
    results = _nsa_resolution.run_scenarios(HERE / "_guard_probe.py", tree, payload, tmp_path_factory.mktemp("guard"))
    return dict(zip(names, results, strict=False))


@pytest.fixture(scope="session")
def patched(patched_tree, tmp_path_factory, fake_flashinfers):
    return resolve(patched_tree, tmp_path_factory, fake_flashinfers)


@pytest.fixture(scope="session")
def pristine(pristine_tree, tmp_path_factory, fake_flashinfers):
    return resolve(pristine_tree, tmp_path_factory, fake_flashinfers)
