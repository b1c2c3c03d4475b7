"""`ENGINE@git:REF`: a commit of the engine's repository (--repo, else engines.yaml's git_url), and
how a checkout's version is told when no metadata says it (setuptools-scm's rules)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from patchctl.core import config
from patchctl.core.errors import UsageError
from patchctl.sources.fetch import Upstream
from patchctl.sources.kinds import Parsed, PinnedBuild
from patchctl.sources.kinds.common import Refusals, pin_resolved

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.files import FileSource
    from patchctl.sources.git import GitSource
    from patchctl.sources.refs import EngineRef


class Git(Refusals):
    name = "git"
    syntax = "'git:REF'"
    smoke_label = "git"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        if text is None or not text.startswith("git:"):
            return None
        if not text[4:]:
            raise UsageError(f"git: needs a ref, e.g. {engine.name}@git:main")
        return Parsed(git_ref=text[4:])

    def suffix(self, ref: EngineRef) -> str:
        return f"@git:{ref.git_ref}"

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        from patchctl.sources.git import GitSource, open_repo  # GitPython: ~0.1 s, only for git refs

        engine = ref.engine
        repo_url = ctx.repo or engine.git_url
        if not repo_url:
            raise UsageError(f"{engine.name} has no known git repository: pass --repo URL|PATH")
        repo = open_repo(repo_url, config.cache_dir(), offline=ctx.offline)
        assert ref.git_ref is not None  # parse gives every git ref its ref
        source = GitSource(repo, ref.git_ref, engine.layout_prefix("git"), repo_url)
        version = ctx.version_override or version_of_checkout(source, engine)
        return Upstream(ref, version, source, f"{engine.name} {ref.git_ref} ({source.provenance().description})")

    def pin(self, ref: EngineRef, python: str, ctx: SourceContext) -> PinnedBuild:
        return pin_resolved(self.open(ref, ctx), python)

    def tree_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        return upstream.source


def version_of_checkout(source: GitSource, engine: Engine) -> Version:
    """A checkout's version as setuptools-scm computes it (SGLang and vLLM build theirs so): the nearest
    `v*` tag, exactly, at the tag; else the next version's dev build, `0.5.24.dev3+g<sha>` for 3 commits
    after v0.5.23. Without such a tag, the version file engines.yaml names, unless it holds
    setuptools-scm's fallback (0.0.0.dev0, which SGLang's main keeps there)."""
    version = _scm_version(source)
    if version is not None:
        return version
    for rel in engine.version_paths():
        data = source.read(rel)
        if data:
            m = re.search(rb"""__version__\s*=\s*['"]([^'"]+)['"]""", data)
            if m:
                try:
                    found = Version(m.group(1).decode())
                except InvalidVersion:
                    continue
                if any(found.release):  # 0.0.0.dev0 is a placeholder, not a version
                    return found
    raise UsageError(
        f"cannot tell the version of {source.description} at {source.commit[:12]}: "
        "no v* tag before it and no version in its version file",
        hint="pass --as-version X.Y.Z",
    )


def _scm_version(source: GitSource) -> Version | None:
    try:
        described = source.repo.git.describe("--tags", "--long", "--abbrev=40", "--match", "v[0-9]*", source.commit)
    except Exception:  # no such tag
        return None
    # setuptools-scm (its vcs-versioning backend) cuts the node to 10 characters, "g" included: 9 hex
    # digits, as in vLLM's published nightlies (0.23.1rc1.dev901+g2f3f441f8), whatever git's own
    # abbreviation would be.
    m = re.fullmatch(r"v(.+)-(\d+)-g([0-9a-f]{9})[0-9a-f]*", described.strip())
    if not m:
        return None
    try:
        tag = Version(m.group(1))
    except InvalidVersion:
        return None
    distance, sha = int(m.group(2)), m.group(3)
    if distance == 0:
        return tag
    return Version(f"{next_version(tag)}.dev{distance}+g{sha}")


def next_version(tag: Version) -> str:
    """setuptools-scm's guess-next-dev: 0.5.23 → 0.5.24, 0.5.10rc0 → 0.5.10rc1, 1.0.dev3 → 1.0."""
    epoch = f"{tag.epoch}!" if tag.epoch else ""
    release = ".".join(str(p) for p in tag.release)
    if tag.dev is not None and tag.pre is None and tag.post is None:
        return epoch + release
    if tag.pre is not None:
        return f"{epoch}{release}{tag.pre[0]}{tag.pre[1] + 1}"
    parts = list(tag.release)
    parts[-1] += 1
    return epoch + ".".join(str(p) for p in parts)


GIT = Git()
