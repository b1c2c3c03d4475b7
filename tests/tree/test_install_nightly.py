"""`apply ENGINE@nightly --install` installs exactly the build `check` resolves, into a fresh venv, then
patches it, and `status` names that build. vLLM: a local server laid out as its nightly wheel
repository (support.nightly_index), serving the real 0.23.0 files the series touches
repackaged as a dev build; installed with uv (when it can be installed here) and with pip, both with
--no-deps so no index is asked for vLLM's dependencies. SGLang: a local git repository holding the
real 0.5.9 files, built from its pinned commit by setuptools-scm (whose build requirements come from
the package index)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from support.builders import git
from support.invoke import run_json
from support.nightly_index import (
    WHEEL_TAG,
    NightlyIndex,
    build_dev_wheel,
    release_files,
    sglang_layout_repo,
    touched_paths,
)

pytestmark = pytest.mark.network

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "patches"
DEV = "0.23.1.dev12+g1234abcd5"
COMMIT = "1234abcd5"
run = run_json


@pytest.fixture(scope="module")
def vllm_files() -> dict[str, bytes]:
    return release_files("vllm", "0.23.0", touched_paths(STORE, "vllm"))


@pytest.fixture(scope="module")
def release_outcomes() -> dict[str, str]:
    """What apply gives on the real release's files (strict, as apply is)."""
    doc = run("check", "vllm@0.23.0", "--strict", "--store", str(STORE))
    return {p["name"]: p["outcome"] for p in doc["patches"]}


@pytest.fixture
def index(tmp_path, vllm_files):
    with NightlyIndex(tmp_path / "served") as server:
        server.publish("0ld0ld0ld", build_dev_wheel(tmp_path / "old", "0.23.1.dev11+g0ld0ld0ld", vllm_files))
        server.publish(COMMIT, build_dev_wheel(tmp_path / COMMIT, DEV, vllm_files))
        yield server


@pytest.fixture(scope="session")
def uv_bin(tmp_path_factory) -> Path:
    """A directory holding uv, installed from the package index into a venv of its own."""
    on_path = shutil.which("uv")
    if on_path:
        return Path(on_path).parent
    tools = tmp_path_factory.mktemp("uv") / "venv"
    venv.EnvBuilder(with_pip=True).create(tools)
    proc = subprocess.run([str(tools / "bin" / "pip"), "install", "-q", "uv"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"uv cannot be installed from the package index here: {proc.stderr[-300:]}")
    return tools / "bin"


def path_without_uv() -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "uv").exists())


@pytest.fixture
def use_uv(uv_bin, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", os.pathsep.join([str(uv_bin), path_without_uv()]))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


@pytest.fixture
def use_pip(monkeypatch):
    monkeypatch.setenv("PATH", path_without_uv())
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


def fresh_venv(path: Path, *, with_pip: bool) -> str:
    venv.EnvBuilder(with_pip=with_pip, clear=True).create(path)
    return str(path / "bin" / "python")


def installed_file(python: str, rel: str) -> str:
    return subprocess.run(
        [
            python,
            "-c",
            "import sys, sysconfig, pathlib; print((pathlib.Path(sysconfig.get_paths()['purelib']) / sys.argv[1]).read_text())",
            rel,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def dist_info(python: str, dist: str) -> tuple[str, dict | None]:
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m, json, sys; d = m.distribution(sys.argv[1]); "
            "print(json.dumps([d.version, d.read_text('direct_url.json')]))",
            dist,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    version, direct = json.loads(out)
    return version, json.loads(direct) if direct else None


def apply_and_status(index: NightlyIndex, python: str, release_outcomes: dict[str, str], installer: str) -> dict:
    doc = run(
        "apply",
        "vllm@nightly",
        "--install",
        "--no-deps",
        "--python",
        python,
        "--nightly-source",
        index.url,
        "--store",
        str(STORE),
        expect=0,
    )
    assert {p["name"]: p["outcome"] for p in doc["patches"]} == release_outcomes
    assert doc["written"], "the series writes files at 0.23.0, so it must at the dev build of the same files"
    build = doc["build"]
    wheel = f"/{COMMIT}/vllm-0.23.1.dev12%2Bg1234abcd5-{WHEEL_TAG}.whl"
    assert (build["kind"], build["version"], build["commit"], build["installer"]) == ("wheel", DEV, COMMIT, installer)
    assert build["url"] == index.root + wheel and build["index_url"] == index.url and build["spec"] == "vllm@nightly"
    # The installer fetched that very wheel by its URL (never an index page: it was given no index).
    assert any(path == wheel for path, _ in index.requests)
    assert not any(path.startswith("/0ld0ld0ld/") for path, _ in index.requests)
    version, direct = dist_info(python, "vllm")
    assert version == DEV and direct is not None and direct["url"] == index.root + wheel  # PEP 610, by the installer
    patched = next(p for p in doc["written"] if p.endswith(".py"))
    assert installed_file(python, patched) != release_files("vllm", "0.23.0", [patched])[patched].decode()

    status = run("status", "vllm", "--python", python, expect=0)
    assert status["state"] == "intact" and status["applied_version"] == DEV
    assert status["build"]["version"] == DEV and status["build"]["commit"] == COMMIT
    assert status["build"]["url"] == index.root + wheel and status["build"]["installer"] == installer
    assert status["installed_build"]["version"] == DEV and status["installed_build"]["url"] == index.root + wheel
    text = subprocess.run(
        [sys.executable, "-m", "patchctl.cli.main", "status", "vllm", "--python", python], capture_output=True, text=True
    )
    sha = f", sha256 {build['sha256']}" if build["sha256"] else ""
    assert (
        f"patched build: vllm {DEV} (commit {COMMIT}) from {index.root}{wheel}{sha}, installed with {installer}" in text.stdout
    ), text.stdout + text.stderr
    return doc


@pytest.mark.slow
def test_install_the_nightly_with_uv_into_a_fresh_venv(index, tmp_path, use_uv, release_outcomes):
    python = fresh_venv(tmp_path / "venv", with_pip=False)  # uv needs no pip in the target
    # A server that ignores Range: `check` downloads the whole wheel, so its sha256 is known, and the
    # record keeps it beside the URL (the index publishes none).
    index.honour_range = False
    check = run("check", "vllm@nightly", "--nightly-source", index.url, "--store", str(STORE), expect=0)
    doc = apply_and_status(index, python, release_outcomes, "uv")
    wheel = next(w for w in index.builds[COMMIT])
    assert doc["build"]["sha256"] == check["source"]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert doc["build"]["record_sha256"] == check["source"]["record_sha256"] is not None
    assert run("status", "vllm", "--python", python, expect=0)["build"]["sha256"] == doc["build"]["sha256"]


@pytest.mark.slow
def test_install_the_nightly_with_pip_into_a_fresh_venv(index, tmp_path, use_pip, release_outcomes):
    python = fresh_venv(tmp_path / "venv", with_pip=True)
    doc = apply_and_status(index, python, release_outcomes, "pip")
    assert doc["build"]["sha256"] is None  # nothing fetched whole, and the index publishes no hash
    # A newer nightly appears: --install moves to it (and not to whatever else the index lists).
    newer = "0.23.1.dev13+gfeedbeef0"
    index.publish(
        "feedbeef0", build_dev_wheel(tmp_path / "newer", newer, release_files("vllm", "0.23.0", touched_paths(STORE, "vllm")))
    )
    doc = run(
        "apply",
        "vllm@nightly",
        "--install",
        "--no-deps",
        "--python",
        python,
        "--nightly-source",
        index.url,
        "--store",
        str(STORE),
        expect=0,
    )
    assert doc["build"]["version"] == newer and doc["build"]["commit"] == "feedbeef0"
    assert doc["state_before"] == "version-changed"
    status = run("status", "vllm", "--python", python, expect=0)
    assert status["build"]["commit"] == "feedbeef0" and status["state"] == "intact"
    # ... and vllm@commit:SHA installs that older commit's build exactly.
    doc = run(
        "apply",
        f"vllm@commit:{COMMIT}",
        "--install",
        "--no-deps",
        "--python",
        python,
        "--nightly-source",
        index.url,
        "--store",
        str(STORE),
        expect=0,
    )
    assert doc["build"]["version"] == DEV and doc["build"]["index_url"] == f"{index.root}/{COMMIT}"
    assert dist_info(python, "vllm")[0] == DEV
    assert run("status", "vllm", "--python", python, expect=0)["build"]["spec"] == f"vllm@commit:{COMMIT}"


def test_the_installed_version_must_be_the_resolved_one(index, tmp_path, monkeypatch):
    """The plan names the wheel by its URL; the check after the installer refuses a dist-info naming
    another version (exit 3, nothing patched) and accepts the same commit under a longer sha. (Real
    installers refuse a wheel whose name and METADATA disagree, so the installed tree here is one a
    different installer run left: a dist-info as pip writes it.)"""
    from packaging.version import Version
    from support.builders import install_fake_dist

    from patchctl.core.engines import get_engine
    from patchctl.core.errors import EnvironmentProblem
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.spec import parse_spec
    from patchctl.tree.find import check_installed, plan_install

    plan = plan_install(parse_spec("vllm@nightly"), sys.executable, SourceContext(nightly_source=index.url))
    assert plan.requirement == f"vllm @ {index.root}/{COMMIT}/vllm-0.23.1.dev12%2Bg1234abcd5-{WHEEL_TAG}.whl"
    assert plan.version == Version(DEV) and plan.build.artifact == f"vllm-{DEV}-{WHEEL_TAG}.whl"
    site = tmp_path / "site"
    monkeypatch.setenv("PYTHONPATH", str(site))
    install_fake_dist(site, "vllm", "0.23.1.dev13+gfeedbeef0", {"vllm/envs.py": "x = 1\n"})
    with pytest.raises(
        EnvironmentProblem,
        match=r"vllm 0\.23\.1\.dev13\+gfeedbeef0 is installed in .*, not the "
        r"resolved build 0\.23\.1\.dev12\+g1234abcd5 .*nothing was patched",
    ):
        check_installed(plan, get_engine("vllm"), sys.executable)
    (site / "vllm-0.23.1.dev13+gfeedbeef0.dist-info").rename(site / "gone")
    install_fake_dist(site, "vllm", "0.23.1.dev12+g1234abcd5f", {"vllm/envs.py": "x = 1\n"})  # one more sha digit
    assert check_installed(plan, get_engine("vllm"), sys.executable).version == Version("0.23.1.dev12+g1234abcd5f")


def test_an_unreachable_nightly_installs_nothing(tmp_path, use_pip):
    python = fresh_venv(tmp_path / "venv", with_pip=False)
    doc = run(
        "apply",
        "vllm@nightly",
        "--install",
        "--python",
        python,
        "--nightly-source",
        "http://127.0.0.1:9/nightly",
        "--store",
        str(STORE),
        expect=3,
    )
    assert "nightly source for vllm (http://127.0.0.1:9/nightly) is unreachable" in doc["error"]["message"]
    assert (
        run("apply", "vllm", "--no-deps", "--python", python, "--store", str(STORE), expect=2)["error"]["message"]
        == "--no-deps only means something with --install"
    )


# SGLang: main built from its pinned commit ------------------------------------------------------

PYPROJECT = """\
[build-system]
requires = ["setuptools>=64", "setuptools-scm>=8"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
dynamic = ["version"]

[tool.setuptools.packages.find]
include = ["sglang*"]

[tool.setuptools_scm]
root = ".."
"""


@pytest.fixture(scope="module")
def sglang_repo(tmp_path_factory) -> tuple[Path, str]:
    """SGLang's layout (the package under python/, version.py holding setuptools-scm's fallback, the
    version from v* tags), with the real 0.5.9 files the series touches; two commits after v0.5.9."""
    files = release_files("sglang", "0.5.9", touched_paths(STORE, "sglang"))
    files["pyproject.toml"] = PYPROJECT.encode()
    repo = sglang_layout_repo(tmp_path_factory.mktemp("sglang") / "repo", files, tag="v0.5.9")
    return repo, git(repo, "rev-parse", "HEAD").strip()


@pytest.mark.slow
@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_install_sglang_main_from_its_pinned_commit(sglang_repo, tmp_path, request, installer):
    repo, head = sglang_repo
    request.getfixturevalue(f"use_{installer}")
    python = fresh_venv(tmp_path / "venv", with_pip=installer == "pip")
    expected = f"0.5.10.dev2+g{head[:9]}"  # setuptools-scm: 9 hex digits of the node
    check = run("check", "sglang@git:main", "--strict", "--repo", str(repo), "--store", str(STORE), expect=0)
    assert check["version"] == expected
    # The installer gets the commit patchctl resolved main to (git+URL@SHA), never the branch name.
    doc = run(
        "apply",
        "sglang@git:main",
        "--install",
        "--no-deps",
        "--repo",
        str(repo),
        "--python",
        python,
        "--store",
        str(STORE),
        expect=0,
    )
    build = doc["build"]
    assert (build["kind"], build["version"], build["commit"], build["installer"]) == ("git", expected, head, installer)
    assert build["url"] == f"git+file://localhost{repo.resolve()}@{head}"
    version, direct = dist_info(python, "sglang")
    assert version == expected  # what setuptools-scm built from the pinned commit is what patchctl computed
    assert direct is not None and direct["vcs_info"]["commit_id"] == head
    assert {p["name"]: p["outcome"] for p in doc["patches"]} == {p["name"]: p["outcome"] for p in check["patches"]}
    assert doc["written"]
    status = run("status", "sglang", "--python", python, expect=0)
    assert status["build"]["commit"] == head and status["build"]["version"] == expected


def test_sglang_install_argv_pins_the_commit(sglang_repo, tmp_path, use_pip):
    """The requirement --install hands the installer for a git build: the resolved commit, SGLang's
    python/ subdirectory, a local repository as a file:// URL."""
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.spec import parse_spec
    from patchctl.tree.find import plan_install

    repo, head = sglang_repo
    plan = plan_install(parse_spec("sglang@git:v0.5.9"), sys.executable, SourceContext(repo=str(repo)))
    tagged = git(repo, "rev-list", "-n1", "v0.5.9").strip()
    assert plan.requirement == f"sglang @ git+file://localhost{repo.resolve()}@{tagged}#subdirectory=python"
    assert str(plan.version) == "0.5.9" and plan.build.commit == tagged != head


def test_the_wheel_for_the_targets_machine(tmp_path, vllm_files):
    """vLLM publishes one wheel per machine for each build: --install takes the target interpreter's."""
    import platform

    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.spec import parse_spec
    from patchctl.tree.find import plan_install

    machine = platform.machine()
    other = "aarch64" if machine != "aarch64" else "x86_64"
    with NightlyIndex(tmp_path / "served") as server:
        for arch in (other, machine):
            server.publish(COMMIT, build_dev_wheel(tmp_path / arch, DEV, vllm_files, tag=f"cp38-abi3-manylinux_2_31_{arch}"))
        plan = plan_install(parse_spec("vllm@nightly"), sys.executable, SourceContext(nightly_source=server.url))
    assert plan.build.artifact == f"vllm-{DEV}-cp38-abi3-manylinux_2_31_{machine}.whl"
    doc = run("apply", "vllm@nightly", "--install", "--target", str(tmp_path), "--store", str(STORE), expect=2)
    assert doc["error"]["message"] == "--install installs into a Python environment, not into --target DIR"
