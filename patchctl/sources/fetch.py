"""How upstream files are fetched, whatever their kind: the context every command builds, the
resolved `Upstream`, the package index (per engine) and its releases. Which kind of upstream a ref
names is `patchctl/sources/registry.py`'s business; each kind lives in `patchctl/sources/kinds/`."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl.core import config
from patchctl.core.engines import Engine
from patchctl.core.errors import UsageError
from patchctl.sources.files import FileSource, ProgressSink

if TYPE_CHECKING:
    from patchctl.sources.index import IndexFile, PackageIndex
    from patchctl.sources.refs import EngineRef
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
    sparse: bool = True  # False: --verify (whole artifacts, checked against the index's sha256)

    def index_for(self, engine: Engine | None = None) -> PackageIndex:
        """The package index for the engine's releases (engines.yaml may name one of its own)."""
        return _index(self.index_url, self.offline, str(config.cache_dir()), engine.index_url if engine else None)


@functools.lru_cache(maxsize=8)
def _index(index_url: str | None, offline: bool, cache_dir: str, engine_index: str | None = None) -> PackageIndex:
    """One index client per process, so each project page is read once (the matrix asks often)."""
    from patchctl.sources.index import PackageIndex

    choice = resolve_index(index_url, engine_index)
    return PackageIndex(choice.url, Path(cache_dir), offline=offline, origin=choice.origin)


def resolve_index(flag: str | None = None, engine_index: str | None = None) -> config.IndexChoice:
    """Which index to read: --index-url > the config file's index_url > the engine's own index
    (engines.yaml) > pip's settings (PIP_INDEX_URL, pip.conf), else pip's default index."""
    chosen = config.configured_index(flag)
    if chosen is not None:
        return chosen
    if engine_index:
        return config.IndexChoice(engine_index.rstrip("/"), "index_url in engines.yaml")
    from patchctl.sources import pip_config

    url, origin = pip_config.configured_index_url()
    return config.IndexChoice(url.rstrip("/"), origin)


def installer_index(ctx: SourceContext, engine: Engine) -> str | None:
    """The index patchctl reads, for the installer: passed on explicitly only when someone configured
    it (--index-url, the config file, engines.yaml, PIP_INDEX_URL, pip config): uv reads no pip
    configuration, so it would not see it."""
    if ctx.index_url:
        return ctx.index_url
    choice = resolve_index(None, engine.index_url)
    return None if choice.origin == "pip's default index" else choice.url


class Upstream(NamedTuple):
    ref: EngineRef
    version: Version
    source: FileSource
    label: str  # what to show: "vllm 0.23.0 (vllm-0.23.0-...whl)"
    # A wheel index build: every file the index lists for the version (one wheel per platform), so
    # that `apply --install` installs the one for the target's machine by its URL.
    files: tuple[IndexFile, ...] = ()


def release(
    ref_engine: Engine, version: Version, ctx: SourceContext, index: PackageIndex | None = None, prefer_sdist: bool = False
) -> ReleaseSource:
    from patchctl.sources.release import ReleaseSource, choose

    index = index or ctx.index_for(ref_engine)
    cache = config.cache_dir()
    choice = choose(index.project(ref_engine.dist), version, prefer_sdist=prefer_sdist, cache_root=cache, offline=ctx.offline)
    return ReleaseSource(
        ref_engine,
        choice.file,
        cache,
        offline=ctx.offline,
        progress=ctx.progress,
        sparse=ctx.sparse,
        whole=choice.whole,
        verify=not ctx.sparse,
        reason=choice.reason if ctx.sparse else f"{choice.file.kind}, whole: --verify checks it against the index's sha256",
    )


def latest_release(engine: Engine, ctx: SourceContext) -> Version:
    """The newest final release on the package index: what `ENGINE@latest`, `rebase --onto latest`
    and `droppable` mean by "latest"."""
    versions = ctx.index_for(engine).project(engine.dist).versions()
    if not versions:
        raise UsageError(f"the package index has no release of {engine.dist}")
    return versions[-1]


def base_files_for(engine: Engine, ctx: SourceContext) -> Callable[[Version], ReleaseSource]:
    """Pristine files of a variant's base release, for three-way merges (fetched lazily, once each)."""
    cache: dict[Version, ReleaseSource] = {}

    def read_release(version: Version) -> ReleaseSource:
        if version not in cache:
            cache[version] = release(engine, version, ctx)
        return cache[version]

    return read_release


_COMMIT = re.compile(r"g([0-9a-f]{7,40})")


def commit_of(version: Version) -> str | None:
    """The commit a dev build names in its local version (0.23.1rc1.dev901+g2f3f441f8.cu130)."""
    for part in (version.local or "").split("."):
        m = _COMMIT.fullmatch(part)
        if m:
            return m.group(1)
    return None


def same_commit(a: str | None, b: str) -> bool:
    """Two abbreviations of one commit: either is a prefix of the other."""
    return a is not None and bool(a) and (a.startswith(b) or b.startswith(a))
