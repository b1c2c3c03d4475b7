"""`ENGINE@X.Y.Z` and `ENGINE@latest`: a release on the package index (its wheel or sdist)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from patchctl.core import config
from patchctl.core.versions import parse_version
from patchctl.sources import fetch
from patchctl.sources.kinds import Parsed, PinnedBuild

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext, Upstream
    from patchctl.sources.files import FileSource
    from patchctl.sources.refs import EngineRef


class _Release:
    """What an exact release and `latest` share once the version is known."""

    smoke_label = "release"  # built from its sdist when it has one, else its wheel

    def version_of(self, ref: EngineRef, ctx: SourceContext) -> Version:
        raise NotImplementedError

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        engine = ref.engine
        index = ctx.index_for(engine)
        version = self.version_of(ref, ctx)
        source = fetch.release(engine, version, ctx, index)
        return fetch.Upstream(ref, version, source, f"{engine.dist} {version} ({source.artifact.filename})")

    def pin(self, ref: EngineRef, python: str, ctx: SourceContext) -> PinnedBuild:
        version = self.version_of(ref, ctx)
        return PinnedBuild(
            f"{ref.engine.dist}=={version}",
            version,
            "release",
            fetch.commit_of(version),
            index_url=fetch.installer_index(ctx, ref.engine),
        )

    def tree_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        return fetch.release(upstream.ref.engine, upstream.version, ctx, prefer_sdist=True)

    def full_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        """The release's wheel (compiled parts included) when `check` would read its sdist (a small
        sdist is cheaper to check from, but it is not the installed package)."""
        from patchctl.sources.release import ReleaseSource, choose

        chosen = upstream.source
        assert isinstance(chosen, ReleaseSource)  # what open() resolves a release to
        if chosen.artifact.kind == "wheel":
            return chosen
        engine = upstream.ref.engine
        choice = choose(ctx.index_for(engine).project(engine.dist), upstream.version, installable=True)
        if choice.file.kind != "wheel":
            return chosen
        return ReleaseSource(
            engine,
            choice.file,
            config.cache_dir(),
            offline=ctx.offline,
            progress=ctx.progress,
            whole=True,
            reason=choice.reason + " (--full)",
        )


class Exact(_Release):
    name = "exact"
    syntax = "a PEP 440 version"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        if text is None:
            return None
        try:
            return Parsed(version=parse_version(text))
        except InvalidVersion:
            return None

    def suffix(self, ref: EngineRef) -> str:
        return f"@{ref.version}"

    def version_of(self, ref: EngineRef, ctx: SourceContext) -> Version:
        assert ref.version is not None  # parse gives every exact ref its version
        return ref.version


class Latest(_Release):
    name = "latest"
    syntax = "'latest'"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        return Parsed() if text == "latest" else None

    def suffix(self, ref: EngineRef) -> str:
        return "@latest"

    def version_of(self, ref: EngineRef, ctx: SourceContext) -> Version:
        return fetch.latest_release(ref.engine, ctx)


EXACT = Exact()
LATEST = Latest()
