from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from patchctl.testing.builders import StoreBuilder, build_wheel, write_tree
from patchctl.testing.index_server import IndexServer

PRISTINE = {
    "vllm/__init__.py": "",
    "vllm/loader.py": "".join(f"line {i}\n" for i in range(1, 41)),
    "vllm/utils.py": "def helper():\n    return 1\n\n\ndef other():\n    return 2\n",
}


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory, monkeypatch):
    """Each test gets its own state and config; the download cache is shared per session unless a
    test asks for a fresh one, so real releases are fetched once."""
    base = tmp_path_factory.mktemp("patchctl-home")
    monkeypatch.setenv("PATCHCTL_DATA_DIR", str(base / "data"))
    monkeypatch.setenv("PATCHCTL_CONFIG", str(base / "config.yaml"))
    monkeypatch.setenv("PATCHCTL_CACHE_DIR", os.environ.get("PATCHCTL_TEST_CACHE") or str(shared_cache(tmp_path_factory)))
    monkeypatch.delenv("PATCHCTL_CRASH_AT", raising=False)
    monkeypatch.delenv("PATCHCTL_STORE", raising=False)
    yield


def shared_cache(factory) -> Path:
    return factory.getbasetemp() / "shared-cache"


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PATCHCTL_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def tree(tmp_path) -> Path:
    return write_tree(tmp_path / "tree", PRISTINE)


@pytest.fixture
def builder(tmp_path) -> StoreBuilder:
    return StoreBuilder(tmp_path / "store")


def loader_with(changes: dict[int, str], base: str = PRISTINE["vllm/loader.py"]) -> str:
    lines = base.splitlines(keepends=True)
    for number, text in changes.items():
        lines[number - 1] = text
    return "".join(lines)


@contextlib.contextmanager
def four_release_index(tmp_path: Path, builder: StoreBuilder):
    """Four real wheels of vllm on a local index and one patch, `loader`, that is clean on 1.0,
    applies at an offset on 1.1, conflicts on 1.2 and is upstreamed on 1.3. Yields the server."""
    files = tmp_path / "files"
    files.mkdir()
    trees = {
        "1.0": PRISTINE,
        "1.1": dict(PRISTINE, **{"vllm/loader.py": "# new header\n" + PRISTINE["vllm/loader.py"]}),
        "1.2": dict(PRISTINE, **{"vllm/loader.py": loader_with({9: "nine!\n", 10: "TEN\n", 11: "eleven!\n"})}),
        "1.3": dict(PRISTINE, **{"vllm/loader.py": loader_with({10: "ten\n"})}),
    }
    builder.add("vllm", "loader", applies_to=">=1.0",
                variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    with IndexServer(files) as server:
        for version, files_of_tree in trees.items():
            server.add("vllm", build_wheel(files, "vllm", version, files_of_tree))
        yield server
