"""benchmarks/sparse_mla/gpu_recheck_fp8.sh without a GPU: run with `python` and `nvidia-smi`
replaced by stubs that record their arguments, it must test and time the development kernel
(kernels/sparse_mla/next/) as "after" and the shipped kernel as "before", and its test step's
selection must collect next/'s 8-bit and fp8_ds_mla tests (checked by a real collection)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sparse_mla" / "gpu_recheck_fp8.sh"
NEXT = "kernels/sparse_mla/next/triton_sparse_mla.py"
SHIPPED = "kernels/sparse_mla/triton_sparse_mla.py"


def run_script(tmp_path, **env_extra):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "calls.jsonl"
    record = (
        "import json, os, sys; open(os.environ['RECHECK_LOG'], 'a').write(json.dumps("
        "dict(argv=sys.argv[1:], next=os.environ.get('SPARSE_MLA_NEXT_KERNEL'))) + '\\n')"
    )
    (stubs / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(record)} "$@"\n')
    (stubs / "nvidia-smi").write_text("#!/bin/sh\necho stub\n")
    for f in stubs.iterdir():
        f.chmod(0o755)
    env = dict(os.environ, PATH=f"{stubs}:{os.environ['PATH']}", OUT=str(tmp_path / "out"), RECHECK_LOG=str(log), **env_extra)
    for k in ("AFTER", "BEFORE"):
        if k not in env_extra:
            env.pop(k, None)
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def kernel_of(argv):
    return argv[argv.index("--kernel") + 1] if "--kernel" in argv else None


def test_after_is_next_and_before_is_the_shipped_kernel(tmp_path):
    proc, calls = run_script(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    benches = [c["argv"] for c in calls if c["argv"][:1] == ["benchmarks/sparse_mla/bench_decode.py"]]
    assert len(benches) == 5, benches
    by_kernel = {}
    for argv in benches:
        by_kernel.setdefault(kernel_of(argv), []).append(argv)
    assert set(by_kernel) == {NEXT, SHIPPED}, by_kernel.keys()
    assert len(by_kernel[SHIPPED]) == 1 and "fp8_ds_mla" not in " ".join(by_kernel[SHIPPED][0])
    assert any("fp8_ds_mla" in " ".join(a) and "--sweep" in a for a in by_kernel[NEXT])
    for path in (NEXT, SHIPPED):
        assert (ROOT / path).is_file()
    tests = [c for c in calls if c["argv"][:2] == ["-m", "pytest"]]
    assert len(tests) == 2 and all(c["next"] == NEXT for c in tests)
    assert all("tests/kernels/test_sparse_mla_next.py" in c["argv"] for c in tests)
    assert "tests/kernels/test_sparse_mla.py" not in tests[0]["argv"]  # the shipped file's tests are not next/'s


def test_the_test_step_collects_next_8bit_and_ds_mla_tests(tmp_path):
    _, calls = run_script(tmp_path)
    argv = next(c["argv"] for c in calls if c["argv"][:2] == ["-m", "pytest"])
    files = [a for a in argv if a.startswith("tests/")]
    expr = argv[argv.index("-k") + 1]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            *files,
            "-k",
            expr,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert any("test_sparse_mla_ds.py::test_ds_mla_glm5_shapes" in i for i in ids)
    assert any("test_sparse_mla_next.py::test_fp8_kv_cache_8bit_kernel" in i for i in ids)
    assert any("test_sparse_mla_next.py::test_glm5_fp8_full_shapes" in i for i in ids)
    assert not any("compile_within" in i for i in ids)  # checked on CPU; not worth GPU minutes


@pytest.mark.parametrize("which", ["AFTER", "BEFORE"])
def test_a_missing_kernel_file_stops_the_script(tmp_path, which):
    proc, calls = run_script(tmp_path, **{which: "kernels/sparse_mla/no_such_kernel.py"})
    assert proc.returncode == 2
    assert "no kernel file kernels/sparse_mla/no_such_kernel.py" in proc.stdout
    assert not any(c["argv"][:1] == ["benchmarks/sparse_mla/bench_decode.py"] for c in calls)
