#!/usr/bin/env python3
"""Compile stage 1 of one named launch config of the sparse-MLA kernel for a GPU
architecture and print its shared memory per (dtype, split/final) as JSON.

    python tests/kernels/compile_sizes.py KERNEL_FILE CONFIG_NAME ARCH   # e.g. ... h16_n32_w4_s3 120

No GPU is needed (ptxas ships with triton). Exit 3 when this triton cannot
compile for CUDA here. Run without TRITON_INTERPRET (the interpreter switch is
read while compiling).
"""
from __future__ import annotations

import importlib.util
import json
import sys


def main() -> int:
    kernel_file, name, arch = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
    c = kmod._CONFIGS[name]
    # (kernel, cache dtype or None for the activation dtype ("nope": the same, rope-free), extra
    # constexprs); the fp8
    # 16-bit-word kernel runs with 16-head blocks only.
    # Rope-free MLA (GLM-5.3-Flash, D = 512) compiles stage 1 without the rope part (HAS_PE=False).
    kernels = [(kmod._sparse_mla_stage1, None, dict(PE_MASKED=False, HAS_PE=True, KV_FP8=False, DOT_F32=False)),
               (kmod._sparse_mla_stage1, "nope", dict(PE_MASKED=True, HAS_PE=False, KV_FP8=False, DOT_F32=False,
                                                       DPE=16))]
    if c.block_h <= 16:
        kernels.append((kmod._sparse_mla_stage1_fp8_words, "fp8e4nv", {}))
    sizes = {}
    for fn, kv_dtype, extra in kernels:
        for dtype in ("bf16", "fp16"):
            for final in (False, True):
                consts = dict(PAGE=64, FLAT_KV=True, stride_kvd=1, stride_qd=1, stride_od=1, stride_ik=1,
                              DV=512, DPE=64, BLOCK_H=c.block_h, BLOCK_N=c.block_n, IS_FINAL=final,
                              WRITE_LSE=True)
                consts.update(extra)
                cache = kv_dtype if kv_dtype not in (None, "nope") else dtype
                pointers = {"Q": f"*{dtype}", "KV": f"*{cache}", "IDX": "*i32",
                            "O": f"*{dtype}" if final else "*fp32", "LSE": "*fp32"}
                # 16-byte aligned pointers and strides, as the launcher specialises them at run time
                aligned = set(pointers) | {"stride_kvb", "stride_kvs", "stride_qt", "stride_qh", "stride_ot",
                                           "stride_oh", "stride_os", "stride_it"}
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
                    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                              options=dict(num_warps=c.num_warps, num_stages=c.num_stages))
                except RuntimeError as e:  # e.g. no ptxas that knows this architecture
                    print(f"compile for sm_{arch} failed: {str(e)[:200]}")
                    return 3
                kv = f"{kv_dtype}/" if kv_dtype else ""
                sizes[f"{kv}{dtype}/{'final' if final else 'split'}"] = compiled.metadata.shared
    print(json.dumps(sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
