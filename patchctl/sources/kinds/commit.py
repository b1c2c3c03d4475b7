"""`ENGINE@commit:SHA` (7 to 40 hex digits): one upstream commit's build. On a wheel index whose
engine names a `commit_layout` in engines.yaml, that commit's own wheels (vLLM's `<root>/<SHA>/`);
for a git nightly source (SGLang) the commit itself, as `git:SHA`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from patchctl.core.errors import UsageError
from patchctl.sources.fetch import commit_of, same_commit
from patchctl.sources.kinds import Parsed
from patchctl.sources.kinds.common import Build
from patchctl.sources.kinds.git import GIT
from patchctl.sources.kinds.nightly import nightly_kind, nightly_root, wheel_index_build

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext, Upstream
    from patchctl.sources.refs import EngineRef

_SHA = re.compile(r"[0-9a-f]{7,40}")


class Commit(Build):
    name = "commit"
    syntax = "'commit:SHA'"
    smoke_label = "commit"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        if text is None or not text.startswith("commit:"):
            return None
        sha = text[7:].lower()
        if not _SHA.fullmatch(sha):
            raise UsageError(f"commit: needs a commit hash of 7 to 40 hex digits, e.g. {engine.name}@commit:2f3f441f8")
        return Parsed(git_ref=sha)

    def suffix(self, ref: EngineRef) -> str:
        return f"@commit:{ref.git_ref}"

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        engine = ref.engine
        sha = ref.git_ref or ""
        kind = nightly_kind(engine)
        if kind == "git" or (kind == "none" and (ctx.repo or engine.git_url)):
            return GIT.open(ref._replace(kind="git"), ctx)
        layout = engine.nightly.commit_layout
        if kind != "wheel-index" or not layout:
            raise UsageError(f"{engine.name} publishes no per-commit builds")
        root, variant = nightly_root(engine, ctx.nightly_source)
        url = layout.format(root=root, commit=sha) + (f"/{variant}" if variant else "")
        upstream = wheel_index_build(ref, ctx, url, f"commit {sha}", commit=sha)
        found = commit_of(upstream.version)
        if found and not same_commit(found, sha):
            raise UsageError(f"{url} holds the build of commit {found}, not of {sha}")
        return upstream


COMMIT = Commit()
