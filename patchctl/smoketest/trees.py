"""Whole pristine and patched package trees of a release, built once and cached by artifact hash
(the smoke tier imports the engine from them; `check` never needs them)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl import config
from patchctl.atomic import write_atomic
from patchctl.engines import Engine
from patchctl.errors import PatchFailed, UsageError
from patchctl.patching import evaluate
from patchctl.smoketest.envs import building
from patchctl.sources import fetch
from patchctl.sources.files import DirectorySource
from patchctl.sources.release import ReleaseSource
from patchctl.store import Patch

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
    root = config.cache_dir() / "trees" / str(key) / "pristine"
    if _complete(root):
        return root
    with building(root):
        if not _complete(root):  # another process may have built it while this one waited
            _extract_release(source, root)
    return root


def _complete(root: Path) -> bool:
    marker = root / ".complete"
    return marker.is_file() and marker.read_text().startswith(f"format {TREE_FORMAT}\n")


def _extract_release(source: ReleaseSource, root: Path) -> None:
    source.sparse = False
    archive = source.download_full()
    tmp = root.with_name(f"pristine.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    engine = source.engine
    wanted = tuple(p + "/" for p in engine.packages)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if info.filename.startswith(wanted) and not info.filename.endswith("/"):
                    extracted = zf.extract(info, tmp)
                    mode = (info.external_attr >> 16) & 0o777
                    if mode:
                        os.chmod(extracted, mode)
    else:
        with tarfile.open(archive) as tf:
            _extract_tar(tf, tmp, lambda name: (inner if (inner := engine.sdist_member_path(name))
                                                and inner.startswith(wanted) else None))
    write_atomic(tmp / ".complete", f"format {TREE_FORMAT}\n{source.artifact.filename}\n".encode())
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


def _extract_tar(tf: tarfile.TarFile, dest_root: Path, path_of: Callable[[str], str | None]) -> None:
    """Every regular file whose member name path_of maps to a path (relative to dest_root), with
    its mode (vLLM ships some sources executable; git diffs record modes)."""
    for member in tf:
        inner = path_of(member.name) if member.isfile() else None
        if not inner:
            continue
        dest = dest_root / inner
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tf.extractfile(member) as src, open(dest, "wb") as out:  # type: ignore[union-attr]
            shutil.copyfileobj(src, out)
        os.chmod(dest, member.mode & 0o777)


_DEFAULT_OPTIONS = evaluate.Options()


def git_tree(source: GitSource, engine: Engine) -> Path:
    """The pristine tree of a git commit (SGLang main, ENGINE@git:REF): its packages exported with
    `git archive`, cached by commit (a commit names its content)."""
    root = config.cache_dir() / "trees" / f"git-{source.commit}" / "pristine"
    if (root / ".complete").is_file():
        return root
    with building(root):
        if not (root / ".complete").is_file():
            _export_git(source, engine, root)
    return root


def _export_git(source: GitSource, engine: Engine, root: Path) -> None:
    tmp = root.with_name(f"pristine.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    paths = [f"{source.prefix}{p}" for p in engine.packages]
    archive = subprocess.run(["git", "-C", source.repo.git_dir, "archive", "--format=tar", source.commit, *paths],
                             capture_output=True)
    if archive.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UsageError(f"{source.description}@{source.commit[:12]}: cannot export "
                         f"{', '.join(paths)}: {archive.stderr.decode(errors='replace').strip()[:300]}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tf:
        _extract_tar(tf, tmp, lambda name: name[len(source.prefix):] if name.startswith(source.prefix) else None)
    write_atomic(tmp / ".complete", f"format {TREE_FORMAT}\n{source.description}@{source.commit}\n".encode())
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


def build_trees(engine: Engine, version: Version, patches: tuple[Patch, ...], ctx: fetch.SourceContext,
                options: evaluate.Options = _DEFAULT_OPTIONS, upstream: fetch.Upstream | None = None) -> Trees:
    """upstream: a resolved nightly, commit or git ref (its own wheel or commit); a release's
    trees are built from its sdist when it has one."""
    from patchctl.sources.git import GitSource  # GitPython: imported only where a git ref is built

    if upstream is not None and isinstance(upstream.source, GitSource):
        pristine = git_tree(upstream.source, engine)
        provenance = upstream.source.provenance()
        return _with_patched(engine, version, patches, pristine, provenance.description,
                             upstream.source.commit, options)
    if upstream is not None and isinstance(upstream.source, ReleaseSource):
        source = upstream.source
    elif upstream is not None:
        raise UsageError(f"{upstream.label}: smoke checks need a release, a nightly, a commit or a git ref")
    else:
        source = fetch.release(engine, version, ctx, prefer_sdist=True)
    pristine = pristine_tree(source)
    return _with_patched(engine, version, patches, pristine, source.artifact.filename,
                         source.artifact.sha256 or str(source.provenance().sha256), options)


def _with_patched(engine: Engine, version: Version, patches: tuple[Patch, ...], pristine: Path, artifact: str,
                  artifact_sha256: str, options: evaluate.Options) -> Trees:
    result = evaluate.evaluate(patches, version, DirectorySource(pristine), options=options)
    if not result.ok:
        bad = ", ".join(o.name for o in result.outcomes if o.outcome == "conflict")
        raise PatchFailed(f"cannot build the patched tree of {engine.name} {version}: {bad} do not apply")
    digest = hashlib.sha256(json.dumps(
        [[c.path, hashlib.sha256(c.after or b"").hexdigest()] for c in result.changes]).encode()).hexdigest()[:16]
    patched = pristine.parent / f"patched-{digest}"
    if not (patched / ".complete").is_file():
        with building(patched):
            if not (patched / ".complete").is_file():
                _write_patched(pristine, patched, result)
    return Trees(version, pristine, patched, artifact, artifact_sha256, result)


def _write_patched(pristine: Path, patched: Path, result: evaluate.SeriesResult) -> None:
    tmp = patched.with_name(f"{patched.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(pristine, tmp, symlinks=True)
    for change in result.changes:
        file = tmp / change.path
        if change.after is None:
            file.unlink(missing_ok=True)
        else:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(change.after)
    shutil.rmtree(patched, ignore_errors=True)
    os.replace(tmp, patched)
