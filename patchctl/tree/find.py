"""Which tree a target command works on: the engine installed for an interpreter, or a directory;
installing the named build first when asked (`apply --install`): exactly the one `check` resolves
(a nightly wheel by its URL, a git build by its commit), with uv when it is on PATH, else pip, and
refused (exit 3) unless the installed dist-info then names that very version."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl.core.engines import Engine
from patchctl.core.errors import UsageError
from patchctl.core.nofollow import RECORD_LIMIT, read_beneath
from patchctl.core.pyenv import dist_versions
from patchctl.core.yamlio import load_json
from patchctl.sources import installed as inst
from patchctl.sources.spec import EngineRef
from patchctl.tree.bookkeeping import BuildRecord
from patchctl.tree.edits import dist_info_file
from patchctl.tree.target import Target

if TYPE_CHECKING:
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.series import Patch


class TargetSpec(NamedTuple):
    """Which tree a target command writes to: an interpreter's installed engine, or a directory."""

    python: str | None = None
    target_dir: str | None = None
    as_version: Version | None = None


def find_target(
    ref: EngineRef, where: TargetSpec, *, install: bool = False, ctx: SourceContext | None = None, no_deps: bool = False
) -> Target:
    """install: resolve the ref as `check` does, install exactly that build (plan_install), check the
    dist-info names it, then return the installed tree; no_deps: the installer leaves dependencies alone."""
    engine = ref.engine
    if where.target_dir and install:
        raise UsageError(
            "--install installs into a Python environment, not into --target DIR",
            hint="pass --python PATH (the environment's interpreter) instead of --target",
        )
    if where.target_dir:
        root = Path(where.target_dir).resolve()
        prefix, package = engine.layout_prefix("git"), engine.version_package
        if prefix and not (root / package).is_dir() and (root / prefix / package).is_dir():
            root = root / prefix
        if not (root / package).is_dir():
            raise UsageError(f"{where.target_dir} does not contain the {package}/ package")
        # The tree's own metadata wins over the spec: patching 0.5.9 files as 0.5.13 would pick the
        # wrong variants. --as-version is the explicit override (a tree whose metadata is wrong).
        found = tree_version(engine, root) or tree_version(engine, root.parent)
        if where.as_version is not None:
            version = where.as_version
        elif found is not None:
            if ref.version is not None and ref.version != found:
                raise UsageError(
                    f"{root} holds {engine.dist} {found}, not {ref.version}",
                    hint=f"drop the version ({engine.name}), or pass --as-version {ref.version} if the tree's metadata is wrong",
                )
            version = found
        elif ref.version is not None:  # an exact release named
            version = ref.version
        else:
            raise UsageError(f"cannot tell the {engine.name} version of {root}", hint="name it: ENGINE@X.Y.Z or --as-version")
        return Target(engine, root, version, f"directory {root}", installed_build(engine, root, version))
    python = where.python or inst.default_python()
    if install:
        assert ctx is not None  # --install comes with the fetch options, which build the context
        plan = plan_install(ref, python, ctx)
        build = run_install(plan, python, no_deps=no_deps)
        installed = check_installed(plan._replace(build=build), engine, python)
        from_dist = installed_build(engine, installed.root, installed.version)
        # What the installer wrote (direct_url.json) completes what patchctl resolved.
        build = build._replace(commit=build.commit or from_dist.commit)
        return Target(engine, installed.root, installed.version, f"installed in {installed.python}", build)
    installed = inst.require_installed(engine, python)
    # importlib.metadata reports the first dist-info it meets; with two (pip left the old one) the
    # one whose RECORD matches the files is the installed version.
    installed = installed._replace(version=tree_version(engine, installed.root) or installed.version)
    if ref.version is not None and installed.version != ref.version:
        raise UsageError(
            f"{engine.dist} {installed.version} is installed in {installed.python}, not {ref.version}",
            hint=f"drop the version, or `patchctl apply {engine.name}@{ref.version} --install` installs it first",
        )
    return Target(
        engine,
        installed.root,
        installed.version,
        f"installed in {installed.python}",
        installed_build(engine, installed.root, installed.version),
    )


def tree_version(engine: Engine, root: Path) -> Version | None:
    """The version of the engine's tree at root: from its dist-info (the one whose RECORD matches the
    files, when pip left two), else from PKG-INFO or the package's version file."""
    infos = [
        d
        for d in root.glob("*.dist-info")
        if _dist_name(d) == engine.dist and dist_info_file(root, d.name, "METADATA") is not None
    ]
    if len(infos) > 1:
        return _version_matching_files(engine, root, infos)
    # Its metadata read as every file of a tree patchctl may write (no link out, no FIFO, bounded).
    return inst.version_of_tree(engine, root, read=lambda p: read_beneath(root, p.relative_to(root).as_posix(), RECORD_LIMIT))


def _info_version(info: Path) -> Version | None:
    from packaging.version import InvalidVersion

    try:
        return Version(info.name.removesuffix(".dist-info").rsplit("-", 1)[1])
    except (InvalidVersion, IndexError):
        return None


def _dist_name(info: Path) -> str:
    return info.name.removesuffix(".dist-info").rsplit("-", 1)[0].replace("_", "-").lower()


def _version_matching_files(engine: Engine, root: Path, infos: list[Path]) -> Version:
    import email

    from patchctl.sources.zipread import record_hashes

    def version_of(info: Path) -> Version:
        raw = dist_info_file(root, info.name, "METADATA") or b""
        return Version(email.message_from_string(raw.decode(errors="replace"))["Version"])

    records = {
        info: record_hashes(raw) if (raw := dist_info_file(root, info.name, "RECORD")) is not None else {} for info in infos
    }
    # Files the candidates disagree on decide it; files patchctl patched match neither, so they only
    # lower every score alike.
    contested = {
        path
        for rec in records.values()
        for path, digest in rec.items()
        if path.split("/", 1)[0] in engine.packages and len({r.get(path) for r in records.values()}) > 1
    }
    current = {}
    for path in sorted(contested)[:2000]:
        data = read_beneath(root, path)
        current[path] = None if data is None else hashlib.sha256(data).hexdigest()
    scores = {info: sum(current.get(p) == rec.get(p) for p in current) for info, rec in records.items()}
    ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
    if ranked[0][1] > 0 and ranked[0][1] > ranked[1][1]:
        return version_of(ranked[0][0])
    names = " and ".join(i.name for i in infos)
    raise UsageError(
        f"{root} has {len(infos)} dist-info folders for {engine.dist} ({names}) and the files match neither RECORD better",
        hint="remove the stale one (pip install --force-reinstall the version you run), then try again",
    )


def env_python(where: TargetSpec) -> str | None:
    """The interpreter whose environment holds the target, or None for a bare directory."""
    return None if where.target_dir else (where.python or inst.default_python())


# --- apply --install: exactly the build that was resolved ---------------------------------------


class InstallPlan(NamedTuple):
    """What `--install` runs: one requirement naming one build, and the identity to check afterwards."""

    requirement: str  # vllm @ https://…/vllm-0.23.1.dev12%2Bg….whl, sglang @ git+URL@SHA#subdirectory=python, vllm==0.23.0
    version: Version  # what the installed dist-info must say
    build: BuildRecord
    index_url: str | None  # for the dependencies (and ENGINE==VERSION): the index patchctl reads


def plan_install(ref: EngineRef, python: str, ctx: SourceContext) -> InstallPlan:
    """Resolve the ref the way `check` does and name exactly that build: the ref's kind says which
    (sources/kinds/: a release by ENGINE==VERSION, a nightly wheel by its URL, a git build by its
    commit, a file on disk by its path)."""
    from patchctl.sources import fetch, registry

    pin = registry.kind_named(ref.kind).pin(ref, python, ctx)
    build = BuildRecord(
        pin.kind, str(pin.version), pin.commit, pin.url, pin.artifact, pin.sha256, pin.record_sha256, pin.index_url, str(ref)
    )
    return InstallPlan(pin.requirement, pin.version, build, fetch.installer_index(ctx, ref.engine))


def run_install(plan: InstallPlan, python: str, *, no_deps: bool = False) -> BuildRecord:
    """Run the installer: uv (`uv pip install --python PY`) when it is on PATH, else `PY -m pip
    install`. Its output goes to stderr: stdout is the command's (with --json, one document).
    As root on an environment another user owns, the installer runs as that user (`installer_user`)."""
    import shutil

    owner = installer_user(python)
    uv = shutil.which("uv")
    if uv and owner and not _others_may_run(uv):
        uv = None  # root's own uv (under /root): the environment's owner could not run it; their pip can
    extra = ["--no-deps"] if no_deps else []
    if plan.index_url:
        extra += ["--index-url", plan.index_url]
    if uv:
        cmd = [uv, "pip", "install", "--python", python, plan.requirement, *extra]
    else:
        cmd = [python, "-m", "pip", "install", plan.requirement, *extra]
    _run_installer(cmd, "uv" if uv else "pip", owner)
    return plan.build._replace(installer="uv" if uv else "pip")


def installer_user(python: str) -> tuple[int, int] | None:
    """As root, the (uid, gid) an installer for python's environment runs as: the owner of the
    folder it installs into, when that is not root. Installing runs the environment's own code (pip
    from its site-packages, its `.pth` files and sitecustomize at start-up; uv starts the
    interpreter to ask it about itself), which its owner may have written: run as root, that is
    root running another user's code (issue 33, item 1). None: run as the current user."""
    import os

    from patchctl.core import pyenv

    if os.geteuid() != 0:
        return None
    sites = [p for p in pyenv.read_env(python).paths if p.name in ("site-packages", "dist-packages")]
    try:
        st = os.stat(sites[0] if sites else Path(python).parent)
    except OSError:
        return None
    return None if st.st_uid == 0 else (st.st_uid, st.st_gid)


def _others_may_run(program: str) -> bool:
    """Whether a user other than its owner can reach and execute program (every folder on its way
    searchable by others, the file executable by others)."""
    import os

    path = Path(os.path.realpath(program))
    return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])


def check_installed(plan: InstallPlan, engine: Engine, python: str) -> inst.Installed:
    """The dist-info the installer left must name the resolved build; anything else is refused
    (exit 3) before a single file is patched."""
    from patchctl.core.errors import EnvironmentProblem

    found = inst.find_installed(engine, python)
    how = "uv" if plan.build.installer == "uv" else "pip"
    if found is None:
        raise EnvironmentProblem(
            f"{how} reported success, but {engine.dist} is not installed in {python}",
            hint=f"see {how}'s output above (it installed {plan.requirement!r})",
        )
    version = tree_version(engine, found.root) or found.version
    if version != plan.version and not _same_build(version, plan.version):
        raise EnvironmentProblem(
            f"{engine.dist} {version} is installed in {python}, not the resolved build {plan.version} "
            f"({plan.build.url or plan.requirement}); nothing was patched",
            hint="the installer kept or chose another build: remove it (pip uninstall) and run again",
        )
    return found._replace(version=version)


def _same_build(a: Version, b: Version) -> bool:
    """One commit's build under two abbreviations of its sha (setuptools-scm before and after it cut
    nodes to 9 hex digits): the same public version and commits that are prefixes of each other."""
    from patchctl.sources.fetch import commit_of, same_commit

    ca, cb = commit_of(a), commit_of(b)
    if ca is None or cb is None:
        return False
    return a.public == b.public and same_commit(ca, cb)


def _run_installer(cmd: list[str], name: str, owner: tuple[int, int] | None = None) -> None:
    import subprocess
    import sys

    from patchctl.core.errors import EnvironmentProblem

    try:
        sys.stderr.flush()  # what patchctl said so far comes before the installer's lines
        stderr_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object with no descriptor
        stderr_fd = 2
    as_owner: dict = {}
    if owner is not None:
        import os
        import pwd

        env = dict(os.environ)
        try:
            env["HOME"] = pwd.getpwuid(owner[0]).pw_dir
        except KeyError:  # a uid with no account: no home for caches
            env.pop("HOME", None)
            env.update(PIP_NO_CACHE_DIR="1", UV_NO_CACHE="1")
        as_owner = {"user": owner[0], "group": owner[1], "extra_groups": [], "env": env}
        print(
            f"patchctl: running {name} as uid {owner[0]}, the owner of the environment it installs into "
            "(root runs none of its code)",
            file=sys.stderr,
        )
    try:
        proc = subprocess.run(cmd, stdout=stderr_fd, **as_owner)
    except OSError as exc:
        whom = f" as uid {owner[0]}" if owner else ""
        raise EnvironmentProblem(f"cannot run {name}{whom}: {exc}") from None
    if proc.returncode != 0:
        hint = "install pip into that environment, or put uv on PATH" if name == "pip" else None
        raise EnvironmentProblem(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}; nothing was patched", hint=hint)


def installed_build(engine: Engine, root: Path, version: Version) -> BuildRecord:
    """What an installed tree says about its build: the version, the commit (`+g<sha>`, or the git
    commit a VCS install names) and, for a URL or git install, its direct_url.json (PEP 610)."""

    from patchctl.sources.fetch import commit_of

    commit, url = commit_of(version), None
    for info in root.glob("*.dist-info"):
        if _dist_name(info) != engine.dist:
            continue
        raw = dist_info_file(root, info.name, "direct_url.json")
        if raw is None:
            continue
        try:
            direct = load_json(raw.decode())
        except ValueError:  # UnicodeDecodeError included
            continue
        if not isinstance(direct, dict) or _info_version(info) != version:
            continue  # another version's dist-info, left behind
        vcs = direct.get("vcs_info")
        sha = vcs.get("commit_id") if isinstance(vcs, dict) else None
        sha = sha if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{7,40}", sha) else None
        commit = sha or commit
        if isinstance(direct.get("url"), str):
            url = f"git+{direct['url']}@{sha}" if sha else direct["url"]
        break
    return BuildRecord("installed", str(version), commit, url)


def requirement_warnings(patches: Iterable[Patch], python: str | None) -> list[str]:
    """Companion packages a patch needs (e.g. gguf>=0.18) that the environment lacks."""
    from packaging.requirements import Requirement

    reqs = [(p.name, Requirement(r)) for p in patches for r in p.requires]
    if not reqs or python is None:
        return []
    try:
        have = dist_versions(python, sorted({r.name for _, r in reqs}))
    except Exception as exc:  # a warning must never fail the command
        return [f"could not check companion packages ({exc})"]
    warnings = []
    for patch_name, req in reqs:
        version = have.get(req.name)
        if version is None:
            warnings.append(f"patch {patch_name} needs {req}, which is not installed")
        elif not req.specifier.contains(version, prereleases=True):
            warnings.append(f"patch {patch_name} needs {req}, but {req.name} {version} is installed")
    return warnings
