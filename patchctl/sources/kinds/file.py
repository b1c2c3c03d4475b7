"""`ENGINE@file:PATH`: a wheel (.whl) or sdist (.tar.gz) on disk, e.g. vLLM built from source for
SM120 (`TORCH_CUDA_ARCH_LIST=12.0`). Read like a release's artifact (sources/release.py, each wheel
member checked against RECORD), never over the network; `apply --install` installs that very file."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

from patchctl.core import config
from patchctl.core.errors import UsageError
from patchctl.sources import scratch
from patchctl.sources.fetch import Upstream, commit_of, installer_index
from patchctl.sources.kinds import Parsed, PinnedBuild
from patchctl.sources.kinds.common import Refusals

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.files import FileSource
    from patchctl.sources.index import IndexFile
    from patchctl.sources.refs import EngineRef
    from patchctl.sources.release import ReleaseSource


class File(Refusals):
    name = "file"
    syntax = "'file:PATH' (a .whl or .tar.gz)"
    smoke_label = "file"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        if text is None or not text.startswith("file:"):
            return None
        if not text[5:]:
            raise UsageError(f"file: needs a wheel or sdist, e.g. {engine.name}@file:./dist/{engine.dist}-1.0.whl")
        return Parsed(path=os.path.expanduser(text[5:]))

    def suffix(self, ref: EngineRef) -> str:
        return f"@file:{ref.path}"

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        from patchctl.sources.release import ReleaseSource

        assert ref.path is not None  # parse gives every file ref its path
        artifact = local_artifact(ref.engine, Path(ref.path))
        source = ReleaseSource(
            ref.engine,
            artifact,
            config.cache_dir(),
            offline=True,
            progress=ctx.progress,
            whole=True,
            details={"path": str(Path(ref.path).resolve())},
            reason=f"{artifact.kind} on disk",
        )
        _adopt(source, Path(ref.path))
        version = ctx.version_override or artifact.version
        return Upstream(ref, version, source, f"{ref.engine.dist} {version} ({Path(ref.path).resolve()})")

    def pin(self, ref: EngineRef, python: str, ctx: SourceContext) -> PinnedBuild:
        assert ref.path is not None
        path = Path(ref.path).resolve()
        artifact = local_artifact(ref.engine, path)
        return PinnedBuild(
            str(path),
            artifact.version,
            "file",
            commit_of(artifact.version),
            path.as_uri(),
            artifact.filename,
            artifact.sha256,
            index_url=installer_index(ctx, ref.engine),
        )

    def tree_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        return upstream.source

    def full_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        return upstream.source


def local_artifact(engine: Engine, path: Path) -> IndexFile:
    """The file as the index would list it: its name's version and kind, and its sha256."""
    from patchctl.sources.index import IndexFile

    if not path.is_file():
        raise UsageError(f"{path} is not a file", hint="name a wheel (.whl) or an sdist (.tar.gz)")
    name, version, kind, tags = _parse_name(path.name)
    if canonicalize_name(name) != canonicalize_name(engine.dist):
        raise UsageError(f"{path.name} is a {name} artifact, not {engine.dist}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return IndexFile(path.name, path.resolve().as_uri(), digest.hexdigest(), path.stat().st_size, version, kind, tags, False)


def _parse_name(filename: str) -> tuple[str, Version, str, str]:
    try:
        if filename.endswith(".whl"):
            name, version, _build, tags = parse_wheel_filename(filename)
            return str(name), version, "wheel", ".".join(sorted(str(t) for t in tags))
        if filename.endswith(".tar.gz"):
            name, version = parse_sdist_filename(filename)
            return str(name), version, "sdist", ""
    except (InvalidWheelFilename, InvalidSdistFilename) as exc:
        raise UsageError(f"{filename}: {exc}") from None
    raise UsageError(f"{filename} is neither a wheel (.whl) nor an sdist (.tar.gz)")


def _adopt(source: ReleaseSource, path: Path) -> None:
    """Put the file where the source reads its whole artifact from (keyed by its sha256, which
    every read checks), so that the release reader serves it with no network: a copy, not a link,
    so that rebuilding the file in place cannot change what the cache vouches for."""
    target = source._full_file()  # noqa: SLF001  (the artifact cache's own slot for this artifact)
    if target.is_file():
        return
    source.cache.make_dirs(target.parent)
    source.cache.sweep(target.parent)
    with scratch.part_file(target) as part, open(path, "rb") as f:  # removed if interrupted
        shutil.copyfileobj(f, part.file, 1 << 20)
        part.publish(target)


FILE = File()
