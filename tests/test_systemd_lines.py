"""The unit's command lines as systemd runs them (docs/systemd.md), against a
real SGLang release pip installed into a venv, with patchctl pip installed into a venv of its own:

- `ExecStartPre=patchctl ensure --deployment FILE --wait 60` in a clean environment (`env -i`, no
  HOME, a bare PATH): the first start applies, the next ones write nothing;
- another user (`runuser -u nobody`), who cannot write the tree: an intact tree still starts;
- the tree read-only as `ProtectSystem=strict` makes it (a real read-only bind mount);
- an upgrade between two starts (`pip install --force-reinstall` of another release): the second
  start re-applies.

Everything lives under one world-readable folder in /tmp (pytest's own is root's alone), with the
system Python's venvs (pyenv's lives in /root, which `nobody` cannot enter). Builds and installs
for real, so it is in the slow tier."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RELEASES = ("0.5.9", "0.5.10")  # both take the bundled SGLang series
PATH = "/usr/bin:/bin"
pytestmark = [
    pytest.mark.network,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs as root, as systemd runs ExecStartPre="),
]


class Deployment:
    def __init__(self, base: Path):
        self.base = base
        self.tool = base / "tool" / "bin" / "patchctl"
        self.engine = base / "engine"
        self.python = self.engine / "bin" / "python"
        self.file = base / "etc" / "patchctl" / "glm5.yaml"

    @property
    def site(self) -> Path:
        (site,) = (self.engine / "lib").glob("python3*/site-packages")
        return site

    def ensure(self, *, user: str | None = None) -> tuple[int, dict, str]:
        """ExecStartPre='s line under env -i: no HOME, no PATCHCTL_*, PATH as systemd sets it."""
        line = ["env", "-i", f"PATH={PATH}", str(self.tool), "ensure", "--deployment", str(self.file), "--wait", "60", "--json"]
        if user:
            line = ["runuser", "-u", user, "--", *line]
        proc = subprocess.run(line, capture_output=True, text=True, timeout=300, cwd="/")
        return proc.returncode, json.loads(proc.stdout), proc.stderr

    def reinstall(self, version: str) -> None:
        pip(self.engine, "install", "-q", "--no-deps", "--force-reinstall", f"sglang=={version}")

    def version(self) -> str:
        return subprocess.run(
            [str(self.python), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()


def pip(venv: Path, *args: str) -> None:
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployment]:
    system_python = shutil.which("python3", path=PATH)
    if system_python is None:
        pytest.skip(f"no python3 on {PATH} to make venvs another user can run")
    base = Path(tempfile.mkdtemp(prefix="patchctl-systemd-", dir="/tmp"))
    try:
        base.chmod(0o755)
        d = Deployment(base)
        src = base / "src"
        shutil.copytree(
            ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", "dist")
        )
        for venv in ("tool", "engine"):
            subprocess.run([system_python, "-m", "venv", str(base / venv)], check=True)
        pip(base / "tool", "install", "-q", str(src))  # patchctl as a user installs it, with its dependencies
        pip(d.engine, "install", "-q", "--no-deps", f"sglang=={RELEASES[0]}")
        d.file.parent.mkdir(parents=True)
        # docs/systemd.md's file, with the interpreter relative to the file (resolved against its folder).
        d.file.write_text("engine: sglang\npython: ../../engine/bin/python\nwait: 60\n")
        d.file.chmod(0o644)  # whatever the umask: a deployment file its group may write is refused
        subprocess.run(["chmod", "-R", "a+rX", str(base)], check=True)
        yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def started(deployed: Deployment) -> Deployment:
    """The tree at the first release, patched by a first start."""
    if deployed.version() != RELEASES[0]:
        deployed.reinstall(RELEASES[0])
    code, doc, err = deployed.ensure()
    assert code == 0, (doc, err)
    return deployed


def test_a_clean_environment_applies_then_writes_nothing(deployed):
    code, first, err = deployed.ensure()
    assert code == 0, (first, err)
    assert first["deployment"] == str(deployed.file)
    assert first["version"] == RELEASES[0] and first["target"] == str(deployed.site)
    assert len(first["patches"]) >= 1 and all(p["outcome"] != "conflict" for p in first["patches"])
    code, again, err = deployed.ensure()
    assert code == 0 and again["written"] == [] and again["note"] == "patches intact: nothing to do", (again, err)


def test_without_home_patchctl_names_its_dirs_from_the_password_database(deployed):
    """No HOME (env -i): platformdirs' ~ is the user's passwd home, so the dirs are still defined (and
    ensure on an intact tree reads none of them); a unit sets PATCHCTL_CACHE_DIR / PATCHCTL_DATA_DIR."""
    probe = "from patchctl.core import config; print(config.cache_dir()); print(config.data_dir())"
    python = deployed.tool.parent / "python"
    out = subprocess.run(
        ["env", "-i", f"PATH={PATH}", str(python), "-c", probe], capture_output=True, text=True, check=True, cwd="/"
    ).stdout.split()
    import pwd

    home = pwd.getpwuid(os.geteuid()).pw_dir
    assert out == [f"{home}/.cache/patchctl", f"{home}/.local/share/patchctl"]
    env = ["env", "-i", f"PATH={PATH}", "PATCHCTL_CACHE_DIR=/var/cache/patchctl", "PATCHCTL_DATA_DIR=/var/lib/patchctl"]
    out = subprocess.run([*env, str(python), "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["/var/cache/patchctl", "/var/lib/patchctl"]


@pytest.mark.skipif(shutil.which("runuser") is None, reason="runuser (util-linux) is not installed")
def test_another_user_starts_an_intact_tree(started):
    before = snapshot(started.site)
    code, doc, err = started.ensure(user="nobody")
    assert snapshot(started.site) == before
    assert code == 0, (doc, err)
    assert doc["written"] == []


@contextlib.contextmanager
def mounted_read_only(site: Path) -> Iterator[None]:
    """`site` read-only, as ProtectSystem=strict mounts it: a real bind mount, undone on the way out."""
    made = subprocess.run(["mount", "--bind", str(site), str(site)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {made.stderr.strip()}")
    try:
        ro = subprocess.run(["mount", "-o", "remount,ro,bind", str(site), str(site)], capture_output=True, text=True)
        if ro.returncode != 0:
            pytest.skip(f"cannot remount read-only here: {ro.stderr.strip()}")
        with pytest.raises(OSError):
            (site / ".patchctl-write-probe").write_text("x")
        yield
    finally:
        subprocess.run(["umount", str(site)], check=True)


@pytest.fixture
def read_only(started: Deployment) -> Iterator[Deployment]:
    with mounted_read_only(started.site):
        yield started


def test_a_read_only_tree_starts_when_intact(read_only):
    code, doc, err = read_only.ensure()
    assert code == 0, (doc, err)
    assert doc["written"] == []


def test_an_upgrade_between_two_starts_re_applies(started):
    other = RELEASES[1]
    started.reinstall(other)
    assert started.version() == other
    code, doc, err = started.ensure()
    assert code == 0, (doc, err)
    assert doc["version"] == other and doc["state_before"] in ("wiped", "version-changed")
    assert doc["written"] and "re-applied" in doc["note"]
    code, again, err = started.ensure()
    assert code == 0 and again["written"] == [] and again["version"] == other, (again, err)


def test_an_upgrade_on_a_read_only_tree_keeps_the_server_down(started):
    """Work to do and nothing may be written: exit 3 with the cause, the tree untouched."""
    started.reinstall(RELEASES[1])
    before = snapshot(started.site)
    with mounted_read_only(started.site):
        code, doc, err = started.ensure()
    assert code == 3, (doc, err)
    assert doc["error"]["kind"] == "environment" and "read-only" in doc["error"]["message"].lower()
    assert snapshot(started.site) == before


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file of the engine's package and patchctl's bookkeeping, by content."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for folder in (root / "sglang", root / ".patchctl")
        if folder.is_dir()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
