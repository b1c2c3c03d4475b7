"""Which tree a target command works on: the engine installed for an interpreter, or a directory;
installing the named version first when asked (`apply --install`)."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from patchctl.errors import UsageError
from patchctl.interpreter import dist_versions
from patchctl.sources import installed as inst
from patchctl.spec import EngineRef
from patchctl.target.operations import Target


class TargetSpec(NamedTuple):
    """Which tree a target command writes to: an interpreter's installed engine, or a directory."""

    python: str | None = None
    target_dir: str | None = None
    as_version: Version | None = None


def find_target(ref: EngineRef, where: TargetSpec, *, install: bool = False, ctx=None) -> Target:
    engine = ref.engine
    if where.target_dir:
        root = Path(where.target_dir).resolve()
        prefix = engine.layout_prefix("git")
        if prefix and not (root / engine.packages[0]).is_dir() and (root / prefix / engine.packages[0]).is_dir():
            root = root / prefix
        if not (root / engine.packages[0]).is_dir():
            raise UsageError(f"{where.target_dir} does not contain the {engine.packages[0]}/ package")
        version = where.as_version or (ref.version if ref.kind == "exact" else None)
        version = version or inst.version_of_tree(engine, root) or inst.version_of_tree(engine, root.parent)
        if version is None:
            raise UsageError(f"cannot tell the {engine.name} version of {root}",
                             hint="name it: ENGINE@X.Y.Z or --as-version")
        return Target(engine, root, version, f"directory {root}")
    python = where.python or inst.default_python()
    if install:
        _install(ref, python, ctx)
    found = inst.require_installed(engine, python)
    if ref.kind == "exact" and found.version != ref.version:
        raise UsageError(
            f"{engine.dist} {found.version} is installed in {found.python}, not {ref.version}",
            hint=f"pass --install to install {engine.dist}=={ref.version} first, or drop the version",
        )
    return Target(engine, found.root, found.version, f"installed in {found.python}")


def env_python(where: TargetSpec) -> str | None:
    """The interpreter whose environment holds the target, or None for a bare directory."""
    return None if where.target_dir else (where.python or inst.default_python())


def _install(ref: EngineRef, python: str, ctx) -> None:
    from patchctl.sources import fetch

    engine = ref.engine
    extra: tuple[str, ...] = ()
    if ctx.index_url:
        extra += ("--index-url", ctx.index_url)
    if ref.kind == "exact":
        requirement = f"{engine.dist}=={ref.version}"
    elif ref.kind in ("latest", "installed"):
        requirement, extra = engine.dist, extra + ("--upgrade",)
    elif ref.kind == "nightly":
        kind, url, branch = fetch.nightly_source(engine, ctx.nightly_source)
        if kind == "git":
            prefix = engine.layout_prefix("git").rstrip("/")
            sub = f"#subdirectory={prefix}" if prefix else ""
            requirement = f"{engine.dist} @ git+{url}@{branch}{sub}"
        else:
            requirement, extra = engine.dist, extra + ("--pre", "--upgrade", "--extra-index-url", url)
    else:
        raise UsageError(f"--install cannot install {ref}")
    inst.pip_install(python, requirement, extra)


def requirement_warnings(patches, python: str | None) -> list[str]:
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
