"""scripts/serve/setup_llama_server.sh prints the llama.cpp server command with the flags validate
needs (the ones test_serve_llama starts it with) and the validate command, and says each stage."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "serve" / "setup_llama_server.sh"


def test_a_set_up_cache_prints_the_server_command_validate_needs(tmp_path):
    from tests.validate.test_serve_llama import server_command  # the flags the slow tier starts it with

    cache = tmp_path / "cache"
    (cache / "venv" / "bin").mkdir(parents=True)
    python = cache / "venv" / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")  # `import llama_cpp.server` succeeds: the cache is complete
    python.chmod(0o755)
    (cache / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"GGUF")
    (cache / ".llama-cpp-python-0.3.36").touch()
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATCHCTL_LLAMA_CACHE": str(cache), "PATCHCTL_LLAMA_PORT": "8123"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"PATCHCTL_LLAMA_PYTHON={python}",
        f"PATCHCTL_LLAMA_MODEL={cache / 'gemma-3-270m-q4_k_m.gguf'}",
    ]
    validate = next(line for line in proc.stderr.splitlines() if "patchctl validate" in line)
    words = shlex.split(validate.split(": ", 1)[1])
    server = shlex.split(words[words.index("--start") + 1])
    expected = server_command(8123)
    # Every flag the slow test starts the server with, with its value (the alias only names the model).
    pairs = {expected[i]: expected[i + 1] for i in range(3, len(expected), 2) if expected[i] != "--model_alias"}
    pairs["--model"] = str(cache / "gemma-3-270m-q4_k_m.gguf")
    got = {server[i]: server[i + 1] for i in range(3, len(server), 2)}
    assert server[:3] == [str(python), "-m", "llama_cpp.server"] and got == pairs


def test_each_stage_and_the_compile_say_what_they_do():
    text = SCRIPT.read_text()
    assert {int(n) for n in re.findall(r'say "\[(\d)/4\]', text)} == {1, 2, 3, 4}
    assert 'heartbeat "compiling llama.cpp" &' in text  # a line a minute while the compile runs
