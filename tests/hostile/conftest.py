"""The hostile-target suite: a tree (and its bookkeeping) written by someone other than the user who
runs patchctl, as when root runs `ensure` on a venv a service user owns. Every case runs the real
CLI in its own process and is classed (hostile_cli.py); the terminal summary prints the count per
class (issue 23)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_cli import PATCHED_LOADER, PATCHED_UTILS, TALLY, Case
from support.builders import install_fake_dist
from support.fixtures import PRISTINE


@pytest.fixture
def case(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("precious\n")
    (outside / "blobs").mkdir()
    (outside / "blobs" / "x").write_text("precious\n")

    def make(klass: str) -> Case:
        return Case(klass, outside)

    make.outside = outside  # type: ignore[attr-defined]
    return make


@pytest.fixture
def site(tmp_path) -> Path:
    """vllm 1.0 as pip leaves it: the files and a dist-info whose RECORD hashes them."""
    root = tmp_path / "site"
    install_fake_dist(root, "vllm", "1.0", PRISTINE)
    return root


@pytest.fixture
def store(builder) -> Path:
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": PATCHED_LOADER})})
    builder.add(
        "vllm",
        "utils",
        variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": PATCHED_UTILS, "vllm/added.py": "NEW = True\n"})},
    )
    return builder.root


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TALLY:
        return
    terminalreporter.section("hostile cases per class")
    columns = ("cases", "ok", "clean-error", "traceback", "hang", "outside-writes")
    terminalreporter.write_line(f"{'class':<34}" + "".join(f"{c:>16}" for c in columns))
    for klass in sorted(TALLY):
        terminalreporter.write_line(f"{klass:<34}" + "".join(f"{TALLY[klass][c]:>16}" for c in columns))
