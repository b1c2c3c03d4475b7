"""The development kernel of kernels/sparse_mla/next/ (issue 35, NOTES.md v10 and next/README.md):
the 8-bit stage 1 and fp8_ds_mla, never run on a GPU, NOT what the patch ships. The shipped file
(kernels/sparse_mla/triton_sparse_mla.py, loaded by test_sparse_mla.py) keeps its own tests;
the tests of next/ load it through here.

SPARSE_MLA_NEXT_KERNEL points them at another file (a mutation check; or, once next/ is
promoted, nothing: the tests then move to the shipped file). Import test_sparse_mla first:
it sets TRITON_INTERPRET on a machine without CUDA, which triton reads at import.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEXT_KERNEL = Path(os.environ.get("SPARSE_MLA_NEXT_KERNEL") or ROOT / "kernels" / "sparse_mla" / "next" / "triton_sparse_mla.py")


@functools.cache
def load():
    """next/triton_sparse_mla.py, loaded by path (it loads its sibling triton_sparse_mla_fp8.py by
    path too), once per process: every test module of next/ shares the same compiled kernels."""
    spec = importlib.util.spec_from_file_location("triton_sparse_mla_next_under_test", NEXT_KERNEL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fp8_cfg(name):
    """Launch parameters of a named config of next/'s 8-bit kernel (its split count left to the caller)."""
    c = load()._fp8.FP8_CONFIGS[name]
    return dict(
        block_h=c.block_h, block_n=c.block_n, num_warps=c.num_warps, num_stages=c.num_stages, pv_reload=c.pv_reload, num_splits=4
    )
