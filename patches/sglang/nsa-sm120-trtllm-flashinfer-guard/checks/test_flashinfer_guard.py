"""CPU checks: the start-up guard for DSA/NSA trtllm on SM12x with a FlashInfer that refuses SM12x.

Run against the real release source; the device capability is stubbed and FlashInfer is a fake
package that only carries fmhaRunner.cuh (see conftest.py and _guard_probe.py). No GPU involved.
"""

import pytest
from packaging.version import Version

GUARD_ERROR = "TrtllmGenUnsupportedOnSM12x"
SKIP_ENV = "SGLANG_SKIP_SM120_TRTLLM_CHECK"


def _ok(result):
    assert result["error"] is None, result["error"]
    return result


def _uses_trtllm(result):
    return "trtllm" in (result["prefill"], result["decode"])


NEW_FAMILY = Version("0.5.17")  # the 0.5.17 variant: GLM/FP8 on SM12x is flashinfer_sparse_mla


def _assert_guard_message(result, sm, version, prefix, phases, release, way_out=None):
    """The error names the cause (SM, FlashInfer's own words, which FlashInfer and header) and the
    ways out of the variant that `release` gets; `way_out` is one more needle (0.5.17+: the GLM
    way out that fits the KV cache)."""
    assert result["error_type"] == GUARD_ERROR, result["error"]
    msg = result["error"]
    needles = [
        f"SM{sm}",
        '"Unsupported architecture"',  # the cause, as FlashInfer words it
        f"({version},",  # which FlashInfer
        "fmhaRunner.cuh",
        f"{SKIP_ENV}=1",
    ]
    if release >= NEW_FAMILY:
        needles.append(f"install a FlashInfer whose trtllm-gen FMHA runner supports SM{sm}")
        assert "sglang >= 0.5.17" not in msg, msg  # the release already is
    else:
        needles += ["FlashInfer build whose trtllm-gen FMHA runner supports", "sglang >= 0.5.17"]
    if way_out:
        needles.append(way_out)
    for needle in needles:
        assert needle in msg, (needle, msg)
    for phase in phases:  # a way out names the flag of each phase that resolved to trtllm
        assert f"{prefix}-{phase}-backend" in msg, (phase, msg)


@pytest.mark.parametrize(
    "name, sm, version",
    [
        ("stock_sm120_fp8", 120, "0.6.3"),
        ("stock_sm121_fp8", 121, "0.6.3"),
        ("stock072_sm120_fp8", 120, "0.7.2.post1"),
        ("stock_sm120_bf16", 120, "0.6.3"),
    ],
)
def test_stock_flashinfer_fails_at_startup_when_default_is_trtllm(patched, engine_version, name, sm, version):
    """Where the release (and the series before this patch) defaults SM12x to trtllm, server
    arguments fail with the cause; where it does not (pristine 0.5.9 FP8 without the default
    patch: flashmla_kv), nothing changes."""
    r, plain = patched[name]["guarded"], _ok(patched[name]["unguarded"])
    if _uses_trtllm(plain):
        phases = [p for p in ("prefill", "decode") if plain[p] == "trtllm"]
        _assert_guard_message(r, sm, version, plain["flag_prefix"], phases, engine_version)
    else:
        assert (_ok(r)["prefill"], r["decode"]) == (plain["prefill"], plain["decode"])


def test_bf16_default_on_sm120_is_trtllm_and_guarded(patched):
    """Every covered release defaults the bf16 DSA decode to trtllm on major >= 10, so the check
    above is not vacuous for it."""
    assert _ok(patched["stock_sm120_bf16"]["unguarded"])["decode"] == "trtllm"
    assert patched["stock_sm120_bf16"]["guarded"]["error_type"] == GUARD_ERROR


def test_explicit_trtllm_decode_on_sm120_fails_naming_decode(patched, engine_version):
    """(0.5.17+: GLM with an FP8 cache, where upstream's default is flashinfer_sparse_mla and an
    explicit trtllm is refused only when the attention backend is built.)"""
    r = patched["stock_sm120_user_trtllm_decode"]
    plain = _ok(r["unguarded"])
    assert plain["decode"] == "trtllm", plain
    # prefill stays the user's flashmla_sparse, except on pristine 0.5.10, which forces trtllm
    phases = [p for p in ("prefill", "decode") if plain[p] == "trtllm"]
    way_out = "leave --dsa-decode-backend unset" if engine_version >= NEW_FAMILY else None
    _assert_guard_message(r["guarded"], 120, "0.6.3", plain["flag_prefix"], phases, engine_version, way_out)
    if plain["prefill"] != "trtllm":
        assert f"{plain['flag_prefix']}-prefill-backend" not in r["guarded"]["error"]


def test_explicit_non_trtllm_backends_are_not_checked(patched):
    both = patched["stock_sm120_user_both"]
    r, plain = both["guarded"], _ok(both["unguarded"])
    if _uses_trtllm(plain):  # pristine 0.5.10 overrides the user's choice with trtllm
        assert r["error_type"] == GUARD_ERROR, r
    else:
        assert (_ok(r)["prefill"], r["decode"]) == ("flashmla_sparse", "flashmla_kv"), r


def test_skip_env_disables_the_check(patched):
    r = _ok(patched["stock_sm120_skip_env"]["guarded"])
    assert r["decode"] == "trtllm", r


@pytest.mark.parametrize("name", ["stock_sm90_user_trtllm", "stock_sm100_user_trtllm", "stock_sm100_bf16"])
def test_other_gpus_are_not_checked(patched, name):
    """SM90/SM100 with trtllm resolved: no failure, same backends as without the guard."""
    r, plain = _ok(patched[name]["guarded"]), _ok(patched[name]["unguarded"])
    assert r["decode"] == "trtllm", r
    assert (r["prefill"], r["decode"]) == (plain["prefill"], plain["decode"])


@pytest.mark.parametrize("name", ["sm12x_sm120_fp8", "sm12x_sm121_fp8", "sm120only_sm120"])
def test_flashinfer_accepting_the_sm_passes(patched, name):
    r = _ok(patched[name]["guarded"])
    assert r["decode"] == "trtllm", r


def test_sm_is_matched_exactly(patched, engine_version):
    """A build that accepts kSM_120 only still refuses SM121 (getSMVersion() = 10 * major + minor)."""
    r = patched["sm120only_sm121"]
    _assert_guard_message(
        r["guarded"],
        121,
        "0.7.2.post1+sm120",
        _ok(r["unguarded"])["flag_prefix"],
        ["decode"],
        engine_version,
    )


def test_no_header_means_no_verdict(patched):
    """FlashInfer without the header (other layout, source tree moved): cannot tell, no failure."""
    r = _ok(patched["noheader_sm120"]["guarded"])
    assert r["decode"] == "trtllm", r


def test_sm90_sm100_match_pristine(patched, pristine):
    """(SM120 with explicit backends is left out: on 0.5.10 the nsa-sm120-trtllm-default patch,
    earlier in the series, changes it on purpose.)"""
    for name in ("stock_sm90_user_trtllm", "stock_sm100_user_trtllm", "stock_sm100_bf16"):
        p, q = _ok(patched[name]["guarded"]), _ok(pristine[name]["guarded"])
        assert (p["prefill"], p["decode"]) == (q["prefill"], q["decode"]), name


@pytest.mark.parametrize("name, sm", [("stock074_sm120_bf16", 120), ("stock074_sm121_bf16", 121)])
def test_bf16_cache_on_sm12x_fails_naming_the_default_fp8_way_out(patched, engine_version, name, sm):
    """A bf16 KV cache still resolves GLM's DSA decode to trtllm on SM12x (0.5.17+ too), and the
    newest FlashInfer on the index (0.7.4) still refuses SM12x: fail at start-up. From 0.5.17 the
    first way out is the default FP8 cache, which upstream resolves to flashinfer_sparse_mla."""
    r, plain = patched[name]["guarded"], _ok(patched[name]["unguarded"])
    assert (plain["prefill"], plain["decode"]) == ("flashmla_sparse", "trtllm"), plain
    way_out = "use the default FP8 KV cache" if engine_version >= NEW_FAMILY else None
    _assert_guard_message(r, sm, "0.7.4", plain["flag_prefix"], ["decode"], engine_version, way_out)
    assert "--dsa-prefill-backend" not in r["error"], r["error"]  # prefill is not trtllm


def _new_family_only(engine_version):
    if engine_version < NEW_FAMILY:
        pytest.skip(
            "a 0.5.17+ case: before 0.5.17 the default FP8 cache resolves GLM to trtllm on "
            "SM12x as well (test_stock_flashinfer_fails_at_startup_when_default_is_trtllm)"
        )


def test_default_fp8_cache_keeps_upstreams_sm12x_backend(patched, pristine, engine_version):
    """GLM with the default KV cache (auto -> fp8_e4m3 through the release's own default) on SM120:
    upstream's flashinfer_sparse_mla, no error, exactly as unpatched (the path that made
    nsa-sm120-trtllm-default obsolete)."""
    _new_family_only(engine_version)
    r, q = _ok(patched["stock074_sm120_auto"]["guarded"]), _ok(pristine["stock074_sm120_auto"]["guarded"])
    assert (r["prefill"], r["decode"], r["kv_cache_dtype"]) == ("flashinfer_sparse_mla", "flashinfer_sparse_mla", "fp8_e4m3"), r
    assert (r["prefill"], r["decode"]) == (q["prefill"], q["decode"]), (r, q)


@pytest.mark.parametrize(
    "name, kv, phases",
    [
        ("stock074_sm120_deepseek_auto", "fp8_e4m3", ["decode", "prefill"]),
        ("stock074_sm120_deepseek_bf16", "bfloat16", ["decode"]),
    ],
)
def test_other_dsa_models_still_default_to_trtllm_and_fail(patched, engine_version, name, kv, phases):
    """DeepSeek V3.2 is not sent to flashinfer_sparse_mla (GLM only): on SM12x its defaults are
    trtllm (both phases with FP8, decode with bf16), so it fails at start-up; the GLM way out
    (default FP8 cache) is not offered."""
    _new_family_only(engine_version)
    r, plain = patched[name]["guarded"], _ok(patched[name]["unguarded"])
    assert [p for p in ("decode", "prefill") if plain[p] == "trtllm"] == phases, plain
    assert plain["kv_cache_dtype"] == kv, plain
    _assert_guard_message(r, 120, "0.7.4", "--dsa", phases, engine_version)
    assert "default FP8 KV cache" not in r["error"] and "leave --dsa" not in r["error"], r["error"]


def test_skip_env_disables_the_bf16_check(patched):
    r = _ok(patched["stock074_sm120_bf16_skip_env"]["guarded"])
    assert r["decode"] == "trtllm", r


def test_flashinfer_accepting_sm12x_passes_a_bf16_cache(patched):
    r = _ok(patched["sm12x_sm120_bf16"]["guarded"])
    assert r["decode"] == "trtllm", r


def test_sm90_bf16_and_sm100_default_match_pristine(patched, pristine, engine_version):
    names = ["stock074_sm90_bf16"] + (["stock074_sm100_auto"] if engine_version >= NEW_FAMILY else [])
    for name in names:
        p, q = _ok(patched[name]["guarded"]), _ok(pristine[name]["guarded"])
        assert (p["prefill"], p["decode"]) == (q["prefill"], q["decode"]), name
        if "sm100" in name:  # Blackwell's default is trtllm: the guard had something to look at
            assert (p["prefill"], p["decode"]) == ("trtllm", "trtllm"), p


@pytest.mark.pristine_fails
def test_pristine_release_starts_with_trtllm_on_sm120(pristine, engine_version):
    """The bug: the unpatched release accepts trtllm on SM120 with a stock FlashInfer at start-up
    (it then crashes at the first forward pass with "Unsupported architecture"; from 0.5.17 GLM
    with an FP8 cache and an explicit trtllm is refused when the attention backend is built)."""
    names = ["stock_sm120_bf16", "stock_sm120_user_trtllm_decode", "stock074_sm120_bf16"]
    if engine_version >= NEW_FAMILY:
        names.append("stock074_sm120_deepseek_auto")
    for name in names:
        r = _ok(pristine[name]["guarded"])
        assert r["decode"] == "trtllm", (name, r)
