"""What several kinds share: the refusals of a kind that cannot do something, and the pinning of a
resolved build (a wheel of a wheel index, a git commit) for `apply --install`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from patchctl.core.errors import UsageError
from patchctl.sources.fetch import commit_of
from patchctl.sources.kinds import PinnedBuild

if TYPE_CHECKING:
    from patchctl.sources.fetch import SourceContext, Upstream
    from patchctl.sources.files import FileSource
    from patchctl.sources.index import IndexFile
    from patchctl.sources.refs import EngineRef

INSTALL_HINT = "name a version, nightly, commit:SHA, git:REF or file:PATH"
SMOKE_WHAT = "smoke checks need a release or a build: ENGINE@X.Y.Z, @latest, @nightly, @commit:SHA, @git:REF or @file:PATH"
FULL_WHAT = "--full needs a release or a directory as the source"


class Refusals:
    """The defaults of a kind that cannot be installed, smoke-tested or exported whole."""

    smoke_label: str | None = None

    def pin(self, ref: EngineRef, python: str, ctx: SourceContext) -> PinnedBuild:
        raise UsageError(f"--install cannot install {ref}", hint=INSTALL_HINT)

    def tree_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        raise UsageError(SMOKE_WHAT)

    def full_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        raise UsageError(FULL_WHAT)


def pin_resolved(upstream: Upstream, python: str) -> PinnedBuild:
    """A resolved build, by the identity `check` read: a git commit by its commit (SGLang's main),
    a wheel index's build by the wheel's URL for the target's machine: with `--extra-index-url`
    the installer takes the highest version on any index, which may be another build (vLLM's docs
    say so, and recommend the full URL)."""
    from patchctl.sources.git import GitSource

    engine, source = upstream.ref.engine, upstream.source
    if isinstance(source, GitSource):
        url = git_url(source.description)
        prefix = engine.layout_prefix("git").rstrip("/")
        requirement = f"{engine.dist} @ git+{url}@{source.commit}" + (f"#subdirectory={prefix}" if prefix else "")
        return PinnedBuild(requirement, upstream.version, "git", source.commit, f"git+{url}@{source.commit}")
    wheel = wheel_for_machine(upstream, python)
    prov = dict(source.provenance()._asdict())
    checked = getattr(source, "artifact", None)
    same = checked is not None and checked.filename == wheel.filename
    return PinnedBuild(
        f"{engine.dist} @ {wheel.url}",
        upstream.version,
        "wheel",
        commit_of(upstream.version),
        wheel.url,
        wheel.filename,
        wheel.sha256 or (prov.get("sha256") if same else None),
        prov.get("record_sha256") if same else None,
        prov.get("index"),
    )


class Build(Refusals):
    """A kind whose upstream is one build (a nightly, a commit's build): installed as resolved, its
    trees made from its own source, exported whole from its wheel (a git commit is not a package yet)."""

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        raise NotImplementedError

    def pin(self, ref: EngineRef, python: str, ctx: SourceContext) -> PinnedBuild:
        return pin_resolved(self.open(ref, ctx), python)

    def tree_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        return upstream.source

    def full_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        return wheel_or_refuse(upstream)


def wheel_or_refuse(upstream: Upstream) -> FileSource:
    """A build's wheel can be exported whole; a git commit cannot (it is not a package yet)."""
    from patchctl.sources.release import ReleaseSource

    if isinstance(upstream.source, ReleaseSource):
        return upstream.source
    raise UsageError(FULL_WHAT)


def git_url(url: str) -> str:
    """A repository as pip and uv take it after `git+`: a local path becomes a file://localhost/ URL
    (the packaging that pip 23 vendors refuses a PEP 508 URL without a host, file:///path)."""
    path = Path(url).expanduser()
    return "file://localhost" + path.resolve().as_posix() if path.exists() else url


def wheel_for_machine(upstream: Upstream, python: str) -> IndexFile:
    """The build's wheel for the target interpreter's machine (vLLM publishes x86_64 and aarch64)."""
    from patchctl.core.interpreter import machine_of

    wheels = [f for f in upstream.files if f.kind == "wheel" and not f.yanked]
    if len(wheels) == 1 or not wheels:
        if wheels:
            return wheels[0]
        raise UsageError(f"{upstream.label} has no wheel to install")
    machine = machine_of(python)  # its ELF header: the target interpreter is not run
    fitting = [f for f in wheels if "none-any" in f.tags or machine in f.tags]
    if not fitting:
        raise UsageError(f"{upstream.ref} has no wheel for {machine}: " + ", ".join(f.filename for f in wheels))
    return sorted(fitting, key=lambda f: ("none-any" in f.tags, f.filename))[0]
