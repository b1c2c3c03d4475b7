"""Shared by the SGLang bench_serving checks: a local reasoning-model server and a runner.

Each bench patch's checks/conftest.py imports the `reasoning_server` fixture (or `pinging_server`) from here; its
checks import `run_bench` and `assert_sane`."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from checklib.sglang import _fake_reasoning_server as fake

HERE = pathlib.Path(__file__).resolve().parent


def _serve(tmp_path_factory, ping):
    model_dir = fake.make_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))
    server = fake.start(model_dir, ping=ping)
    yield {"base_url": server.root, "model_path": str(model_dir)}
    server.stop()


@pytest.fixture(scope="session")
def reasoning_server(tmp_path_factory):
    yield from _serve(tmp_path_factory, ping=False)


@pytest.fixture(scope="session")
def pinging_server(tmp_path_factory):
    """The same server, with an SSE keep-alive comment before every streamed event."""
    yield from _serve(tmp_path_factory, ping=True)


NUM_PROMPTS = 3


def run_bench(tree, server, tmp_path, *, backend, stream, tokenizer=True):
    """Run the release's benchmark CLI against the fake server; return (proc, metrics|None)."""
    out = tmp_path / "bench.jsonl"
    cmd = [
        sys.executable,
        str(HERE / "_bench_runner.py"),
        str(tree),
        "--backend",
        backend,
        "--base-url",
        server["base_url"],
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "8",
        "--random-output-len",
        str(fake.OUTPUT_WORDS),
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        str(NUM_PROMPTS),
        "--request-rate",
        "inf",
        "--seed",
        "1",
        "--output-file",
        str(out),
        "--disable-tqdm",
    ]
    if tokenizer:
        cmd += ["--tokenizer", server["model_path"]]
    if not stream:
        cmd.append("--disable-stream")
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost"
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=env)
    text = out.read_text().strip() if out.exists() else ""
    return proc, json.loads(text.splitlines()[-1]) if text else None


def assert_sane(proc, metrics, timing=True):
    tail = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    assert metrics is not None, tail
    assert metrics["completed"] == NUM_PROMPTS, metrics
    assert metrics["total_output_tokens"] == NUM_PROMPTS * fake.OUTPUT_WORDS, metrics
    # the tiny tokenizer gives one token per word: the retokenized text must match
    assert metrics["total_output_tokens_retokenized"] == NUM_PROMPTS * fake.OUTPUT_WORDS, metrics
    assert metrics["mean_ttft_ms"] > 0, metrics
    if timing:
        assert metrics["mean_tpot_ms"] > 0, metrics
        assert metrics["mean_itl_ms"] > 0, metrics
