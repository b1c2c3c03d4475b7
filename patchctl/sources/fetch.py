"""EngineRef → the pristine upstream files of that version, wherever they come from."""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import InvalidVersion, Version

from patchctl import config
from patchctl.engines import NightlySource
from patchctl.errors import NetworkError, UsageError
from patchctl.sources.base import DirectorySource, FileSource, ProgressSink
from patchctl.sources.installed import version_of_tree
from patchctl.spec import EngineRef

if TYPE_CHECKING:
    from patchctl.sources.git import GitSource
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.release import ReleaseSource

# GitPython (which runs `git version` at import) and requests are imported where they are used, so
# that building a SourceContext, as every command does, costs nothing on the hot paths.


class SourceContext(NamedTuple):
    """Everything about *how* to fetch, shared by every command."""

    index_url: str | None = None
    offline: bool = False
    progress: ProgressSink | None = None
    nightly_source: str | None = None
    repo: str | None = None
    version_override: Version | None = None  # for trees whose version cannot be read
    sparse: bool = True

    def index(self) -> PackageIndex:
        return _index(self.index_url, self.offline, str(config.cache_dir()))


@functools.lru_cache(maxsize=8)
def _index(index_url: str | None, offline: bool, cache_dir: str) -> PackageIndex:
    """One index client per process, so each project page is read once (the matrix asks often)."""
    from patchctl.sources.index import PackageIndex

    choice = config.resolve_index(index_url)
    return PackageIndex(choice.url, Path(cache_dir), offline=offline, origin=choice.origin)


class Upstream(NamedTuple):
    ref: EngineRef
    version: Version
    source: FileSource
    label: str  # what to show: "vllm 0.23.0 (vllm-0.23.0-...whl)"


def release(ref_engine, version: Version, ctx: SourceContext, index: PackageIndex | None = None,
            prefer_sdist: bool = False) -> ReleaseSource:
    from patchctl.sources.release import ReleaseSource, choose_artifact

    index = index or ctx.index()
    artifact = choose_artifact(index.project(ref_engine.dist), version, prefer_sdist=prefer_sdist)
    return ReleaseSource(ref_engine, artifact, config.cache_dir(), offline=ctx.offline,
                         progress=ctx.progress, sparse=ctx.sparse)


def latest_release(engine, ctx: SourceContext) -> Version:
    """The newest final release on the package index: what `ENGINE@latest`, `rebase --onto latest`
    and `droppable` mean by "latest"."""
    versions = ctx.index().project(engine.dist).versions()
    if not versions:
        raise UsageError(f"the package index has no release of {engine.dist}")
    return versions[-1]


def base_files_for(engine, ctx: SourceContext):
    """Pristine files of a variant's base release, for three-way merges (fetched lazily, once each)."""
    cache: dict = {}

    def read_release(version):
        if version not in cache:
            cache[version] = release(engine, version, ctx)
        return cache[version]

    return read_release


def open_upstream(ref: EngineRef, ctx: SourceContext) -> Upstream:
    from patchctl.sources.git import GitSource, open_repo

    engine = ref.engine
    if ref.kind in ("exact", "latest"):
        index = ctx.index()
        version = latest_release(engine, ctx) if ref.kind == "latest" else ref.version
        source = release(engine, version, ctx, index)
        return Upstream(ref, version, source, f"{engine.dist} {version} ({source.artifact.filename})")
    if ref.kind == "nightly":
        return _nightly(ref, ctx)
    if ref.kind == "git":
        repo_url = ctx.repo or engine.git_url
        if not repo_url:
            raise UsageError(f"{engine.name} has no known git repository: pass --repo URL|PATH")
        repo = open_repo(repo_url, config.cache_dir(), offline=ctx.offline)
        source = GitSource(repo, ref.git_ref, engine.layout_prefix("git"), repo_url)
        version = ctx.version_override or _version_from_git(source, engine)
        return Upstream(ref, version, source, f"{engine.name} {ref.git_ref} ({source.provenance().description})")
    if ref.kind == "path":
        root = Path(ref.path).resolve()
        if not root.is_dir():
            raise UsageError(f"{ref.path} is not a directory")
        prefix = engine.layout_prefix("git")
        if prefix and (root / prefix / engine.packages[0]).is_dir():
            root = root / prefix
        if not (root / engine.packages[0]).is_dir():
            raise UsageError(f"{root} does not contain the {engine.packages[0]}/ package")
        version = ctx.version_override or version_of_tree(engine, root) or version_of_tree(engine, root.parent)
        if version is None:
            raise UsageError(f"cannot tell the {engine.name} version of {root}", hint="pass --as-version X.Y.Z")
        return Upstream(ref, version, DirectorySource(root), f"{engine.name} {version} ({root})")
    raise UsageError(f"{ref} names no upstream files (use ENGINE@VERSION)")


def nightly_source(engine, flag: str | None) -> NightlySource:
    """Where ENGINE@nightly comes from: --nightly-source > the config file > the engine table."""
    override = config.nightly_override(engine.name)
    kind = override.get("kind", engine.nightly.kind)
    if kind == "none":
        raise UsageError(f"{engine.name} publishes no nightly builds")
    url = flag or override.get("url") or engine.nightly.url
    if not url:
        raise UsageError(f"no nightly source is configured for {engine.name}", hint=nightly_hint(engine))
    return NightlySource(kind, url, override.get("ref") or engine.nightly.ref or "main")


def nightly_hint(engine) -> str:
    return f"set nightly.{engine.name}.url in {config.config_file()} or pass --nightly-source URL"


def _nightly(ref: EngineRef, ctx: SourceContext) -> Upstream:
    from patchctl.sources.git import GitSource, open_repo
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.release import ReleaseSource, choose_artifact

    engine = ref.engine
    kind, url, branch = nightly_source(engine, ctx.nightly_source)
    how = nightly_hint(engine)
    if kind == "wheel-index":
        index = PackageIndex(url, config.cache_dir(), offline=ctx.offline, origin="nightly source")
        try:
            project = index.project(engine.dist)
        except NetworkError as exc:
            raise NetworkError(f"nightly source for {engine.name} ({url}) is unreachable: {exc.message}", hint=how) from None
        versions = project.versions(include_pre=True)
        if not versions:
            raise UsageError(f"the nightly source {url} lists no {engine.dist} builds", hint=how)
        version = versions[-1]
        artifact = choose_artifact(project, version)
        source = ReleaseSource(engine, artifact, config.cache_dir(), offline=ctx.offline, progress=ctx.progress)
        return Upstream(ref, version, source, f"{engine.dist} nightly {version} ({artifact.filename})")
    try:
        repo = open_repo(url, config.cache_dir(), offline=ctx.offline)
    except NetworkError as exc:
        raise NetworkError(f"nightly source for {engine.name} ({url}) is unreachable: {exc.message}", hint=how) from None
    source = GitSource(repo, branch, engine.layout_prefix("git"), url)
    version = ctx.version_override or _version_from_git(source, engine)
    return Upstream(ref, version, source, f"{engine.name} nightly {branch} ({source.provenance().description})")


def _version_from_git(source: GitSource, engine) -> Version:
    for rel in (f"{engine.packages[0]}/version.py", f"{engine.packages[0]}/_version.py"):
        data = source.read(rel)
        if data:
            m = re.search(rb"""__version__\s*=\s*['"]([^'"]+)['"]""", data)
            if m:
                try:
                    return Version(m.group(1).decode())
                except InvalidVersion:
                    pass
    # A checkout's version is "the next release": the latest tag is the nearest honest answer.
    try:
        tag = source.repo.git.describe("--tags", "--abbrev=0", source.commit)
        return Version(tag.lstrip("v"))
    except Exception:
        raise UsageError(f"cannot tell the version of {source.description}", hint="pass --as-version X.Y.Z") from None
