"""Smoke environments: one venv per profile (patches/envs/<profile>.txt), created once, cached by
the requirements' hash, reused across engine versions (the engine itself is imported from the
extracted tree, never installed)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from patchctl.core import config
from patchctl.core.errors import EnvironmentProblem, UsageError
from patchctl.smoke import sealed
from patchctl.sources.cache import ArtifactCache

BASE_REQUIREMENTS = ("pytest", "packaging")


def requirements_file(store_root: Path, profile: str) -> Path:
    path = store_root / "envs" / f"{profile}.txt"
    if not path.is_file():
        raise UsageError(f"smoke environment profile {profile!r} has no {path}")
    return path


def _venv(store_root: Path, profile: str) -> Path:
    reqs = requirements_file(store_root, profile)
    digest = hashlib.sha256(reqs.read_bytes() + "\n".join(BASE_REQUIREMENTS).encode()).hexdigest()[:12]
    return ArtifactCache(config.cache_dir()).env(f"{profile}-{digest}")


def _head(reqs: Path) -> str:
    text = reqs.read_text()
    return text if text.endswith("\n") else text + "\n"


def env_ready(store_root: Path, profile: str) -> bool:
    """Whether the profile's venv is built and may be run: sealed, and its seal checks (sealed.py)."""
    venv = _venv(store_root, profile)
    head = _head(requirements_file(store_root, profile))
    return sealed.untrusted(ArtifactCache(config.cache_dir()), venv, head) is None


def ensure_env(store_root: Path, profile: str, log: Callable[[str], None] | None = None) -> str:
    """Path of the profile's python, creating the venv the first time, and again whenever what is
    there is not what was built, or others could have written it (sealed.py; the reason is said)."""
    reqs = requirements_file(store_root, profile)
    venv = _venv(store_root, profile)
    python = venv / "bin" / "python"
    cache = ArtifactCache(config.cache_dir())
    head = _head(reqs)
    if sealed.usable(cache, venv, head, _step):
        return str(python)
    with cache.building(venv):
        if sealed.usable(cache, venv, head, lambda _: None):  # built by another process while this one waited
            return str(python)
        built = _build(reqs, venv, profile, log)
        sealed.require(cache, venv, head)
        return built


def _build(reqs: Path, venv: Path, profile: str, log: Callable[[str], None] | None) -> str:
    python = venv / "bin" / "python"
    # Built in place (venvs are not relocatable); `.complete` is written last, so an interrupted
    # build is simply started again.
    cache = ArtifactCache(config.cache_dir())
    cache.remove(venv)
    cache.make_dirs(venv.parent)
    live = on_terminal()
    if live:
        _step(f"building the smoke environment {profile!r} once (cached in {venv}; later runs reuse it)")
    _run([sys.executable, "-m", "venv", str(venv)], f"create the {profile} venv", log, live=live, step="1/2 creating the venv")
    # On a terminal pip shows its own progress (downloads, builds); elsewhere it is quiet.
    _run(
        [str(python), "-m", "pip", "install", *([] if live else ["-q"]), "-r", str(reqs), *BASE_REQUIREMENTS],
        f"install the {profile} requirements ({reqs})",
        log,
        live=live,
        step=f"2/2 installing {reqs.name} and {', '.join(BASE_REQUIREMENTS)} with pip (a GPU profile is gigabytes)",
    )
    sealed.seal(venv, _head(reqs))  # last: what was built, listed and hashed
    if live:
        _step(f"the smoke environment {profile!r} is ready")
    return str(python)


def on_terminal() -> bool:
    """Whether a person watches stderr: progress is shown only then (systemd's journal, a pipe and CI
    logs get none)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _step(text: str) -> None:
    sys.stderr.write(f"smoke: {text}\n")
    sys.stderr.flush()


def _run(cmd: list[str], what: str, log: Callable[[str], None] | None, *, live: bool = False, step: str | None = None) -> None:
    """cmd, quiet and captured; live (a terminal): its step named and its own output shown on stderr
    as it comes (stdout too, so that --json's stdout stays one document)."""
    if live:
        if step:
            _step(step)
        sys.stderr.flush()
        proc = subprocess.run(cmd, stdout=sys.stderr.fileno(), stderr=sys.stderr.fileno())
        if proc.returncode != 0:
            raise EnvironmentProblem(f"could not {what}: exit code {proc.returncode} (its output is above)")
        return
    captured = subprocess.run(cmd, capture_output=True, text=True)
    if log:
        log(captured.stdout + captured.stderr)
    if captured.returncode != 0:
        raise EnvironmentProblem(f"could not {what}: {(captured.stderr or captured.stdout).strip()[-800:]}")
