"""Run one release's benchmark CLI (`sglang.bench_serving`, or `sglang.benchmark.serving` from
0.5.15) in this interpreter: `python _bench_runner.py <tree> <cli args...>`."""
import runpy
import sys

tree = sys.argv[1]
sys.path.insert(0, tree)
import _sglang_cpu_stubs  # noqa: E402

_sglang_cpu_stubs.install()
import os  # noqa: E402

module = (
    "sglang.benchmark.serving"
    if os.path.exists(os.path.join(tree, "sglang", "benchmark", "serving.py"))
    else "sglang.bench_serving"
)
sys.argv = [module] + sys.argv[2:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
