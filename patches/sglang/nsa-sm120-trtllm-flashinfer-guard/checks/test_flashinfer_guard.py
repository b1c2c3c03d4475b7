"""CPU checks: the start-up guard for DSA/NSA trtllm on SM12x with a FlashInfer that refuses SM12x.

Run against the real release source; the device capability is stubbed and FlashInfer is a fake
package that only carries fmhaRunner.cuh (see conftest.py and _guard_probe.py). No GPU involved.
"""
import pytest

GUARD_ERROR = "TrtllmGenUnsupportedOnSM12x"
SKIP_ENV = "SGLANG_SKIP_SM120_TRTLLM_CHECK"


def _ok(result):
    assert result["error"] is None, result["error"]
    return result


def _uses_trtllm(result):
    return "trtllm" in (result["prefill"], result["decode"])


def _assert_guard_message(result, sm, version, prefix, phases):
    assert result["error_type"] == GUARD_ERROR, result["error"]
    msg = result["error"]
    for needle in (
        f"SM{sm}",
        '"Unsupported architecture"',  # the cause, as FlashInfer words it
        f"({version},",  # which FlashInfer
        "fmhaRunner.cuh",
        "FlashInfer build whose trtllm-gen FMHA runner supports",  # way out 1
        "sglang >= 0.5.17",  # way out 3
        f"{SKIP_ENV}=1",
    ):
        assert needle in msg, (needle, msg)
    for phase in phases:  # way out 2 names the flag of each phase that resolved to trtllm
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
def test_stock_flashinfer_fails_at_startup_when_default_is_trtllm(patched, name, sm, version):
    """Where the release (and the series before this patch) defaults SM12x to trtllm, server
    arguments fail with the cause; where it does not (pristine 0.5.9 FP8 without the default
    patch: flashmla_kv), nothing changes."""
    r, plain = patched[name]["guarded"], _ok(patched[name]["unguarded"])
    if _uses_trtllm(plain):
        phases = [p for p in ("prefill", "decode") if plain[p] == "trtllm"]
        _assert_guard_message(r, sm, version, plain["flag_prefix"], phases)
    else:
        assert (_ok(r)["prefill"], r["decode"]) == (plain["prefill"], plain["decode"])


def test_bf16_default_on_sm120_is_trtllm_and_guarded(patched):
    """Every covered release defaults the bf16 DSA decode to trtllm on major >= 10, so the check
    above is not vacuous for it."""
    assert _ok(patched["stock_sm120_bf16"]["unguarded"])["decode"] == "trtllm"
    assert patched["stock_sm120_bf16"]["guarded"]["error_type"] == GUARD_ERROR


def test_explicit_trtllm_decode_on_sm120_fails_naming_decode(patched):
    r = patched["stock_sm120_user_trtllm_decode"]
    plain = _ok(r["unguarded"])
    assert plain["decode"] == "trtllm", plain
    # prefill stays the user's flashmla_sparse, except on pristine 0.5.10, which forces trtllm
    phases = [p for p in ("prefill", "decode") if plain[p] == "trtllm"]
    _assert_guard_message(r["guarded"], 120, "0.6.3", plain["flag_prefix"], phases)
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


@pytest.mark.parametrize(
    "name", ["stock_sm90_user_trtllm", "stock_sm100_user_trtllm", "stock_sm100_bf16"]
)
def test_other_gpus_are_not_checked(patched, name):
    """SM90/SM100 with trtllm resolved: no failure, same backends as without the guard."""
    r, plain = _ok(patched[name]["guarded"]), _ok(patched[name]["unguarded"])
    assert r["decode"] == "trtllm", r
    assert (r["prefill"], r["decode"]) == (plain["prefill"], plain["decode"])


@pytest.mark.parametrize("name", ["sm12x_sm120_fp8", "sm12x_sm121_fp8", "sm120only_sm120"])
def test_flashinfer_accepting_the_sm_passes(patched, name):
    r = _ok(patched[name]["guarded"])
    assert r["decode"] == "trtllm", r


def test_sm_is_matched_exactly(patched):
    """A build that accepts kSM_120 only still refuses SM121 (getSMVersion() = 10 * major + minor)."""
    r = patched["sm120only_sm121"]
    _assert_guard_message(
        r["guarded"], 121, "0.7.2.post1+sm120", _ok(r["unguarded"])["flag_prefix"], ["decode"]
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


@pytest.mark.pristine_fails
def test_pristine_release_starts_with_trtllm_on_sm120(pristine):
    """The bug: the unpatched release accepts trtllm on SM120 with a stock FlashInfer at start-up
    (it then crashes at the first forward pass with "Unsupported architecture")."""
    for name in ("stock_sm120_bf16", "stock_sm120_user_trtllm_decode"):
        r = _ok(pristine[name]["guarded"])
        assert r["decode"] == "trtllm", (name, r)
