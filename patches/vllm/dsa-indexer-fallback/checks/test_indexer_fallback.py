"""The DSA indexer's DeepGEMM logits wrappers fall back to PyTorch (CPU check)."""
from __future__ import annotations

import pytest

from _dif_probe import run_probe


@pytest.fixture(scope="module")
def res(patched_tree):
    return run_probe(patched_tree)


def test_prefill_logits_match_reference(res):
    p = res["prefill"]
    assert p["ok"], p
    assert p["shape"] == [5, 23]
    assert p["inf_pattern_equal"]
    assert p["max_abs_err"] < 1e-3, p


@pytest.mark.parametrize(
    "case", ["next_n=1,2d=False", "next_n=1,2d=True", "next_n=2,2d=False", "next_n=2,2d=True"]
)
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


def test_pristine_wrapper_needs_deepgemm(pristine_tree):
    import os
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import torch\n"
        "import vllm.utils.deep_gemm as dg\n"
        "f = getattr(dg, 'fp8_fp4_mqa_logits', None) or dg.fp8_mqa_logits\n"
        "try:\n"
        "    f(torch.zeros(1,1,8), (torch.zeros(1,8), torch.ones(1)), torch.ones(1,1),"
        " torch.zeros(1,dtype=torch.int32), torch.ones(1,dtype=torch.int32), clean_logits=False)\n"
        "    print('RESULT ran')\n"
        "except RuntimeError as e:\n"
        "    print('RESULT', e)\n"
    )
    env = dict(os.environ, VLLM_DSA_INDEXER_FALLBACK="1")
    r = subprocess.run([sys.executable, "-c", code, str(pristine_tree)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert line and "DeepGEMM backend is not available" in line[-1], r.stdout[-3000:]
