"""Paths that must stay inside a root: the one check every reader and writer of a tree uses
(the tree's bookkeeping, a directory source, an archive being unpacked)."""
from __future__ import annotations

import os
from pathlib import Path

from patchctl.errors import StoreError


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
