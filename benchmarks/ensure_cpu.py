"""CPU of `patchctl ensure` on an intact tree against the import floor, measured in the same run
(issue 24, item 7: ensure <= 2x `python -c "import click, yaml, packaging.specifiers"`).

    python benchmarks/ensure_cpu.py [-n 20]

Each row is the median user+sys CPU of N fresh child processes (resource.getrusage of the children,
so a loaded machine's waiting does not count). The tree is a small synthetic vLLM tree with one patch
applied by `patchctl apply --store S`; ensure runs as a unit runs it, with no --store (the record
names the store). Both rows run with bytecode, as an installed package has it (PYTHONPYCACHEPREFIX
in the run's own folder: a checkout run with PYTHONDONTWRITEBYTECODE would compile patchctl every
time). Prints a table and exits 1 when ensure is over 2x the floor.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FLOOR = "import click, yaml, packaging.specifiers"
LIMIT = 2.0


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="runs per row (median)")
    args = parser.parse_args()
    from support.builders import StoreBuilder, install_fake_dist
    from support.fixtures import PRISTINE, loader_with
    from support.invoke import run_json

    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        env = dict(
            os.environ,
            PATCHCTL_DATA_DIR=str(work / "data"),
            PATCHCTL_CONFIG=str(work / "config.yaml"),
            PATCHCTL_CACHE_DIR=str(work / "cache"),
            PATCHCTL_BUNDLED="0",
        )
        env.pop("PATCHCTL_STORE", None)
        # Bytecode as an installed package has it (pip compiles on install): written once by the
        # warm-up runs into a folder of this run, never into the checkout.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        os.environ.update({k: env[k] for k in ("PATCHCTL_DATA_DIR", "PATCHCTL_CONFIG", "PATCHCTL_CACHE_DIR", "PATCHCTL_BUNDLED")})
        builder = StoreBuilder(work / "store")
        builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
        tree = work / "tree"
        install_fake_dist(tree, "vllm", "1.0", PRISTINE)
        run_json("apply", "vllm", "--target", str(tree), "--store", str(builder.root), expect=0)
        rows = {
            "import floor": [sys.executable, "-c", FLOOR],
            "ensure (intact, no --store)": [sys.executable, "-m", "patchctl.cli.main", "ensure", "vllm", "--target", str(tree)],
            "status": [sys.executable, "-m", "patchctl.cli.main", "status", "vllm", "--target", str(tree)],
        }
        for argv in rows.values():
            cpu_of(argv, env)  # warm the page cache and the bytecode
        results: dict[str, float] = {name: 0.0 for name in rows}
        samples: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.n):  # interleaved, so a change in load hits every row alike
            for name, argv in rows.items():
                samples[name].append(cpu_of(argv, env))
        results = {name: statistics.median(values) for name, values in samples.items()}
    floor = results["import floor"]
    print(f"{'command':<30} {'CPU ms (median of ' + str(args.n) + ')':>24} {'x floor':>8}")
    for name, value in results.items():
        print(f"{name:<30} {value * 1000:>24.1f} {value / floor:>8.2f}")
    ratio = results["ensure (intact, no --store)"] / floor
    print(f"target: ensure <= {LIMIT}x the floor: {'met' if ratio <= LIMIT else 'NOT met'} ({ratio:.2f}x)")
    return 0 if ratio <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
