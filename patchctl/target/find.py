"""Which tree a target command works on: the engine installed for an interpreter, or a directory;
installing the named version first when asked (`apply --install`)."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl.engines import Engine
from patchctl.errors import UsageError
from patchctl.interpreter import dist_versions
from patchctl.sources import installed as inst
from patchctl.spec import EngineRef
from patchctl.target.operations import Target

if TYPE_CHECKING:
    from patchctl.sources.fetch import SourceContext
    from patchctl.store import Patch


class TargetSpec(NamedTuple):
    """Which tree a target command writes to: an interpreter's installed engine, or a directory."""

    python: str | None = None
    target_dir: str | None = None
    as_version: Version | None = None


def find_target(ref: EngineRef, where: TargetSpec, *, install: bool = False,
                ctx: SourceContext | None = None) -> Target:
    engine = ref.engine
    if where.target_dir:
        root = Path(where.target_dir).resolve()
        prefix = engine.layout_prefix("git")
        if prefix and not (root / engine.packages[0]).is_dir() and (root / prefix / engine.packages[0]).is_dir():
            root = root / prefix
        if not (root / engine.packages[0]).is_dir():
            raise UsageError(f"{where.target_dir} does not contain the {engine.packages[0]}/ package")
        # The tree's own metadata wins over the spec: patching 0.5.9 files as 0.5.13 would pick the
        # wrong variants. --as-version is the explicit override (a tree whose metadata is wrong).
        found = tree_version(engine, root) or tree_version(engine, root.parent)
        if where.as_version is not None:
            version = where.as_version
        elif found is not None:
            if ref.kind == "exact" and ref.version != found:
                raise UsageError(f"{root} holds {engine.dist} {found}, not {ref.version}",
                                 hint=f"drop the version ({engine.name}), or pass --as-version {ref.version} if the "
                                      f"tree's metadata is wrong")
            version = found
        elif ref.kind == "exact":
            assert ref.version is not None  # parse_spec gives every "exact" ref its version
            version = ref.version
        else:
            raise UsageError(f"cannot tell the {engine.name} version of {root}",
                             hint="name it: ENGINE@X.Y.Z or --as-version")
        return Target(engine, root, version, f"directory {root}")
    python = where.python or inst.default_python()
    if install:
        assert ctx is not None  # --install comes with the fetch options, which build the context
        _install(ref, python, ctx)
    installed = inst.require_installed(engine, python)
    # importlib.metadata reports the first dist-info it meets; with two (pip left the old one) the
    # one whose RECORD matches the files is the installed version.
    installed = installed._replace(version=tree_version(engine, installed.root) or installed.version)
    if ref.kind == "exact" and installed.version != ref.version:
        raise UsageError(
            f"{engine.dist} {installed.version} is installed in {installed.python}, not {ref.version}",
            hint=f"pass --install to install {engine.dist}=={ref.version} first, or drop the version",
        )
    return Target(engine, installed.root, installed.version, f"installed in {installed.python}")


def tree_version(engine: Engine, root: Path) -> Version | None:
    """The version of the engine's tree at root: from its dist-info (the one whose RECORD matches the
    files, when pip left two), else from PKG-INFO or the package's version file."""
    infos = [d for d in root.glob("*.dist-info") if _dist_name(d) == engine.dist and (d / "METADATA").is_file()]
    if len(infos) > 1:
        return _version_matching_files(engine, root, infos)
    return inst.version_of_tree(engine, root)


def _dist_name(info: Path) -> str:
    return info.name.removesuffix(".dist-info").rsplit("-", 1)[0].replace("_", "-").lower()


def _version_matching_files(engine: Engine, root: Path, infos: list[Path]) -> Version:
    import email

    from patchctl.sources.zipread import record_hashes

    def version_of(info: Path) -> Version:
        return Version(email.message_from_string((info / "METADATA").read_text(errors="replace"))["Version"])

    records = {info: record_hashes((info / "RECORD").read_bytes()) if (info / "RECORD").is_file() else {}
               for info in infos}
    # Files the candidates disagree on decide it; files patchctl patched match neither, so they only
    # lower every score alike.
    contested = {path for rec in records.values() for path, digest in rec.items()
                 if path.split("/", 1)[0] in engine.packages
                 and len({r.get(path) for r in records.values()}) > 1}
    current = {}
    for path in sorted(contested)[:2000]:
        file = root / path
        current[path] = hashlib.sha256(file.read_bytes()).hexdigest() if file.is_file() else None
    scores = {info: sum(current.get(p) == rec.get(p) for p in current) for info, rec in records.items()}
    ranked = sorted(scores.items(), key=lambda kv: kv[1], reverse=True)
    if ranked[0][1] > 0 and ranked[0][1] > ranked[1][1]:
        return version_of(ranked[0][0])
    names = " and ".join(i.name for i in infos)
    raise UsageError(f"{root} has {len(infos)} dist-info folders for {engine.dist} ({names}) and the files match "
                     f"neither RECORD better", hint="remove the stale one (pip install --force-reinstall the version "
                                                    "you run), then try again")


def env_python(where: TargetSpec) -> str | None:
    """The interpreter whose environment holds the target, or None for a bare directory."""
    return None if where.target_dir else (where.python or inst.default_python())


def _install(ref: EngineRef, python: str, ctx: SourceContext) -> None:
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
        assert url is not None  # nightly_source() raises when no URL is configured
        if kind == "git":
            prefix = engine.layout_prefix("git").rstrip("/")
            sub = f"#subdirectory={prefix}" if prefix else ""
            requirement = f"{engine.dist} @ git+{url}@{branch}{sub}"
        else:
            requirement, extra = engine.dist, extra + ("--pre", "--upgrade", "--extra-index-url", url)
    else:
        raise UsageError(f"--install cannot install {ref}")
    inst.pip_install(python, requirement, extra)


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
