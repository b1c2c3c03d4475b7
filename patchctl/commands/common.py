"""Plumbing several commands share: building the fetch context, finding the target."""
from __future__ import annotations

import sys
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchctl.sources import fetch
from patchctl.engine.evaluate import Options
from patchctl.errors import UsageError
from patchctl.sources import installed as inst
from patchctl.spec import EngineRef
from patchctl.target.operations import Target


def parse_version(text: str | None) -> Version | None:
    if text is None:
        return None
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"--as-version {text!r} is not a PEP 440 version") from None


def make_context(*, index_url=None, offline=False, nightly_source=None, repo=None, as_version=None,
                 progress=None, sparse=True) -> fetch.SourceContext:
    return fetch.SourceContext(index_url=index_url, offline=offline, progress=progress,
                           nightly_source=nightly_source, repo=repo,
                           version_override=parse_version(as_version), sparse=sparse)


def base_files_for(engine, ctx: fetch.SourceContext):
    """Pristine files of a variant's base release, for three-way merges (fetched lazily)."""
    cache = {}

    def read_release(version):
        if version not in cache:
            cache[version] = fetch.release(engine, version, ctx)
        return cache[version]

    return read_release


def find_target(ref: EngineRef, *, python: str | None, target_dir: str | None, install: bool,
                ctx: fetch.SourceContext) -> Target:
    engine = ref.engine
    if target_dir:
        root = Path(target_dir).resolve()
        prefix = engine.layout_prefix("git")
        if prefix and not (root / engine.packages[0]).is_dir() and (root / prefix / engine.packages[0]).is_dir():
            root = root / prefix
        if not (root / engine.packages[0]).is_dir():
            raise UsageError(f"{target_dir} does not contain the {engine.packages[0]}/ package")
        version = ctx.version_override or (ref.version if ref.kind == "exact" else None)
        version = version or inst.version_of_tree(engine, root) or inst.version_of_tree(engine, root.parent)
        if version is None:
            raise UsageError(f"cannot tell the {engine.name} version of {root}", hint="name it: ENGINE@X.Y.Z or --as-version")
        return Target(engine, root, version, f"directory {root}")
    python = python or inst.default_python()
    if install:
        _install(ref, python, ctx)
    found = inst.require_installed(engine, python)
    if ref.kind == "exact" and found.version != ref.version:
        raise UsageError(
            f"{engine.dist} {found.version} is installed in {found.python}, not {ref.version}",
            hint=f"pass --install to install {engine.dist}=={ref.version} first, or drop the version",
        )
    return Target(engine, found.root, found.version, f"installed in {found.python}")


def _install(ref: EngineRef, python: str, ctx: fetch.SourceContext) -> None:
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


def options_from(strict: bool, allow_modified: bool) -> Options:
    return Options(strict=strict, allow_modified=allow_modified)


def requirement_warnings(patches, python: str | None) -> list[str]:
    """Companion packages a patch needs (e.g. gguf>=0.18) that the environment lacks."""
    import json
    import subprocess

    from packaging.requirements import Requirement

    warnings = []
    reqs = [(p.name, Requirement(r)) for p in patches for r in p.requires]
    if not reqs:
        return warnings
    names = sorted({r.name for _, r in reqs})
    script = ("import importlib.metadata as m, json, sys\n"
              "out = {}\n"
              "for n in sys.argv[1:]:\n"
              "    try: out[n] = m.version(n)\n"
              "    except m.PackageNotFoundError: out[n] = None\n"
              "print(json.dumps(out))")
    try:
        proc = subprocess.run([python or sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=60)
        have = json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as exc:  # a warning must never fail the command
        return [f"could not check companion packages ({exc})"]
    for patch_name, req in reqs:
        version = have.get(req.name)
        if version is None:
            warnings.append(f"patch {patch_name} needs {req}, which is not installed")
        elif not req.specifier.contains(version, prereleases=True):
            warnings.append(f"patch {patch_name} needs {req}, but {req.name} {version} is installed")
    return warnings
