"""Paths that must stay inside a root: the one check every reader and writer of a tree uses
(the tree's bookkeeping, a directory source, an archive being unpacked); and the one rule of which
files of a tree a patch may touch (`outside_packages`)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from patchctl.core.errors import StoreError


def outside_packages(paths: Iterable[str], packages: Iterable[str]) -> list[str]:
    """The paths (relative to the import root) that are not files inside one of the engine's
    `packages` (engines.yaml): a `.pth` beside them runs code at every interpreter start, a dist-info
    or another distribution's files are not the engine's. The one outside-package rule: variants
    (patching.evaluate), every tree write (tree.target.check_paths) and every path a record or
    journal names (tree.bookkeeping) ask it."""
    packages = tuple(packages)
    return [p for p in paths if "/" not in p or p.split("/", 1)[0] not in packages]


def resolve_inside(root: Path, path: str) -> Path:
    """root/path, refusing anything that escapes root: `..`, absolute paths, escaping symlinks."""
    if os.path.isabs(path) or ".." in Path(path).parts:
        raise StoreError(f"refusing path {path!r}: it leaves the engine root")
    real_root = root.resolve()
    candidate = real_root / path
    # Resolve each existing ancestor: a symlinked directory inside the tree may point outside it.
    resolved = candidate.resolve()
    if resolved != real_root and real_root not in resolved.parents:
        raise StoreError(f"refusing path {path!r}: it resolves to {resolved}, outside {real_root}")
    return candidate
