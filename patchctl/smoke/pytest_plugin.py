"""pytest plugin loaded into smoke-check runs (`pytest -p patchctl.smoke.pytest_plugin`).

It must import nothing but the standard library, pytest and packaging: it runs inside the smoke
environment, which does not have patchctl's own dependencies installed.
"""

from __future__ import annotations

import os
import pathlib

import pytest
from packaging.version import Version


def _required(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        pytest.skip(f"{var} is not set: run this check through `patchctl smoke`")
    return value


@pytest.fixture(scope="session")
def patched_tree() -> pathlib.Path:
    return pathlib.Path(_required("PATCHCTL_PATCHED_TREE"))


@pytest.fixture(scope="session")
def pristine_tree() -> pathlib.Path:
    return pathlib.Path(_required("PATCHCTL_PRISTINE_TREE"))


@pytest.fixture(scope="session")
def engine_version() -> Version:
    return Version(_required("PATCHCTL_ENGINE_VERSION"))


@pytest.fixture(scope="session")
def engine_name() -> str:
    return _required("PATCHCTL_ENGINE")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; reported 'not run: no GPU' without one")
    config.addinivalue_line(
        "markers",
        "pristine_fails: asserts the unpatched release misbehaves; deselected "
        "when the checks prove an upstreamed version on its pristine tree",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="not run: no GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
