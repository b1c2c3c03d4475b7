"""pip's unstable internals, behind one module (as pip-tools does): the index the user configured
for pip, and pip's own default when nothing is configured. patchctl never names an index host."""

from __future__ import annotations

import json
import os
import sys

_KEYS = ("install.index-url", "download.index-url", "global.index-url")


def configured_index_url() -> tuple[str, str]:
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"], "PIP_INDEX_URL"
    try:
        found = _from_pip_files()
        if found is not None:
            return found
    except Exception:  # a file configparser refuses: let pip say what it makes of it
        pass
    try:
        return _from_pip_in_process()
    except Exception:  # pip missing or its internals moved: ask a pip process instead
        return _from_pip_subprocess()


def _from_pip_files() -> tuple[str, str] | None:
    """pip's configuration files read as pip reads them on Linux (its documented locations and order:
    global, user, site, then $PIP_CONFIG_FILE, each later file overriding), without importing
    pip._internal.configuration, which costs ~0.3 s of every command's start. None elsewhere (macOS,
    Windows: pip's own code decides there)."""
    values = _file_values()
    if values is None:
        return None
    for key in _KEYS:
        if key in values:
            return values[key], f"pip config {key}"
    from pip._internal.models.index import PyPI  # the constant alone: ~10 ms

    return PyPI.simple_url, "pip's default index"


_settings: dict[str, str | None] = {}


def network_setting(name: str) -> str | None:
    """pip's `cert` or `proxy` as pip would use it for the index ($PIP_CERT, $PIP_PROXY, else its
    configuration files' install., download. or global. key), so that patchctl reaches the index
    through the proxy and with the trust store pip does; None when pip has none. Read once a process."""
    if name not in _settings:
        found = os.environ.get(f"PIP_{name.upper()}") or None
        if found is None:
            try:
                values = _file_values() or {}
            except Exception:  # a file configparser refuses: pip's own reading is not worth its cost here
                values = {}
            found = next((values[k] for k in (f"install.{name}", f"download.{name}", f"global.{name}") if values.get(k)), None)
        _settings[name] = found
    return _settings[name]


def _file_values() -> dict[str, str] | None:
    """Every "section.key" of pip's configuration files (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import configparser
    import locale

    env_file = os.environ.get("PIP_CONFIG_FILE")
    if env_file == os.devnull:
        files: list[str] = []
    else:
        xdg_dirs = os.environ.get("XDG_CONFIG_DIRS", "").strip() or "/etc/xdg"
        files = [os.path.join(os.path.expanduser(d.rstrip(os.sep)), "pip", "pip.conf") for d in xdg_dirs.split(os.pathsep)] + [
            "/etc/pip.conf"
        ]
        if not (env_file and os.path.exists(env_file)):
            xdg_home = os.environ.get("XDG_CONFIG_HOME", "").strip() or os.path.expanduser("~/.config")
            files += [os.path.expanduser("~/.pip/pip.conf"), os.path.join(xdg_home, "pip", "pip.conf")]
        files.append(os.path.join(sys.prefix, "pip.conf"))
        if env_file:
            files.append(env_file)
    values: dict[str, str] = {}
    for name in files:
        if not os.path.exists(name):
            continue
        parser = configparser.RawConfigParser()
        parser.read(name, encoding=locale.getpreferredencoding(False))
        for section in parser.sections():
            for key, value in parser.items(section):
                key = key.lower().replace("_", "-")
                values[f"{section}.{key[2:] if key.startswith('--') else key}"] = value
    return values


def _from_pip_in_process() -> tuple[str, str]:
    from pip._internal.configuration import Configuration
    from pip._internal.models.index import PyPI

    configuration = Configuration(isolated=False)
    configuration.load()
    for key in _KEYS:
        try:
            return str(configuration.get_value(key)), f"pip config {key}"
        except Exception:
            continue
    return PyPI.simple_url, "pip's default index"


_SCRIPT = """
import json
from pip._internal.configuration import Configuration
from pip._internal.models.index import PyPI
c = Configuration(isolated=False); c.load()
for key in ("install.index-url", "download.index-url", "global.index-url"):
    try:
        print(json.dumps([str(c.get_value(key)), "pip config " + key])); break
    except Exception:
        pass
else:
    print(json.dumps([PyPI.simple_url, "pip's default index"]))
"""


def _from_pip_subprocess() -> tuple[str, str]:
    from patchctl.core.errors import EnvironmentProblem
    from patchctl.core.interpreter import run_bounded

    # patchctl's own interpreter, then the user's python3 (never a target's): bounded all the same.
    for python in (sys.executable, "python3"):
        try:
            out = run_bounded([python, "-c", _SCRIPT], timeout=60, what=f"pip's configuration in {python}")
        except EnvironmentProblem:
            continue
        lines = out.stdout.decode(errors="replace").strip().splitlines()
        try:
            url, origin = json.loads(lines[-1]) if out.returncode == 0 and lines else (None, None)
        except (ValueError, TypeError):
            continue
        if isinstance(url, str) and isinstance(origin, str):
            return url, origin

    raise EnvironmentProblem(
        "cannot tell which package index to use: pip is not available",
        hint="pass --index-url or set PIP_INDEX_URL",
    )
