"""EngineRef → the pristine upstream files of that version, wherever they come from."""
from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import InvalidVersion, Version

from patchctl import config
from patchctl.engines import NightlySource
from patchctl.errors import NetworkError, UsageError, plain_network_reason
from patchctl.sources.files import DirectorySource, FileSource, ProgressSink
from patchctl.sources.installed import version_of_tree
from patchctl.spec import EngineRef

if TYPE_CHECKING:
    from patchctl.sources.git import GitSource
    from patchctl.sources.index import IndexFile, PackageIndex
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
    # A wheel index build: every file the index lists for the version (one wheel per platform), so
    # that `apply --install` installs the one for the target's machine by its URL.
    files: tuple[IndexFile, ...] = ()


def release(ref_engine, version: Version, ctx: SourceContext, index: PackageIndex | None = None,
            prefer_sdist: bool = False) -> ReleaseSource:
    from patchctl.sources.release import ReleaseSource, choose

    index = index or ctx.index()
    cache = config.cache_dir()
    choice = choose(index.project(ref_engine.dist), version, prefer_sdist=prefer_sdist, cache_root=cache,
                    offline=ctx.offline)
    return ReleaseSource(ref_engine, choice.file, cache, offline=ctx.offline, progress=ctx.progress,
                         sparse=ctx.sparse, whole=choice.whole, reason=choice.reason)


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


def open_upstream_soon(ref: EngineRef, ctx: SourceContext) -> Callable[[], Upstream]:
    """open_upstream on a thread of its own, so that the caller's work runs while the network
    answers; the returned function waits for it and raises what it raised. A daemon thread: a
    caller that fails first (a damaged store) exits at once, not after the network's timeout."""
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["upstream"] = open_upstream(ref, ctx)
        except BaseException as exc:  # noqa: BLE001  (handed to the caller, which raises it)
            outcome["error"] = exc

    thread = threading.Thread(target=work, name="open-upstream", daemon=True)
    thread.start()

    def result() -> Upstream:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["upstream"]

    return result


def open_upstream(ref: EngineRef, ctx: SourceContext) -> Upstream:
    engine = ref.engine
    if ref.kind in ("exact", "latest"):
        index = ctx.index()
        version = latest_release(engine, ctx) if ref.kind == "latest" else ref.version
        source = release(engine, version, ctx, index)
        return Upstream(ref, version, source, f"{engine.dist} {version} ({source.artifact.filename})")
    if ref.kind == "nightly":
        return _nightly(ref, ctx)
    if ref.kind == "commit":
        return _commit(ref, ctx)
    if ref.kind == "git":
        from patchctl.sources.git import GitSource, open_repo  # GitPython: ~0.1 s, only for git refs

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
    """Where ENGINE@nightly comes from: --nightly-source > the config file > engines.yaml. For a wheel
    index the URL includes the variant folder (`nightly.<engine>.variant: cu130` → <url>/cu130)."""
    override = config.nightly_override(engine.name)
    kind = override.get("kind", engine.nightly.kind)
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


def _nightly_root(engine, flag: str | None) -> tuple[str, str | None]:
    """The wheel repository's root (the nightly URL less /nightly) and the variant, for commit:SHA."""
    override = config.nightly_override(engine.name)
    url = (flag or override.get("url") or engine.nightly.url or "").rstrip("/")
    if not url:
        raise UsageError(f"no nightly source is configured for {engine.name}", hint=nightly_hint(engine))
    root = url[: -len("/nightly")] if url.endswith("/nightly") else url
    return root, override.get("variant", engine.nightly.variant)


def nightly_hint(engine) -> str:
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


_COMMIT = re.compile(r"g([0-9a-f]{7,40})")


def commit_of(version: Version) -> str | None:
    """The commit a dev build names in its local version (0.23.1rc1.dev901+g2f3f441f8.cu130)."""
    for part in (version.local or "").split("."):
        m = _COMMIT.fullmatch(part)
        if m:
            return m.group(1)
    return None


def _same_commit(a: str | None, b: str) -> bool:
    return bool(a) and (a.startswith(b) or b.startswith(a))  # type: ignore[union-attr]


def _wheel_index_build(ref: EngineRef, ctx: SourceContext, url: str, what: str, commit: str | None = None) -> Upstream:
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.release import ReleaseSource, choose_artifact

    engine = ref.engine
    how = nightly_hint(engine)
    index = PackageIndex(url, config.cache_dir(), offline=ctx.offline, origin=what)
    try:
        project = index.project(engine.dist)
    except NetworkError as exc:
        raise NetworkError(f"{what} for {engine.name} ({url}) is unreachable: {plain_network_reason(exc.message)}",
                           hint=how) from None
    except UsageError as exc:  # 404: no such project page (a commit without builds, a wrong URL)
        raise UsageError(f"{what} for {engine.name} ({url}) has no {engine.dist} builds: {exc.message}",
                         hint=how) from None
    versions = project.versions(include_pre=True)
    if commit:
        versions = [v for v in versions if _same_commit(commit_of(v), commit)] or versions
    if not versions:
        raise UsageError(f"the {what} {url} lists no {engine.dist} builds", hint=how)
    version = versions[-1]
    artifact = choose_artifact(project, version)
    details = {"version": str(version), "commit": commit_of(version), "index": url}
    source = ReleaseSource(engine, artifact, config.cache_dir(), offline=ctx.offline, progress=ctx.progress,
                           details=details)
    return Upstream(ref, version, source, f"{engine.dist} {what} {version} ({artifact.filename})",
                    tuple(project.files_for(version)))


def _nightly(ref: EngineRef, ctx: SourceContext) -> Upstream:
    from patchctl.sources.git import GitSource, open_repo

    engine = ref.engine
    kind, url, branch = nightly_source(engine, ctx.nightly_source)
    assert url is not None  # nightly_source() raises when none is configured
    if kind == "wheel-index":
        return _wheel_index_build(ref, ctx, url, "nightly source")
    try:
        repo = open_repo(url, config.cache_dir(), offline=ctx.offline)
    except NetworkError as exc:
        raise NetworkError(f"nightly source for {engine.name} ({url}) is unreachable: "
                           f"{plain_network_reason(exc.message)}", hint=nightly_hint(engine)) from None
    source = GitSource(repo, branch, engine.layout_prefix("git"), url)
    version = ctx.version_override or _version_from_git(source, engine)
    return Upstream(ref, version, source, f"{engine.name} nightly {branch} ({source.provenance().description})")


def _commit(ref: EngineRef, ctx: SourceContext) -> Upstream:
    """ENGINE@commit:SHA: that commit's build on the wheel repository (<root>/<SHA>/), or for a git
    nightly source (SGLang) the commit itself."""
    engine = ref.engine
    sha = ref.git_ref or ""
    kind = config.nightly_override(engine.name).get("kind", engine.nightly.kind)
    if kind == "git" or (kind == "none" and (ctx.repo or engine.git_url)):
        return open_upstream(ref._replace(kind="git"), ctx)
    if kind != "wheel-index":
        raise UsageError(f"{engine.name} publishes no per-commit builds")
    root, variant = _nightly_root(engine, ctx.nightly_source)
    url = f"{root}/{sha}" + (f"/{variant}" if variant else "")
    upstream = _wheel_index_build(ref, ctx, url, f"commit {sha}", commit=sha)
    found = commit_of(upstream.version)
    if found and not _same_commit(found, sha):
        raise UsageError(f"{url} holds the build of commit {found}, not of {sha}")
    return upstream


def _version_from_git(source: GitSource, engine) -> Version:
    """A checkout's version as setuptools-scm computes it (SGLang and vLLM build theirs so): the nearest
    `v*` tag, exactly, at the tag; else the next version's dev build, `0.5.24.dev3+g<sha>` for 3 commits
    after v0.5.23. Without such a tag, the package's version.py, unless it holds setuptools-scm's
    fallback (0.0.0.dev0, which SGLang's main keeps there)."""
    version = _scm_version(source)
    if version is not None:
        return version
    for rel in (f"{engine.packages[0]}/version.py", f"{engine.packages[0]}/_version.py"):
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
    raise UsageError(f"cannot tell the version of {source.description} at {source.commit[:12]}: "
                     "no v* tag before it and no version in its version.py", hint="pass --as-version X.Y.Z")


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
    return Version(f"{_next_version(tag)}.dev{distance}+g{sha}")


def _next_version(tag: Version) -> str:
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
