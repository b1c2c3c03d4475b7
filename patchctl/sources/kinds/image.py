"""`ENGINE@image:REF` (a registry image `REGISTRY/REPO:TAG`, or `oci:DIR:TAG`): the engine tree
installed in a container image, read from its layers without a container daemon. Read-only: it
is checked (`check`, `list`), never installed, smoke-tested or exported whole; writing an image is
`apply --image REF --to REF2`.

Opening it streams the layers once for the engine's dist-info (the version); the files a series
needs are then read out of the same layers, which are cached by digest, so nothing is downloaded
twice. An index is read for the first platform whose image holds the engine."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from patchctl.core.errors import ImageContentError
from patchctl.sources.fetch import Upstream
from patchctl.sources.files import Provenance
from patchctl.sources.kinds import Parsed
from patchctl.sources.kinds.common import Refusals

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.image.manifest import Image, Layer
    from patchctl.image.registry import Repository
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.refs import EngineRef

PREFIX = "image:"


class ImageFiles:
    """The engine's files in one platform's image, read out of its layers on demand."""

    def __init__(self, repo: Repository, image: Image, engine: Engine, root: str, description: str):
        from patchctl.image.manifest import layers_of, patchctl_layers

        self._repo = repo
        self._layers: list[Layer] = layers_of(image.doc)
        self._own = patchctl_layers(image.config)
        self._engine = engine
        self._root = root
        self._description = description
        self._folder = tempfile.TemporaryDirectory(prefix="patchctl-image-")
        self._read: set[str] = set()
        self.digest = image.manifest.digest

    def prefetch(self, paths: Iterable[str]) -> None:
        from patchctl.image import layers as L

        wanted = {p for p in paths if p not in self._read}
        if not wanted:
            return
        root = self._root
        full = {root + p for p in wanted}
        # Each file asked for is one a patch touches: a whiteout deleting it, or a FIFO, a device or a
        # link in its place, is damage (exit 3), never a file that is not there.
        L.read_layers(
            self._repo,
            self._layers,
            L.Want(full.__contains__, full.__contains__),
            Path(self._folder.name) / "files",
            own=self._own,
        )
        self._read |= wanted

    def read(self, path: str) -> bytes | None:
        from patchctl.core.paths import resolve_inside

        self.prefetch([path])
        file = resolve_inside(Path(self._folder.name) / "files", self._root + path)
        return file.read_bytes() if file.is_file() and not file.is_symlink() else None

    def provenance(self) -> Provenance:
        return Provenance("image", self._description, self.digest.removeprefix("sha256:"))


def open_image(text: str, engine: Engine, ctx: SourceContext) -> tuple[ImageFiles, str, str]:
    """(its files, the engine's version as its dist-info says, the platform)."""
    from patchctl.image import layers as L
    from patchctl.image import manifest as M
    from patchctl.image.reference import parse_reference
    from patchctl.image.repository import open_repository

    ref = parse_reference(text)
    repo = open_repository(ref, progress=ctx.progress)
    top = repo.manifest(ref.target)
    if M.media_type_of(top) in M.MANIFESTS:
        candidates = [M.load_image(repo, top)]
    else:
        candidates = [
            M.load_image(repo, repo.manifest(e["digest"])) for e in M.platform_manifests(M.parse(top)) if not M.is_attestation(e)
        ]
    missing = []
    for image in candidates:
        with tempfile.TemporaryDirectory(prefix="patchctl-image-") as folder:
            staged = L.read_layers(
                repo,
                M.layers_of(image.doc),
                L.engine_filter(engine, lambda rel: False),
                Path(folder),
                ctx.progress,
                own=M.patchctl_layers(image.config),
            )
            try:
                found = L.find_engine(staged, engine)
            except ImageContentError as exc:
                missing.append(f"{image.platform}: {exc.message}")
                continue
        return ImageFiles(repo, image, engine, found.root, f"{ref} {image.platform}"), str(found.version), image.platform
    raise ImageContentError(f"{ref}: " + "; ".join(missing))


class ImageKind(Refusals):
    name = "image"
    syntax = "image:REF"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        if text is None or not text.startswith(PREFIX):
            return None
        from patchctl.image.reference import parse_reference

        rest = text[len(PREFIX) :]
        parse_reference(rest)  # a malformed reference is exit 2 here, before anything is fetched
        return Parsed(path=rest)

    def suffix(self, ref: EngineRef) -> str:
        return f"@{PREFIX}{ref.path}"

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        from packaging.version import Version

        assert ref.path is not None  # parse gives every image ref its reference
        files, version, platform = open_image(ref.path, ref.engine, ctx)
        found = Version(version)
        return Upstream(ref, found, files, f"{ref.engine.name} {found} (image {ref.path}, {platform})")


IMAGE = ImageKind()
