#!/usr/bin/env python3
"""Compile stage 1 of one named launch config of the sparse-MLA kernel for a GPU
architecture and print its shared memory per (dtype, split/final) as JSON.

    python tests/kernels/compile_sizes.py KERNEL_FILE CONFIG_NAME ARCH [TTGIR_DIR]   # e.g. ... h16_n32_w4_s3 120

CONFIG_NAME: a name of the kernel's _CONFIGS (bf16/fp16 stage 1, and the shipped kernel's
fp8 word kernel) or, for kernels/sparse_mla/next/, of the 8-bit kernel's FP8_CONFIGS
(next/triton_sparse_mla_fp8.py). TTGIR_DIR: also write each TTGIR there.

No GPU is needed (ptxas ships with triton). Exit 3 when this triton cannot
compile for CUDA here. Run without TRITON_INTERPRET (the interpreter switch is
read while compiling).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def main() -> int:
    kernel_file, name, arch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dump = sys.argv[4] if len(sys.argv) > 4 else None
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as e:
        print(f"triton's compiler is not importable: {e}")
        return 3
    spec = importlib.util.spec_from_file_location("sparse_mla_compile", kernel_file)
    kmod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kmod)
    if name in kmod._CONFIGS:
        c = kmod._CONFIGS[name]
        # (kernel, cache dtype or None for the activation dtype ("nope": the same, rope-free),
        # extra constexprs). Rope-free MLA (GLM-5.3-Flash, D = 512) compiles stage 1 without
        # the rope part (HAS_PE=False).
        kernels = [
            (kmod._sparse_mla_stage1, None, dict(PE_MASKED=False, HAS_PE=True, KV_FP8=False, DOT_F32=False)),
            (kmod._sparse_mla_stage1, "nope", dict(PE_MASKED=True, HAS_PE=False, KV_FP8=False, DOT_F32=False, DPE=16)),
        ]
        # The shipped kernel's fp8 16-bit-word stage 1 (v9) runs with 16-head blocks only;
        # kernels/sparse_mla/next/ has none (its 8-bit kernel has configs of its own, below).
        if c.block_h <= 16 and hasattr(kmod, "_sparse_mla_stage1_fp8_words"):
            kernels.append((kmod._sparse_mla_stage1_fp8_words, "fp8e4nv", {}))
    elif hasattr(kmod, "_fp8"):
        fp8 = kmod._fp8
        # The 8-bit kernel: per-tensor e4m3 and fp8_ds_mla, each with and without rope.
        c = fp8.FP8_CONFIGS[name]
        kernels = [
            (fp8._sparse_mla_stage1_8bit, f"u8:{tag}", dict(HAS_PE=pe, DS_MLA=ds, DPE=64 if pe else 16, PV_RELOAD=c.pv_reload))
            for tag, pe, ds in (
                ("e4m3", True, False),
                ("e4m3-nope", False, False),
                ("ds_mla", True, True),
                ("ds_mla-nope", False, True),
            )
        ]
    else:
        print(f"{name} is not a launch config of {kernel_file}", file=sys.stderr)
        return 2
    sizes = {}
    for fn, kv_dtype, extra in kernels:
        for dtype in ("bf16", "fp16"):
            for final in (False, True):
                consts = dict(
                    PAGE=64,
                    FLAT_KV=True,
                    stride_kvd=1,
                    stride_qd=1,
                    stride_od=1,
                    stride_ik=1,
                    DV=512,
                    DPE=64,
                    BLOCK_H=c.block_h,
                    BLOCK_N=c.block_n,
                    IS_FINAL=final,
                    WRITE_LSE=True,
                )
                consts.update(extra)
                cache = (
                    "u8" if kv_dtype and kv_dtype.startswith("u8") else (kv_dtype if kv_dtype not in (None, "nope") else dtype)
                )
                pointers = {
                    "Q": f"*{dtype}",
                    "KV": f"*{cache}",
                    "IDX": "*i32",
                    "O": f"*{dtype}" if final else "*fp32",
                    "LSE": "*fp32",
                }
                # 16-byte aligned pointers and strides, as the launcher specialises them at run time
                aligned = set(pointers) | {
                    "stride_kvb",
                    "stride_kvs",
                    "stride_qt",
                    "stride_qh",
                    "stride_ot",
                    "stride_oh",
                    "stride_os",
                    "stride_it",
                }
                sig = {}
                for n in fn.arg_names:
                    if n in pointers:
                        sig[n] = pointers[n]
                    elif n in consts:
                        sig[n] = "constexpr"
                    else:
                        sig[n] = "fp32" if n in ("scale_log2", "out_scale") else "i32"
                attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned}
                src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
                try:
                    compiled = triton.compile(
                        src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=c.num_warps, num_stages=c.num_stages)
                    )
                except RuntimeError as e:  # e.g. no ptxas that knows this architecture
                    print(f"compile for sm_{arch} failed: {str(e)[:200]}")
                    return 3
                kv = f"{kv_dtype}/" if kv_dtype else ""
                if dump:  # the TTGIR, to see which loads the pipeliner staged (async copies)
                    Path(dump, f"{name}-{kv.replace('/', '').replace(':', '_')}-{dtype}-{final}.ttgir").write_text(
                        compiled.asm["ttgir"]
                    )
                sizes[f"{kv}{dtype}/{'final' if final else 'split'}"] = compiled.metadata.shared
    print(json.dumps(sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
