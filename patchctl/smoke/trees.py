"""Whole pristine and patched package trees of a release, built once and cached by artifact hash
(the smoke tier imports the engine from them; `check` never needs them)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl.core import config
from patchctl.core.engines import Engine
from patchctl.core.errors import PatchFailed, UsageError
from patchctl.patching import evaluate
from patchctl.smoke import sealed
from patchctl.sources import archive, fetch
from patchctl.sources.cache import ArtifactCache
from patchctl.sources.files import DirectorySource, FileSource
from patchctl.sources.release import ReleaseSource
from patchctl.store.series import Patch

if TYPE_CHECKING:
    from patchctl.sources.git import GitSource


class Trees(NamedTuple):
    version: Version
    pristine: Path  # import root
    patched: Path
    artifact: str
    artifact_sha256: str
    result: evaluate.SeriesResult


TREE_FORMAT = "2"  # 2: file modes kept (vLLM ships some sources executable; git diffs record modes)


def pristine_tree(source: ReleaseSource) -> Path:
    # An index without hashes (vLLM's nightly wheels): the tree is keyed by the sha256 of the
    # artifact as fetched, so the whole artifact is downloaded (and RECORD-verified) first.
    key = source.artifact.sha256
    if key is None:
        source.sparse = False
        source.download_full()
        key = source.provenance().sha256
    cache = ArtifactCache(config.cache_dir())
    root = cache.tree(str(key)) / "pristine"
    head = f"format {TREE_FORMAT}\n"
    if sealed.usable(cache, root, head, _say):
        return root
    with cache.building(root):
        if sealed.usable(cache, root, head, _quiet):  # built by another process while this one waited
            return root
        source.sparse = False
        tmp = _fresh(cache, root.with_name(f"pristine.{os.getpid()}.tmp"))
        engine = source.engine
        wanted = tuple(p + "/" for p in engine.packages)
        with source.open_artifact() as f, archive.errors_named(source.artifact.filename):
            if archive.is_zip(f):
                archive.extract(f, tmp, lambda name: name if name.startswith(wanted) else None)
            else:
                archive.extract(
                    f, tmp, lambda name: inner if (inner := engine.sdist_member_path(name)) and inner.startswith(wanted) else None
                )
        sealed.seal(tmp, f"{head}{source.artifact.filename}\n")
        cache.remove(root)
        os.replace(tmp, root)
        sealed.require(cache, root, head)
    return root


def cached_pristine(cache: ArtifactCache, artifact: str) -> Path | None:
    """The pristine tree already built from the artifact of that file name (`vllm-0.16.0.tar.gz`), or
    None: for a tool that wants a release's own files without fetching (a peer's benchmark client)."""
    for root in sorted((cache.root / "trees").glob("*/pristine")):
        if sealed.untrusted(cache, root, f"format {TREE_FORMAT}\n{artifact}\n") is None:
            return root
    return None


def _say(text: str) -> None:
    """One line on stderr (stdout is the command's: with --json, one document)."""
    sys.stderr.write(f"smoke: {text}\n")
    sys.stderr.flush()


def _quiet(text: str) -> None:
    pass  # the same reason was said before the lock was taken


def _fresh(cache: ArtifactCache, tmp: Path) -> Path:
    cache.remove(tmp)
    cache.make_dirs(tmp)
    return tmp


_DEFAULT_OPTIONS = evaluate.Options()


def git_tree(source: GitSource, engine: Engine) -> Path:
    """The pristine tree of a git commit (SGLang main, ENGINE@git:REF): its packages exported with
    `git archive`, cached by commit (a commit names its content)."""
    cache = ArtifactCache(config.cache_dir())
    root = cache.tree(f"git-{source.commit}") / "pristine"
    head = f"format {TREE_FORMAT}\n"
    if sealed.usable(cache, root, head, _say):
        return root
    with cache.building(root):
        if sealed.usable(cache, root, head, _quiet):  # built by another process while this one waited
            return root
        tmp = _fresh(cache, root.with_name(f"pristine.{os.getpid()}.tmp"))
        paths = [f"{source.prefix}{p}" for p in engine.packages]
        exported = subprocess.run(
            ["git", "-C", source.repo.git_dir, "archive", "--format=tar", source.commit, *paths], capture_output=True
        )
        if exported.returncode != 0:
            cache.remove(tmp)
            raise UsageError(
                f"{source.description}@{source.commit[:12]}: cannot export "
                f"{', '.join(paths)}: {exported.stderr.decode(errors='replace').strip()[:300]}"
            )
        with archive.errors_named(f"git archive of {source.commit[:12]}"):
            archive.extract(
                io.BytesIO(exported.stdout),
                tmp,
                lambda name: name[len(source.prefix) :] if name.startswith(source.prefix) else None,
            )
        sealed.seal(tmp, f"{head}{source.description}@{source.commit}\n")
        cache.remove(root)
        os.replace(tmp, root)
        sealed.require(cache, root, head)
    return root


def build_trees(
    engine: Engine,
    version: Version,
    patches: tuple[Patch, ...],
    ctx: fetch.SourceContext,
    options: evaluate.Options = _DEFAULT_OPTIONS,
    upstream: fetch.Upstream | None = None,
) -> Trees:
    """upstream: the resolved ref, whose kind names the archive or commit the trees are built from
    (a release's sdist when it has one, a nightly's or a file's own wheel, a git commit); without
    one, the release `version` of the package index."""
    from patchctl.sources import registry
    from patchctl.sources.git import GitSource  # GitPython: imported only where a git ref is built

    if upstream is None:
        source: FileSource = fetch.release(engine, version, ctx, prefer_sdist=True)
    else:
        source = registry.kind_named(upstream.ref.kind).tree_source(upstream, ctx)
    # Two ways to hold a package tree: an archive (a wheel or an sdist) and a git commit.
    if isinstance(source, GitSource):
        pristine = git_tree(source, engine)
        return _with_patched(engine, version, patches, pristine, source.provenance().description, source.commit, options)
    assert isinstance(source, ReleaseSource)  # what every kind's tree_source gives but git's
    pristine = pristine_tree(source)
    return _with_patched(
        engine,
        version,
        patches,
        pristine,
        source.artifact.filename,
        source.artifact.sha256 or str(source.provenance().sha256),
        options,
    )


def _with_patched(
    engine: Engine,
    version: Version,
    patches: tuple[Patch, ...],
    pristine: Path,
    artifact: str,
    artifact_sha256: str,
    options: evaluate.Options,
) -> Trees:
    result = evaluate.evaluate(patches, version, DirectorySource(pristine), options=options)
    if not result.ok:
        bad = ", ".join(o.name for o in result.outcomes if o.outcome == "conflict")
        raise PatchFailed(f"cannot build the patched tree of {engine.name} {version}: {bad} do not apply")
    digest = hashlib.sha256(
        json.dumps([[c.path, hashlib.sha256(c.after or b"").hexdigest()] for c in result.changes]).encode()
    ).hexdigest()[:16]
    patched = pristine.parent / f"patched-{digest}"
    cache = ArtifactCache(config.cache_dir())
    head = f"format {TREE_FORMAT}\npatched {digest}\n"
    if not sealed.usable(cache, patched, head, _say):
        with cache.building(patched):
            if not sealed.usable(cache, patched, head, _quiet):  # another process may have built it meanwhile
                tmp = patched.with_name(f"{patched.name}.{os.getpid()}.tmp")
                cache.remove(tmp)
                shutil.copytree(pristine, tmp, symlinks=True)
                for change in result.changes:
                    file = tmp / change.path
                    if change.after is None:
                        file.unlink(missing_ok=True)
                    else:
                        file.parent.mkdir(parents=True, exist_ok=True)
                        file.write_bytes(change.after)
                sealed.seal(tmp, head)  # replaces the pristine tree's marker copytree brought along
                cache.remove(patched)
                os.replace(tmp, patched)
                sealed.require(cache, patched, head)
    return Trees(version, pristine, patched, artifact, artifact_sha256, result)
