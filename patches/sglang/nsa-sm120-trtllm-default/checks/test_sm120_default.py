"""CPU checks: the NSA/DSA decode default on SM12x, run against the real release source.

The capability is stubbed (see _dsa_probe.py); no GPU and no model weights are involved.
"""

import pytest


def _ok(result):
    assert result["error"] is None, result["error"]
    return result


def test_sm12x_fp8_defaults_to_trtllm(patched_backends):
    for name in ("sm120_fp8", "sm121_fp8"):
        r = _ok(patched_backends[name])
        assert r["decode"] == "trtllm", (name, r)
        # prefill follows decode for the FP8 cache (as upstream does from 0.5.10)
        assert r["prefill"] == "trtllm", (name, r)


def test_sm12x_bf16_decode_is_trtllm(patched_backends):
    assert _ok(patched_backends["sm120_bf16"])["decode"] == "trtllm"


def test_user_choice_is_kept_on_sm120(patched_backends):
    r = _ok(patched_backends["sm120_fp8_user_decode"])
    assert r["decode"] == "flashmla_kv", r
    r = _ok(patched_backends["sm120_fp8_user_prefill"])
    assert r["prefill"] == "flashmla_sparse", r
    assert r["decode"] == "trtllm", r
    r = _ok(patched_backends["sm120_fp8_user_both"])
    assert (r["prefill"], r["decode"]) == ("flashmla_sparse", "flashmla_kv"), r


def test_sm90_and_sm100_defaults_unchanged(patched_backends, pristine_backends):
    for name in ("sm90_fp8", "sm90_bf16", "sm100_fp8", "sm100_bf16"):
        patched, pristine = _ok(patched_backends[name]), _ok(pristine_backends[name])
        assert (patched["prefill"], patched["decode"]) == (
            pristine["prefill"],
            pristine["decode"],
        ), name


@pytest.mark.pristine_fails
def test_pristine_release_fails_the_sm120_check(pristine_backends):
    """The unpatched release either defaults SM120/FP8 decode to a flashmla backend (0.5.9)
    or forces trtllm over the user's explicit choice (0.5.10). From 0.5.11 upstream passes the
    checks above unpatched: that is where this patch is upstreamed."""
    default = _ok(pristine_backends["sm120_fp8"])
    user = _ok(pristine_backends["sm120_fp8_user_decode"])
    passes = default["decode"] == "trtllm" and user["decode"] == "flashmla_kv"
    assert not passes, (default, user)
