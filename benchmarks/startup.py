"""Start-up cost of the commands a service runs on every start, side by side with the import floor.

    python benchmarks/startup.py [-n 20]      CPU time (user+sys of the child), median of N runs
    python benchmarks/startup.py --imports    which heavy libraries each command imports

(a) the import floor: `python -c "import click, yaml, packaging.specifiers"`;
(b) `patchctl ensure vllm --target T` on an intact target T; (c) `patchctl status vllm --target T`;
(d) `patchctl --help`. T is a small synthetic tree with one patch applied first by `patchctl apply`.
Target: ensure <= 2x the floor's CPU; none of requests, GitPython, rich, matplotlib imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("requests", "git", "rich", "matplotlib", "urllib3")
FLOOR = "import click, yaml, packaging.specifiers"

# Runs the real entry point in-process, then reports which heavy top-level modules were imported.
WRAPPER = r"""
import json, sys
heavy = {heavy!r}
sys.argv = ["patchctl"] + json.loads(sys.argv[1])
code = 0
try:
    from patchctl.cli.main import main
    main()
except SystemExit as exc:
    code = exc.code
finally:
    sys.stdout.flush()
    found = sorted(h for h in heavy if h in sys.modules)
    sys.__stderr__.write("\nPATCHCTL-IMPORTS " + json.dumps({{"exit": code, "heavy": found}}) + "\n")
"""


def build_target(work: Path) -> tuple[Path, Path]:
    """A store with one patch and a tree it is applied to: (store, tree)."""
    from support.builders import StoreBuilder, install_fake_dist
    from support.fixtures import PRISTINE, loader_with

    builder = StoreBuilder(work / "store")
    variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
    builder.add("vllm", "loader", variants={"1.0": variant})
    tree = work / "tree"
    install_fake_dist(tree, "vllm", "1.0", PRISTINE)
    return builder.root, tree


def patchctl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "patchctl.cli.main", *args]


def cpu_of(cmd: list[str], env: dict, expect: int = 0) -> tuple[float, float]:
    """(user+sys CPU seconds, wall seconds) of one child run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != expect:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode} (expected {expect}):\n{err}")
    return usage.ru_utime + usage.ru_stime, wall


def commands(store: Path, tree: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (command line, patchctl argv for --imports; [] for the floor)."""
    ensure = ["ensure", "vllm", "--target", str(tree), "--store", str(store)]
    status = ["status", "vllm", "--target", str(tree)]
    return {
        "import floor": ([sys.executable, "-c", FLOOR], []),
        "ensure (intact)": (patchctl_cmd(*ensure), ensure),
        "status": (patchctl_cmd(*status), status),
        "--help": (patchctl_cmd("--help"), ["--help"]),
        # What a unit or a script that reads the document runs: no text rendering.
        "ensure --json": (patchctl_cmd(*ensure, "--json"), [*ensure, "--json"]),
        "status --json": (patchctl_cmd(*status, "--json"), [*status, "--json"]),
    }


def imports_of(argv: list[str], env: dict) -> dict:
    if not argv:
        code = f"import sys; {FLOOR}; print(sorted(h for h in {HEAVY!r} if h in sys.modules))"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return {"exit": 0, "heavy": json.loads(out.stdout.replace("'", '"'))}
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER.format(heavy=HEAVY), json.dumps(argv)], env=env, capture_output=True, text=True
    )
    for line in proc.stderr.splitlines():
        if line.startswith("PATCHCTL-IMPORTS "):
            return json.loads(line.split(" ", 1)[1])
    raise SystemExit(f"no import report from patchctl {' '.join(argv)}:\n{proc.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--repeat", type=int, default=20, help="runs of each command (default 20)")
    parser.add_argument("--imports", action="store_true", help="list the heavy libraries each command imports")
    parser.add_argument(
        "--as-is",
        action="store_true",
        help="keep this environment's bytecode settings (by default the children get a bytecode "
        "cache, as an installed patchctl has; PYTHONDONTWRITEBYTECODE=1 makes every start "
        "compile patchctl anew)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="patchctl-startup-") as tmp:
        work = Path(tmp)
        env = dict(
            os.environ,
            PATCHCTL_DATA_DIR=str(work / "data"),
            PATCHCTL_CONFIG=str(work / "config.yaml"),
            PATCHCTL_CACHE_DIR=str(work / "cache"),
        )
        if not args.as_is:
            # As installed by pip: bytecode compiled once, not on every start (kept out of the tree).
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        store, tree = build_target(work)
        subprocess.run(
            patchctl_cmd("apply", "vllm", "--target", str(tree), "--store", str(store), "--json"),
            env=env,
            check=True,
            capture_output=True,
        )
        table = commands(store, tree)
        if args.imports:
            # The writing commands last and in this order: revert un-applies, apply applies again.
            writers = {
                "revert --json": ["revert", "vllm", "--target", str(tree), "--json"],
                "apply --target --json": ["apply", "vllm", "--target", str(tree), "--store", str(store), "--json"],
            }
            print("| command | heavy modules imported | exit |")
            print("|---|---|---|")
            for name, argv in [*((n, a) for n, (_, a) in table.items()), *writers.items()]:
                report = imports_of(argv, env)
                print(f"| {name} | {', '.join(report['heavy']) or 'none'} | {report['exit']} |")
            return
        for cmd, _ in table.values():  # warm-up: bytecode written, files in the page cache
            cpu_of(cmd, env)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in table}
        for _ in range(args.repeat):  # interleaved, so a noisy moment hits every command alike
            for name, (cmd, _) in table.items():
                samples[name].append(cpu_of(cmd, env))
        floor = statistics.median(c for c, _ in samples["import floor"])
        if args.as_is:
            setting = os.environ.get("PYTHONDONTWRITEBYTECODE", "")
            bytecode = f"as this environment has it (PYTHONDONTWRITEBYTECODE={setting!r})"
        else:
            bytecode = "cached, as after pip install"
        print(f"{args.repeat} runs each, {os.cpu_count()} cores, {sys.executable} {sys.version.split()[0]}, bytecode {bytecode}")
        print()
        print("| command | CPU ms (median) | wall ms (median) | CPU / floor |")
        print("|---|---:|---:|---:|")
        for name, runs in samples.items():
            cpu = statistics.median(c for c, _ in runs)
            wall = statistics.median(w for _, w in runs)
            print(f"| {name} | {cpu * 1000:.0f} | {wall * 1000:.0f} | {cpu / floor:.2f}x |")
        ensure = statistics.median(c for c, _ in samples["ensure (intact)"])
        print()
        print(f"ensure <= 2x floor: {'met' if ensure <= 2 * floor else 'NOT met'} ({ensure / floor:.2f}x)")


if __name__ == "__main__":
    main()
