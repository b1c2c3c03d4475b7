"""`ENGINE@nightly`: the newest build of the engine's main branch, from a wheel index (vLLM's
nightlies) or a git repository (SGLang's main): engines.yaml's `nightly:`, overridden by the config
file's `nightly.<engine>` and --nightly-source."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from patchctl.core import config
from patchctl.core.engines import NightlySource
from patchctl.core.errors import NetworkError, UsageError, plain_network_reason
from patchctl.sources.fetch import Upstream, commit_of, same_commit
from patchctl.sources.kinds import Parsed
from patchctl.sources.kinds.common import Build

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.refs import EngineRef


class Nightly(Build):
    name = "nightly"
    syntax = "'nightly'"
    smoke_label = "nightly"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        return Parsed() if text == "nightly" else None

    def suffix(self, ref: EngineRef) -> str:
        return "@nightly"

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        from patchctl.sources.git import GitSource, open_repo
        from patchctl.sources.kinds.git import version_of_checkout

        engine = ref.engine
        kind, url, branch = nightly_source(engine, ctx.nightly_source)
        assert url is not None  # nightly_source() raises when none is configured
        if kind == "wheel-index":
            return wheel_index_build(ref, ctx, url, "nightly source")
        try:
            repo = open_repo(url, config.cache_dir(), offline=ctx.offline)
        except NetworkError as exc:
            raise NetworkError(
                f"nightly source for {engine.name} ({url}) is unreachable: {plain_network_reason(exc.message)}",
                hint=nightly_hint(engine),
            ) from None
        source = GitSource(repo, branch or "main", engine.layout_prefix("git"), url)
        version = ctx.version_override or version_of_checkout(source, engine)
        return Upstream(ref, version, source, f"{engine.name} nightly {branch} ({source.provenance().description})")


def nightly_kind(engine: Engine) -> str:
    """wheel-index, git or none: engines.yaml's, unless the config file says otherwise."""
    return str(config.nightly_override(engine.name).get("kind", engine.nightly.kind))


def publishes_nightly(engine: Engine) -> bool:
    """Whether the engine has nightly builds at all (`none` leaves it out of the matrix, deliberately)."""
    return nightly_kind(engine) != "none"


def nightly_source(engine: Engine, flag: str | None) -> NightlySource:
    """Where ENGINE@nightly comes from: --nightly-source > the config file > engines.yaml. For a wheel
    index the URL includes the variant folder (`nightly.<engine>.variant: cu130` → <url>/cu130)."""
    override = config.nightly_override(engine.name)
    kind = nightly_kind(engine)
    if kind == "none":
        raise UsageError(f"{engine.name} publishes no nightly builds")
    url = flag or override.get("url") or engine.nightly.url
    if not url:
        raise UsageError(f"no nightly source is configured for {engine.name}", hint=nightly_hint(engine))
    url = url.rstrip("/")
    variant = override.get("variant", engine.nightly.variant)
    if kind == "wheel-index" and variant:
        url = f"{url}/{variant}"
    return NightlySource(kind, url, override.get("ref") or engine.nightly.ref or "main")


def nightly_root(engine: Engine, flag: str | None) -> tuple[str, str | None]:
    """The wheel repository's root (the nightly URL less /nightly) and the variant, for commit:SHA."""
    override = config.nightly_override(engine.name)
    url = (flag or override.get("url") or engine.nightly.url or "").rstrip("/")
    if not url:
        raise UsageError(f"no nightly source is configured for {engine.name}", hint=nightly_hint(engine))
    root = url[: -len("/nightly")] if url.endswith("/nightly") else url
    return root, override.get("variant", engine.nightly.variant)


def nightly_hint(engine: Engine) -> str:
    file = config.config_file()
    try:  # ~/... : the same words on every machine (the hint lands in the committed matrix too)
        file_text = f"~/{file.relative_to(Path.home())}"
    except ValueError:
        file_text = str(file)
    if engine.nightly.kind == "git":
        where = f"set nightly.{engine.name}.url (a mirror or a local clone) in {file_text}"
    else:
        where = f"set nightly.{engine.name}.url (and .variant) in {file_text}"
    return f"{where} or pass --nightly-source URL; --offline serves a build read before"


def wheel_index_build(ref: EngineRef, ctx: SourceContext, url: str, what: str, commit: str | None = None) -> Upstream:
    """The newest build a wheel index page lists (of `commit`, when named)."""
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.release import ReleaseSource, choose_artifact

    engine = ref.engine
    how = nightly_hint(engine)
    index = PackageIndex(url, config.cache_dir(), offline=ctx.offline, origin=what)
    try:
        project = index.project(engine.dist)
    except NetworkError as exc:
        raise NetworkError(
            f"{what} for {engine.name} ({url}) is unreachable: {plain_network_reason(exc.message)}", hint=how
        ) from None
    except UsageError as exc:  # 404: no such project page (a commit without builds, a wrong URL)
        raise UsageError(f"{what} for {engine.name} ({url}) has no {engine.dist} builds: {exc.message}", hint=how) from None
    versions = project.versions(include_pre=True)
    if commit:
        versions = [v for v in versions if same_commit(commit_of(v), commit)] or versions
    if not versions:
        raise UsageError(f"the {what} {url} lists no {engine.dist} builds", hint=how)
    version = versions[-1]
    artifact = choose_artifact(project, version)
    details = {"version": str(version), "commit": commit_of(version), "index": url}
    source = ReleaseSource(engine, artifact, config.cache_dir(), offline=ctx.offline, progress=ctx.progress, details=details)
    return Upstream(
        ref, version, source, f"{engine.dist} {what} {version} ({artifact.filename})", tuple(project.files_for(version))
    )


NIGHTLY = Nightly()
