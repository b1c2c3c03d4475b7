#!/usr/bin/env python3
"""Regenerate this patch's variants: the generator is shared with
`triton-sparse-mla` (../triton-sparse-mla/build_variants.py, which see)."""
import pathlib
import runpy
import sys

if __name__ == "__main__":
    script = pathlib.Path(__file__).resolve().parent.parent / "triton-sparse-mla" / "build_variants.py"
    sys.argv = [str(script), "--only", "dsa-indexer-fallback", *sys.argv[1:]]
    runpy.run_path(str(script), run_name="__main__")
