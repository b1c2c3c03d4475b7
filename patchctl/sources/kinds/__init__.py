"""The seam every kind of upstream plugs into (`ENGINE@nightly`, `@git:REF`, `@file:PATH` ...).

A kind is one module in this package holding one object that satisfies `UpstreamKind`, and one
registration line in `patchctl/sources/registry.py`. Nothing else branches on a kind's name: `spec`
parses and prints refs through it, `open_upstream` is one lookup, `apply --install` asks it for the
build to install, `smoke` and `export --full` for the archive or commit to build a tree from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

from packaging.version import Version

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext, Upstream
    from patchctl.sources.files import FileSource
    from patchctl.sources.refs import EngineRef


class Parsed(NamedTuple):
    """What a kind read from the text after `@`: EngineRef's fields beside its kind."""

    version: Version | None = None  # an exact release
    git_ref: str | None = None  # a git ref; the commit of `commit:SHA`
    path: str | None = None  # a directory or an artifact on disk


class PinnedBuild(NamedTuple):
    """Exactly one build for `apply --install`: the installer's requirement and what the installed
    dist-info must say afterwards; the rest is kept in the state record (tree/bookkeeping/record.BuildRecord)."""

    requirement: str  # vllm==0.23.0, vllm @ https://…whl, sglang @ git+URL@SHA#subdirectory=python, /abs/x.whl
    version: Version
    kind: str  # BuildRecord.kind: release, wheel, git, file
    commit: str | None = None
    url: str | None = None
    artifact: str | None = None
    sha256: str | None = None
    record_sha256: str | None = None
    index_url: str | None = None  # the index page the build was resolved from (a nightly's)


class UpstreamKind(Protocol):
    """One kind of upstream."""

    @property
    def name(self) -> str:
        """`EngineRef.kind`, and what the JSON documents say (`spec`)."""

    @property
    def syntax(self) -> str:
        """How it is written after `@`, for messages: `'git:REF'`."""

    @property
    def smoke_label(self) -> str | None:
        """The smoke document's `source.kind`; None: no smoke trees can be built from it."""

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        """The ref's fields when `text` (after `@`; None: there is no `@`) is written in this kind's
        syntax, else None. Raises UsageError for text that is this kind's but malformed (`git:`
        with no ref)."""

    def suffix(self, ref: EngineRef) -> str:
        """What follows the engine's name in `str(ref)`: the inverse of parse."""

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        """Resolve the ref to its version and the FileSource of its pristine files."""

    def pin(self, ref: EngineRef, python: str, ctx: SourceContext) -> PinnedBuild:
        """The one build `apply --install` installs; UsageError when this kind cannot be installed."""

    def tree_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        """The archive or commit smoke trees are built from; UsageError when there is none."""

    def full_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        """What `export --full` copies the whole package from; UsageError when it cannot."""
