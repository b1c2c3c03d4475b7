"""Run one release's benchmark CLI (`sglang.bench_serving`, or `sglang.benchmark.serving` from
0.5.15) in this interpreter: `python _bench_runner.py <tree> <cli args...>`."""

import os
import runpy
import sys

from checklib.stubs import stub_missing

tree = sys.argv[1]
sys.path.insert(0, tree)
# SGLang imports torchvision at module level (image helpers); PyPI torchvision cannot sit next to
# the CPU torch build. Nothing the bench exercises calls into it.
stub_missing("torchvision")

module = (
    "sglang.benchmark.serving"
    if os.path.exists(os.path.join(tree, "sglang", "benchmark", "serving.py"))
    else "sglang.bench_serving"
)
sys.argv = [module] + sys.argv[2:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
