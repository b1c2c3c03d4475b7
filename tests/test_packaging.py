"""patchctl installs as a tool: the wheel and the sdist carry the bundled patch set, and `check`,
`list` and `lint` work from a directory outside the checkout — with pip into a fresh venv, and with
`uv tool install` where uv can be installed. Those install for real (the package index gives the
dependencies), so they are in the slow tier. What the wheel holds (the tool, not its test support)
is read from the built file, in the fast tier: the build needs no index (setuptools comes with the
test extras, so it builds without isolation)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # A copy of the checkout without build leftovers, so the test builds what a clone builds.
    src = tmp_path_factory.mktemp("src") / "patchctl"
    shutil.copytree(
        ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", "dist")
    )
    # Without build isolation when this interpreter's setuptools is new enough (faster, no download);
    # else the isolated build fetches its own from the package index.
    flags = ["--no-isolation"] if _setuptools_at_least("68") else []
    proc = subprocess.run([sys.executable, "-m", "build", *flags, "-o", str(out), str(src)], capture_output=True, text=True)
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
    # Nothing of the checkout on the tool's path: PYTHONPATH (set by a contributor, and by
    # tests/conftest.py to the test support) would import patchctl, or its tests, from there.
    env = {k: v for k, v in os.environ.items() if k not in ("PATCHCTL_STORE", "PYTHONPATH")}
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
@pytest.mark.network
@pytest.mark.slow
def test_pip_install_from_the_wheel_and_the_sdist(dist, tmp_path, kind):
    (artifact,) = dist.glob(f"patchctl-*.{kind}")
    bin_dir = fresh_venv(tmp_path / "venv")
    subprocess.run([str(bin_dir / "pip"), "install", "-q", str(artifact)], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "patches").mkdir()  # patch-package's folder in the user's project: never taken for ours
    exercise(bin_dir / "patchctl", elsewhere)


@pytest.mark.network
@pytest.mark.slow
def test_uv_tool_install(dist, tmp_path):
    tools = fresh_venv(tmp_path / "uv-venv")
    if subprocess.run([str(tools / "pip"), "install", "-q", "uv"], capture_output=True).returncode != 0:
        pytest.skip("uv cannot be installed from the package index here")
    from patchctl.sources.fetch import resolve_index

    (wheel,) = dist.glob("patchctl-*.whl")
    env = dict(
        os.environ,
        UV_TOOL_DIR=str(tmp_path / "tools"),
        UV_TOOL_BIN_DIR=str(tmp_path / "bin"),
        UV_INDEX_URL=resolve_index(None).url,
        UV_CACHE_DIR=str(tmp_path / "uv-cache"),
    )
    proc = subprocess.run([str(tools / "uv"), "tool", "install", str(wheel)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exercise(tmp_path / "bin" / "patchctl", elsewhere)


# Test support: the old package folder, the tests and their support folder, pytest's conftest. Under
# patchctl/bundled/ are the patches' own checks (pytest files and conftests): the product, shipped.
TEST_SUPPORT = ("patchctl/testing/", "patchctl/tests/", "patchctl/support/", "tests/", "support/", "conftest.py")
# What a shipped module may not import: the test support, wherever it is put on sys.path.
TEST_MODULES = ("tests", "support", "conftest", "patchctl.testing")
CHECKLIB = "patchctl/bundled/checklib/"


def imported_modules(source: bytes, name: str) -> set[str]:
    """Every module a Python file imports, at any depth (lazy imports inside functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def is_test_module(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return base == "conftest.py" or (base.startswith("test_") and base.endswith(".py"))


def wheel_problems(wheel: Path) -> list[str]:
    """What is wrong with a wheel's contents: test support shipped, a shipped module importing it,
    or a checklib module that a bundled check imports missing from the bundled checklib."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        sources = {n: archive.read(n) for n in names if n.endswith(".py")}
    problems = [
        f"test support in the wheel: {n}"
        for n in names
        if n.startswith(TEST_SUPPORT) or (not n.startswith("patchctl/bundled/") and is_test_module(n))
    ]
    if f"{CHECKLIB}testserver.py" not in names:
        problems.append(f"{CHECKLIB}testserver.py missing: the bundled checks start their servers with it")
    for name, source in sorted(sources.items()):
        for module in sorted(imported_modules(source, name)):
            if module.split(".")[0] in TEST_MODULES or module.startswith(TEST_MODULES):
                problems.append(f"{name} imports {module}, which is test support")
            elif module.split(".")[0] == "checklib":
                path = CHECKLIB + module.removeprefix("checklib").lstrip(".").replace(".", "/")
                if f"{path}.py" not in names and f"{path}/__init__.py".replace("//", "/") not in names:
                    problems.append(f"{name} imports {module}, which the bundled checklib does not have")
    return problems


def test_the_wheel_holds_the_tool_and_the_bundled_checklib_but_no_test_support(dist):
    """Issue 34, item 6: patchctl/testing/ moved to tests/support/, and what the bundled checks need
    (the test server) to patches/checklib/, which the wheel carries as patchctl/bundled/checklib/."""
    (wheel,) = dist.glob("patchctl-*.whl")
    assert wheel_problems(wheel) == []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {
        "patchctl/cli/main.py",
        "patchctl/bundled/vllm/series.yaml",
        f"{CHECKLIB}testserver.py",
        f"{CHECKLIB}sglang/_fake_reasoning_server.py",
    } <= names


def test_wheel_problems_names_test_support_and_a_missing_checklib_module(tmp_path):
    """The check above can fail: a wheel as main built it before item 6 (patchctl/testing/ inside,
    a bundled check importing it, no bundled test server) gives one finding for each."""
    wheel = tmp_path / "patchctl-0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("patchctl/__init__.py", "")
        archive.writestr("patchctl/testing/server.py", "")
        archive.writestr("patchctl/core/test_paths.py", "")
        archive.writestr("patchctl/bundled/vllm/p/checks/conftest.py", "")  # a patch's own checks: shipped
        archive.writestr("patchctl/cli/main.py", "def run():\n    from support.invoke import run_json\n")
        archive.writestr(
            f"{CHECKLIB}sglang/_fake.py", "from patchctl.testing.server import TestServer\nfrom checklib.probe import probe\n"
        )
    assert wheel_problems(wheel) == [
        "test support in the wheel: patchctl/testing/server.py",
        "test support in the wheel: patchctl/core/test_paths.py",
        f"{CHECKLIB}testserver.py missing: the bundled checks start their servers with it",
        f"{CHECKLIB}sglang/_fake.py imports checklib.probe, which the bundled checklib does not have",
        f"{CHECKLIB}sglang/_fake.py imports patchctl.testing.server, which is test support",
        "patchctl/cli/main.py imports support.invoke, which is test support",
    ]
