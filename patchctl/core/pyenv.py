"""What a Python environment holds, read from its files, without running its interpreter: `ensure`
runs as root on a venv a service user owns, and running that venv's interpreter would run whatever
`.pth` its owner put in site-packages (and its pyvenv.cfg chooses the standard library) as root.

The layout is the one CPython's `site` builds: a venv is the folder holding `pyvenv.cfg` next to or
above the interpreter (the path as given, not the file its link leads to, as CPython looks), its
site-packages `<prefix>/lib{,64}/pythonX.Y[t]/site-packages`, X.Y from pyvenv.cfg's `version` /
`version_info` (uv writes the latter), else from the one `lib/pythonX.Y` folder; with
`include-system-site-packages = true` the base's folders (pyvenv.cfg `home`) follow. An interpreter
outside a venv: `<prefix>/bin/pythonX.Y`, the same layout, plus Debian's dist-packages and the running
user's site. `.pth` files are read, never executed: their path lines extend the search as `site` does,
and setuptools' editable finders are read for their MAPPING. Only where none of this fits is the
interpreter run, isolated (`-I -S -E`, no `.pth` runs) and only when it belongs to root or to the
running user and is not a venv's (interpreter.trusted_to_run)."""

from __future__ import annotations

import ast
import email.parser
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from patchctl.core.errors import EnvironmentProblem
from patchctl.core.nofollow import read_beneath

CFG_LIMIT = 64 << 10  # pyvenv.cfg: a few lines
PTH_LIMIT = 1 << 20  # a .pth file: a path or an import line
META_LIMIT = 16 << 20  # a METADATA or PKG-INFO (vLLM's ~20 KB; the long description is its bulk)
FINDER_LIMIT = 4 << 20  # an editable finder module (setuptools writes a few KB)
MAX_ENTRIES = 100_000  # names looked at in one folder of sys.path (a venv's site-packages: a few thousand)


class PyEnv(NamedTuple):
    python: str  # the interpreter as named (absolute, links not resolved)
    paths: tuple[Path, ...]  # what its sys.path would hold, in order (site folders and their .pth paths)
    editable: dict[str, Path]  # top-level package -> folder, from setuptools' editable finders


def read_env(python: str) -> PyEnv:
    """The environment of `python`: read from its files; run isolated only for an unknown layout of a
    trusted interpreter; else exit 3 saying why."""
    named = _locate(python)
    sites = _venv_sites(named)
    if sites is None:
        sites = _plain_sites(named)
    if sites is None:
        sites = _sites_by_running(named)
    extra = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return _expand(named, extra, sites)


def _locate(python: str) -> str:
    import shutil

    found = python if os.sep in python else shutil.which(python)
    if not found or not os.path.exists(found):
        raise EnvironmentProblem(f"no Python interpreter at {python}", hint="pass --python PATH of an existing one")
    return os.path.abspath(found)


def _read_small(path: Path, limit: int) -> bytes | None:
    """A regular file by its folder, its own name not followed; None when missing or a folder."""
    return read_beneath(path.parent, path.name, limit)


def _version_of(folder: Path) -> str | None:
    """X.Y from the one lib/pythonX.Y[t] folder there is under a prefix, else None."""
    try:
        found = {m.group(1) for name in os.listdir(folder / "lib") if (m := re.fullmatch(r"python(3\.\d+)t?", name))}
    except OSError:
        return None
    return found.pop() if len(found) == 1 else None


def _site_dirs(prefix: Path, version: str, *, system: bool) -> list[Path]:
    """The site folders `site.getsitepackages` lists for a prefix that exist; system: also Debian's."""
    found = []
    for flavour in (version, version + "t"):
        for lib in ("lib", "lib64"):
            found.append(prefix / lib / f"python{flavour}" / "site-packages")
    if system:
        found = (
            ([Path("/usr/local/lib") / f"python{version}" / "dist-packages"] if prefix == Path("/usr") else [])
            + found
            + [prefix / "lib" / "python3" / "dist-packages", prefix / "lib" / f"python{version}" / "dist-packages"]
        )
    seen: list[Path] = []
    for path in found:
        # lib64 is usually a link to lib: the same folder once.
        if path.is_dir() and not any(os.path.samefile(path, s) for s in seen):
            seen.append(path)
    return seen


def _user_site(version: str) -> list[Path]:
    if os.environ.get("PYTHONNOUSERSITE"):
        return []
    user = Path(os.path.expanduser("~")) / ".local" / "lib" / f"python{version}" / "site-packages"
    return [user] if user.is_dir() else []


def _venv_sites(python: str) -> list[Path] | None:
    here = Path(python).parent
    for prefix in (here, here.parent):
        raw = _read_small(prefix / "pyvenv.cfg", CFG_LIMIT)
        if raw is not None:
            break
    else:
        return None
    cfg = {}
    for line in raw.decode(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip().lower()] = value.strip()
    match = re.match(r"(3\.\d+)", cfg.get("version_info") or cfg.get("version") or "")
    version = match.group(1) if match else _version_of(prefix)
    if version is None:
        raise EnvironmentProblem(
            f"cannot tell the Python version of {python}: its virtual environment's "
            f"{prefix / 'pyvenv.cfg'} names none and {prefix} has no single lib/pythonX.Y folder",
            hint="patchctl reads a venv's files and does not run its interpreter",
        )
    sites = _site_dirs(prefix, version, system=False)
    if cfg.get("include-system-site-packages", "").lower() == "true" and cfg.get("home"):
        home = Path(cfg["home"])
        base = home.parent if home.name == "bin" else home
        sites += _user_site(version) + _site_dirs(base, version, system=True)
    return sites


def _plain_sites(python: str) -> list[Path] | None:
    """An interpreter outside a venv at <prefix>/bin/: its X.Y from its name (or the name its link
    leads to), else from the prefix's one lib/pythonX.Y."""
    path = Path(python)
    if path.parent.name != "bin":
        return None
    prefix = path.parent.parent
    version = None
    for name in (path.name, Path(os.path.realpath(path)).name):
        if m := re.fullmatch(r"python(3\.\d+)t?", name):
            version = m.group(1)
            break
    version = version or _version_of(prefix)
    if version is None or not (prefix / "lib" / f"python{version}").is_dir():
        return None
    return _user_site(version) + _site_dirs(prefix, version, system=True)


_SITES = (
    "import json, site, sys; print(json.dumps([getattr(site, 'getusersitepackages', lambda: '')(), *site.getsitepackages()]))"
)


def _sites_by_running(python: str) -> list[Path]:
    from patchctl.core.interpreter import probe, trusted_to_run

    why = trusted_to_run(python)
    if why is not None:
        raise EnvironmentProblem(
            f"cannot read the environment of {python} from its files, and patchctl does not run it: {why}",
            hint="pass --python the interpreter of a venv (bin/python beside pyvenv.cfg), or --target the site-packages folder",
        )
    listed = probe(python, _SITES, timeout=10)  # isolated, it answers in ~20 ms
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise EnvironmentProblem(f"{python} gave no list of site folders: {str(listed)[:200]!r}")
    users = [] if os.environ.get("PYTHONNOUSERSITE") else [Path(p) for p in listed[:1] if p]
    return [p for p in users + [Path(p) for p in listed[1:]] if p.is_dir()]


def _expand(python: str, extra: list[Path], sites: list[Path]) -> PyEnv:
    """sys.path as `site` would build it: PYTHONPATH first, then each site folder followed by the
    folders its .pth files name (sorted by name, as `site` reads them)."""
    paths: list[Path] = list(extra)
    editable: dict[str, Path] = {}
    for site in sites:
        if site in paths:
            continue
        paths.append(site)
        for name in sorted(n for n in _names(site) if n.endswith(".pth")):
            raw = _read_small(site / name, PTH_LIMIT)
            for line in (raw or b"").decode(errors="replace").splitlines():
                line = line.rstrip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith(("import ", "import\t")):
                    for module in re.findall(r"\b(__editable__[\w.]*_finder)\b", line):
                        editable.update(_finder_mapping(site / f"{module}.py"))
                    continue
                folder = site / line
                if folder.is_dir() and folder not in paths:
                    paths.append(folder)
    return PyEnv(python, tuple(paths), editable)


def _names(folder: Path) -> Iterator[str]:
    try:
        with os.scandir(folder) as it:
            for n, entry in enumerate(it):
                if n >= MAX_ENTRIES:
                    raise EnvironmentProblem(f"{folder} holds more than {MAX_ENTRIES} names; patchctl reads no more")
                yield entry.name
    except (FileNotFoundError, NotADirectoryError):
        return
    except PermissionError as exc:
        raise EnvironmentProblem(f"cannot list {folder}: {exc.strerror}") from None


def _finder_mapping(module: Path) -> dict[str, Path]:
    """setuptools' editable finder keeps `MAPPING: dict[str, str] = {...}`: read, not imported."""
    raw = _read_small(module, FINDER_LIMIT)
    try:
        tree = ast.parse(raw or b"")
    except (SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value  # type: ast.expr, ast.expr | None
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "MAPPING" and value is not None:
            try:
                found = ast.literal_eval(value)
            except ValueError:
                return {}
            if isinstance(found, dict):
                return {k: Path(v) for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}
    return {}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class Dist(NamedTuple):
    version: str
    folder: Path  # the sys.path folder holding its metadata


def find_dist(env: PyEnv, name: str) -> Dist | None:
    """The first distribution named `name` along the path, as importlib.metadata finds it."""
    want = _normal(name)
    for folder in env.paths:
        for entry in sorted(_names(folder)):
            if not entry.endswith((".dist-info", ".egg-info")):
                continue
            if _normal(re.split(r"-", entry.rsplit(".", 1)[0], maxsplit=1)[0]) != want:
                continue
            meta = "METADATA" if entry.endswith(".dist-info") else "PKG-INFO"
            st = os.lstat(folder / entry)
            if not stat.S_ISDIR(st.st_mode):
                continue  # a link or a file: not followed
            raw = read_beneath(folder, f"{entry}/{meta}", META_LIMIT)
            if raw is None:
                continue
            head = raw.split(b"\n\n", 1)[0].decode(errors="replace")
            version = email.parser.HeaderParser().parsestr(head).get("Version")
            if version:
                return Dist(version.strip(), folder)
    return None


def package_root(env: PyEnv, package: str) -> Path | None:
    """The folder the top-level `package` is imported from: the first along the path that holds it as
    a folder, else an editable finder's mapping."""
    for folder in env.paths:
        try:
            if stat.S_ISDIR(os.lstat(folder / package).st_mode):
                return folder
        except OSError:
            continue
    if package in env.editable:
        return env.editable[package].parent
    return None


def dist_versions(python: str, names: list[str]) -> dict[str, str | None]:
    """Installed version of each distribution (None where absent), read from the environment's files."""
    env = read_env(python)
    out: dict[str, str | None] = {}
    for name in names:
        dist = find_dist(env, name)
        out[name] = dist.version if dist else None
    return out
