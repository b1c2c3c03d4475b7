"""Fixtures every test gets: its own state and config dirs, a shared download cache, and the small
synthetic vLLM tree of support.fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Test support is not in the package: tests/support/ and tests/checklib (a link to patches/checklib/,
# whose testserver.py is the one test server, which the bundled checks use too). This folder is on
# sys.path as pytest's rootdir; processes the tests start (`python -m support.reasoner`, `-m
# patchctl.cli` with a fake server) find it through PYTHONPATH. Never patches/ itself: its vllm/ and
# sglang/ folders would pass for the engines' packages.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _HERE]
)

import pytest  # noqa: E402
from support.builders import StoreBuilder, write_tree  # noqa: E402
from support.fixtures import PRISTINE  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory, monkeypatch):
    """Each test gets its own state and config; the download cache is shared per session unless a
    test asks for a fresh one, so real releases are fetched once."""
    base = tmp_path_factory.mktemp("patchctl-home")
    monkeypatch.setenv("PATCHCTL_DATA_DIR", str(base / "data"))
    monkeypatch.setenv("PATCHCTL_CONFIG", str(base / "config.yaml"))
    monkeypatch.setenv("PATCHCTL_CACHE_DIR", os.environ.get("PATCHCTL_TEST_CACHE") or str(shared_cache(tmp_path_factory)))
    monkeypatch.delenv("PATCHCTL_STORE", raising=False)
    # A test's --store is the whole patch set (as it was before stores were layered): tests of the
    # layering itself set PATCHCTL_BUNDLED back.
    monkeypatch.setenv("PATCHCTL_BUNDLED", "0")
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
