"""An engine installed in some Python environment, found through distribution metadata only:
importing vLLM takes >10 s and wants CUDA libraries, so the engine itself is never imported."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from patchctl.core.engines import Engine
from patchctl.core.errors import EnvironmentProblem


class Installed(NamedTuple):
    engine: Engine
    version: Version
    root: Path  # the import root (site-packages, or the source dir of an editable install)
    python: str


def default_python() -> str:
    venv = os.environ.get("VIRTUAL_ENV")
    if venv and Path(venv, "bin", "python").exists():
        return str(Path(venv, "bin", "python"))
    return shutil.which("python3") or shutil.which("python") or sys.executable


def find_installed(engine: Engine, python: str | None = None) -> Installed | None:
    """The engine in python's environment, read from its files (pyenv.py): its interpreter is not run,
    so nothing its owner put there (a `.pth`, sitecustomize) runs as the user of patchctl."""
    from packaging.version import InvalidVersion

    from patchctl.core import pyenv

    env = pyenv.read_env(python or default_python())
    dist = pyenv.find_dist(env, engine.dist)
    if dist is None:
        return None
    try:
        version = Version(dist.version)
    except InvalidVersion:
        raise EnvironmentProblem(
            f"{engine.dist} in {dist.folder} has the version {dist.version[:100]!r}, which is not a version"
        ) from None
    root = pyenv.package_root(env, engine.version_package) or dist.folder
    return Installed(engine, version, root, env.python)


def require_installed(engine: Engine, python: str | None = None) -> Installed:
    found = find_installed(engine, python)
    if found is None:
        raise EnvironmentProblem(
            f"{engine.dist} is not installed in the environment of {python or default_python()}",
            hint="activate the right environment, or pass --python PATH or --target DIR (`apply --install` installs "
            "a release first)",
        )
    return found


def version_of_tree(engine: Engine, root: Path, read: Callable[[Path], bytes | None] | None = None) -> Version | None:
    """The version of an unpacked tree or checkout, from the metadata that lies in it. read: how a
    file of it is read (None: missing); a tree patchctl writes into passes the no-follow reader."""
    import email

    if read is None:
        from patchctl.core.nofollow import read_beneath

        def read(path: Path) -> bytes | None:
            return read_beneath(root, str(path.relative_to(root)))

    candidates = list(root.glob("*.dist-info/METADATA")) + list(root.glob("PKG-INFO")) + list(root.glob("*.egg-info/PKG-INFO"))
    for meta in candidates:
        raw = read(meta)
        if raw is None:
            continue
        message = email.message_from_string(raw.decode(errors="replace"))
        name = (message.get("Name") or "").replace("_", "-").lower()
        if name == engine.dist and message.get("Version"):
            return Version(message["Version"])
    for rel in engine.version_paths():
        data = read(root / rel)
        if data is not None:
            import re

            m = re.search(r"""(?:__version__|version)\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", data.decode(errors="replace"))
            if m:
                try:
                    return Version(m.group(1))
                except Exception:
                    pass
    return None
