"""Reading an image's layers: each layer (a tar, gzip-compressed or not) is streamed once, bottom to
top, as a container runtime stacks them (a later file replaces an earlier one, `.wh.NAME` deletes
NAME, `.wh..wh..opq` empties a folder of what lower layers put there), and only the files the
command needs are written out, into a staging folder that mirrors the image's paths: the engine's
dist-info METADATA, the `.patchctl/` record beside the engine's packages, and the files a filter
asks for. Nothing holds a layer in memory; the engine's import root is where its package and its
dist-info lie side by side."""

from __future__ import annotations

import email
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import InvalidVersion, Version

from patchctl.core.errors import BlobMismatch, ImageContentError
from patchctl.image.manifest import Layer
from patchctl.image.registry import Repository

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.files import ProgressSink

from patchctl.image.stack import MAX_FILE, MAX_STAGED, OPAQUE, WHITEOUT, Meta, Stack, Staged, Want, clean_name

__all__ = ["MAX_FILE", "MAX_STAGED", "OPAQUE", "WHITEOUT", "Meta", "Staged", "Want", "clean_name", "read_layers"]

_DIST_INFO = re.compile(r"(?P<root>(?:.*/)?)(?P<name>[^/]+)-(?P<version>[^/-]+)\.dist-info/METADATA")


class Found(NamedTuple):
    """The engine's tree in an image."""

    root: str  # its import root inside the image: usr/lib/python3.11/site-packages/
    local: Path  # the same folder under the staging folder
    version: Version


Wanted = Callable[[str], bool]


def read_layers(
    repo: Repository,
    layers: Iterable[Layer],
    wanted: Want | Wanted,
    folder: Path,
    progress: ProgressSink | None = None,
    *,
    own: Iterable[int] = (),
) -> Staged:
    """Stream every layer, in order, and write the files `wanted` accepts under folder. Every blob is
    hashed against its digest as it streams, and nothing read out of it is used before that holds.
    own: the indexes (into layers) of patchctl's own layers, whose whiteouts are what apply removed.
    A copy in the download cache found damaged is dropped and fetched once more."""
    want = wanted if isinstance(wanted, Want) else Want(wanted)
    layers = list(layers)
    ours = frozenset(own)
    for attempt in (1, 2):
        try:
            return Stack(folder, want, ours).read(repo, layers, progress)
        except BlobMismatch as exc:
            if attempt == 2 or not repo.forget(exc.digest):
                raise
            shutil.rmtree(folder, ignore_errors=True)
    raise AssertionError("unreachable: the second attempt returns or raises")


# --- what to read, for an engine --------------------------------------------------------------


def engine_filter(engine: Engine, relative: Callable[[str], bool], protected: Callable[[str], bool] | None = None) -> Want:
    """The image paths under any folder holding the engine's packages whose path relative to that
    folder `relative` accepts, the engine's dist-info METADATA and its `.patchctl/` record; of those,
    the ones `protected` accepts (the files the series patches) may not be deleted by a whiteout,
    nor may the engine's package folder while its dist-info stays."""
    packages = tuple(engine.packages)
    patterns = tuple(f"/{p}/" for p in packages)
    record = (f"/.patchctl/{engine.name}/",)

    def dist_info_root(name: str) -> str | None:
        if not name.endswith(".dist-info/METADATA"):
            return None
        match = _DIST_INFO.fullmatch(name)
        return match["root"] if match is not None and _normal(match["name"]) == engine.dist else None

    def matches(name: str, accept: Callable[[str], bool]) -> bool:
        padded = f"/{name}"
        for pattern in patterns:
            at = padded.find(pattern)
            while at >= 0:
                if accept(padded[at + 1 :]):
                    return True
                at = padded.find(pattern, at + 1)
        return False

    def wanted(name: str) -> bool:
        if name.endswith(".dist-info/METADATA"):
            return dist_info_root(name) is not None
        padded = f"/{name}"
        if padded.endswith("/.patchctl/.gitignore") or any(r in padded for r in record):
            return True
        return matches(name, relative)

    def protect(name: str) -> bool:
        return protected is not None and matches(name, protected)

    return Want(wanted, protect, packages, dist_info_root)


def with_bytecode(paths: Iterable[str]) -> Callable[[str], bool]:
    """The paths, and the __pycache__ files of each (apply replaces or removes them with the source)."""
    exact = set(paths)
    caches: dict[str, set[str]] = {}
    for p in exact:
        folder, _, base = p.rpartition("/")
        cache = f"{folder}/__pycache__/" if folder else "__pycache__/"
        caches.setdefault(cache, set()).add(base.rsplit(".", 1)[0] + ".")

    def relative(rel: str) -> bool:
        if rel in exact:
            return True
        folder, _, base = rel.rpartition("/")
        stems = caches.get(folder + "/")
        return stems is not None and any(base.startswith(s) for s in stems)

    return relative


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def find_engine(staged: Staged, engine: Engine) -> Found:
    """The one import root holding the engine's dist-info; ImageContentError when none or several."""
    roots: dict[str, Version] = {}
    for name in staged.files:
        match = _DIST_INFO.fullmatch(name)
        if match is None or _normal(match["name"]) != engine.dist:
            continue
        text = (staged.folder / name).read_text(errors="replace")
        raw = email.message_from_string(text).get("Version") or match["version"]
        try:
            roots[match["root"]] = Version(raw)
        except InvalidVersion:
            raise ImageContentError(f"{name} says version {raw[:40]!r}, not a PEP 440 version") from None
    if not roots:
        raise ImageContentError(f"no {engine.dist} is installed in the image (no {engine.dist} dist-info in any layer)")
    if len(roots) > 1:
        where = ", ".join(f"/{r} ({v})" for r, v in sorted(roots.items()))
        raise ImageContentError(
            f"the image holds {engine.dist} in {len(roots)} places: {where}",
            hint="patchctl patches one tree per image; remove the stale one in the image",
        )
    root, version = next(iter(roots.items()))
    local = staged.folder / root
    for package in engine.packages:
        (local / package).mkdir(parents=True, exist_ok=True)
    return Found(root, local, version)


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder (the few read out of the image), by path relative to it:
    what apply changed is what differs afterwards."""
    out = {}
    for dirpath, _, names in os.walk(folder):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                out[p.relative_to(folder).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out
