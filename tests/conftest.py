from __future__ import annotations

import os
from pathlib import Path

import pytest

from patchctl.testing.builders import StoreBuilder, write_tree

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
