"""bench_decode.py reads vLLM's dense decode kernel from the release itself (through
patchctl's sources and the configured package index), not from a file someone copied."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from support.builders import build_wheel
from support.index_server import IndexServer

# Only looked up, not imported: importing triton here, before test_sparse_mla.py sets
# TRITON_INTERPRET=1 for its CPU run, would leave that run compiling for a GPU.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None,
    reason="bench_decode.py imports torch and triton (the benchmark runs in a subprocess)",
)

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "sparse_mla" / "bench_decode.py"
MEMBER = "vllm/v1/attention/ops/triton_decode_attention.py"


def fetch(index_url: str, version: str, dest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), "--fetch-dense", str(dest), "--dense-version", version, "--index-url", index_url],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_fetch_dense_reads_the_release_member(tmp_path, fresh_cache):
    files = tmp_path / "files"
    files.mkdir()
    body = "def decode_attention_fwd(*args):\n    return 'from the 0.23.0 wheel'\n"
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "0.23.0", {"vllm/__init__.py": "", MEMBER: body}))
        server.add("vllm", build_wheel(files, "vllm", "0.22.0", {"vllm/__init__.py": "", MEMBER: "old\n"}))
        proc = fetch(server.url, "0.23.0", tmp_path / "out")
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (tmp_path / "out" / "triton_decode_attention-vllm-0.23.0.py").read_text() == body
        assert "vllm-0.23.0-py3-none-any.whl" in proc.stdout

        missing = fetch(server.url, "0.24.0", tmp_path / "none")
    assert missing.returncode == 1
    assert "vllm 0.24.0 is not on the package index" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert not (tmp_path / "none" / "triton_decode_attention-vllm-0.24.0.py").exists()
