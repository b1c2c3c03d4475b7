"""patchctl installs as a tool: the wheel and the sdist carry the bundled patch set, and `check`,
`list` and `lint` work from a directory outside the checkout — with pip into a fresh venv, and with
`uv tool install` where uv can be installed. Builds and installs for real (the package index gives
the dependencies), so it is in the slow tier."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # A copy of the checkout without build leftovers, so the test builds what a clone builds.
    src = tmp_path_factory.mktemp("src") / "patchctl"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__",
                                                              ".pytest_cache", "dist"))
    # Without build isolation when this interpreter's setuptools is new enough (faster, no download);
    # else the isolated build fetches its own from the package index.
    flags = ["--no-isolation"] if _setuptools_at_least("68") else []
    proc = subprocess.run([sys.executable, "-m", "build", *flags, "-o", str(out), str(src)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _setuptools_at_least(version: str) -> bool:
    """Read from the metadata: importing setuptools here would replace distutils under the tests."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from packaging.version import Version

    try:
        return Version(installed("setuptools")) >= Version(version)
    except PackageNotFoundError:
        return False


def fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin"


def run_tool(exe: Path, *args: str, cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PATCHCTL_STORE"}
    proc = subprocess.run([str(exe), *args, "--json"], cwd=cwd, capture_output=True, text=True, env=env)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    return doc


def exercise(exe: Path, elsewhere: Path) -> None:
    checked = run_tool(exe, "check", "vllm@0.23.0", cwd=elsewhere)
    assert {p["name"] for p in checked["patches"]} >= {"gguf-glm-dsa", "triton-sparse-mla"}
    listed = run_tool(exe, "list", cwd=elsewhere)
    assert {row["engine"] for row in listed["series"]} == {"vllm", "sglang", "vllm-gguf-plugin"}
    assert all("site-packages" in row["store"] or "uv" in row["store"] for row in listed["series"])
    assert run_tool(exe, "lint", cwd=elsewhere)["problems"] == []


@pytest.mark.parametrize("kind", ["whl", "tar.gz"])
def test_pip_install_from_the_wheel_and_the_sdist(dist, tmp_path, kind):
    (artifact,) = dist.glob(f"patchctl-*.{kind}")
    bin_dir = fresh_venv(tmp_path / "venv")
    subprocess.run([str(bin_dir / "pip"), "install", "-q", str(artifact)], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "patches").mkdir()  # patch-package's folder in the user's project: never taken for ours
    exercise(bin_dir / "patchctl", elsewhere)


def test_uv_tool_install(dist, tmp_path):
    tools = fresh_venv(tmp_path / "uv-venv")
    if subprocess.run([str(tools / "pip"), "install", "-q", "uv"], capture_output=True).returncode != 0:
        pytest.skip("uv cannot be installed from the package index here")
    from patchctl.sources.fetch import resolve_index

    (wheel,) = dist.glob("patchctl-*.whl")
    env = dict(os.environ, UV_TOOL_DIR=str(tmp_path / "tools"), UV_TOOL_BIN_DIR=str(tmp_path / "bin"),
               UV_INDEX_URL=resolve_index(None).url, UV_CACHE_DIR=str(tmp_path / "uv-cache"))
    proc = subprocess.run([str(tools / "uv"), "tool", "install", str(wheel)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exercise(tmp_path / "bin" / "patchctl", elsewhere)
