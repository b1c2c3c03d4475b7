"""`check` asks the index on a thread of its own while it reads the series (registry.open_upstream_soon):
what either side raises still reaches the user, and a store error does not wait for the network."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from patchctl.core.errors import NetworkError
from patchctl.sources import fetch, registry
from patchctl.sources.spec import parse_spec


@pytest.fixture
def silent_server():
    """A server that accepts connections and never answers: the network as a black hole."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/simple"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


def test_a_damaged_store_is_reported_without_waiting_for_the_index(tmp_path, silent_server):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "series.yaml").write_text("patches: [")
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "patchctl.cli.main",
            "check",
            "vllm@0.23.0",
            "--json",
            "--no-bundled",
            "--store",
            str(tmp_path),
            "--index-url",
            silent_server,
        ],
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "PATCHCTL_CACHE_DIR": str(tmp_path / "cache")},
    )
    seconds = time.monotonic() - start
    doc = json.loads(proc.stdout)
    assert proc.returncode == 2 and "not valid YAML" in doc["error"]["message"]
    assert seconds < 20, f"the store error waited {seconds:.1f} s for an index that never answers (timeout 60 s)"


def test_what_the_index_thread_raises_is_raised_by_the_caller(tmp_path):
    ctx = fetch.SourceContext(index_url="http://127.0.0.1:9/simple")  # port 9: nothing listens
    result = registry.open_upstream_soon(parse_spec("vllm@0.23.0"), ctx)
    with pytest.raises(NetworkError, match="cannot read vllm from the package index"):
        result()
