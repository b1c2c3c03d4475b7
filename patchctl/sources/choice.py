"""Which artifact of a release to read, and how: a big wheel by range reads, or a small sdist or
wheel in one GET, by the bytes each would cost (round trips counted as bytes); and the tail of a wheel
its file list needed last time (<cache>/tails/), which makes that estimate (split out of release.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from patchctl.core.errors import UsageError
from patchctl.core.yamlio import load_json
from patchctl.sources.cache import ArtifactCache, Damaged
from patchctl.sources.index import IndexFile, IndexProject
from patchctl.sources.zipread import tail_guess

if TYPE_CHECKING:
    from packaging.version import Version

# A wheel's central directory as the cache keeps it (cache.framed, as the members are).
CENTRAL_DIRECTORY_FILE = "central-directory.bin"

# A round trip, in bytes it could have carried instead: 20 ms at ~12 MB/s. Range reads take two more
# than one whole GET (the tail, then the members), and start more connections.
ROUND_TRIP_BYTES = 256 << 10
MEMBERS_GUESS = 64 << 10  # what a series' members take deflated (vLLM 0.23.0's: ~70 KB)


class ArtifactChoice(NamedTuple):
    file: IndexFile
    whole: bool  # fetched in one GET (False: range reads of a wheel)
    reason: str  # for the document: why this artifact, and how it is read


def choose_artifact(project: IndexProject, version: Version, prefer_sdist: bool = False) -> IndexFile:
    return choose(project, version, prefer_sdist=prefer_sdist).file


def choose(
    project: IndexProject,
    version: Version,
    *,
    prefer_sdist: bool = False,
    cache_root: Path | None = None,
    installable: bool = False,
    offline: bool = False,
) -> ArtifactChoice:
    """The artifact that costs the fewest bytes (round trips counted as bytes) for what is wanted.
    A few files (check, apply): a big wheel by range reads, or a small sdist or wheel in one GET when
    that is cheaper (vllm-gguf-plugin: a 115 KB sdist against a 6.4 MB wheel's ~80 KB of ranges and
    two more round trips). A whole tree (prefer_sdist): the sdist (vLLM's is 36 MB against a 274 MB
    wheel, with the same Python sources). `installable`: a wheel (compiled parts included), whole."""
    candidates = project.files_for(version)
    # A wheel without an index hash is still verifiable (its RECORD); an sdist is not.
    files = [f for f in candidates if f.sha256 or f.kind == "wheel"]
    if not files:
        known = project.versions(include_pre=True)
        near = ", ".join(str(v) for v in known[-5:]) or "none"
        unusable = (
            (
                "; it lists only sdists without a sha256, which patchctl cannot verify (no RECORD): "
                + ", ".join(f.filename for f in candidates)
            )
            if candidates
            else ""
        )
        raise UsageError(
            f"{project.name} {version} is not on the package index {project.index_url} (newest there: {near}){unusable}"
        )

    def rank(f: IndexFile) -> tuple[int, int, int, int]:
        hashed = 0 if f.sha256 else 1  # (releases: every file is hashed, so the order is as before)
        if prefer_sdist and f.kind == "sdist":
            return (hashed, -1, 0, f.size or 0)
        if f.kind == "wheel":
            pure = "none-any" in f.tags
            x86 = "x86_64" in f.tags
            return (hashed, 0, 0 if pure else (1 if x86 else 2), f.size or 0)
        return (hashed, 1, 0, f.size or 0)

    ranked = sorted(files, key=rank)
    first = ranked[0]
    if prefer_sdist:
        return ArtifactChoice(first, True, f"{first.kind}, whole: a whole tree is wanted")
    if installable or first.kind != "wheel":
        why = "the installable artifact" if installable and first.kind == "wheel" else "no usable wheel"
        return ArtifactChoice(first, True, f"{first.kind}, whole: {why}")
    # Offline, what an earlier run read is what there is. Online the choice must not depend on this
    # machine's cache: the matrix records the artifact, and another machine must read the same one.
    if cache_root is not None and offline:
        cache = ArtifactCache(cache_root)
        for f in (first, *(f for f in ranked if f.kind == "sdist")):
            if f.sha256 and _cached(cache, cache.verified(f.sha256) / "artifact"):
                return ArtifactChoice(f, True, f"{f.kind}, whole: already in the cache")
            if f is first and f.sha256 and _cached(cache, cache.unverified(f.url, f.sha256) / CENTRAL_DIRECTORY_FILE):
                return ArtifactChoice(f, False, "wheel by range reads: its file list is already in the cache")
    measured = tail_estimate(cache_root, project.name, version) if cache_root else None
    ranges = min(first.size, tail_guess(first.size, measured)) + MEMBERS_GUESS + 2 * ROUND_TRIP_BYTES if first.size else None
    options = [(f.size, f) for f in ranked if f.size and f.sha256 and (f.kind == "sdist" or f is first)]
    cheapest = min(options, key=lambda o: o[0], default=None)
    if ranges is None or (cheapest is not None and cheapest[0] <= ranges):
        if cheapest is None:
            return ArtifactChoice(first, False, "wheel by range reads: the index gives no size to compare")
        size, f = cheapest
        return ArtifactChoice(
            f,
            True,
            f"{f.kind}, whole: {_mb(size)} in one request costs less than range "
            f"reads of {first.filename} (~{_mb(ranges)} counting round trips)",
        )
    others = [f"{f.kind} {_mb(size)}" for size, f in options if f is not first]
    return ArtifactChoice(
        first,
        False,
        f"wheel by range reads: ~{_mb(ranges)} counting round trips"
        + (f", against {', '.join(others)} whole" if others else "")
        + f" ({_mb(first.size)} wheel)",
    )


def _mb(n: int | None) -> str:
    return "? MB" if n is None else (f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} KB")


def tail_estimate(cache_root: Path, project: str, version: Version) -> int | None:
    """The tail a wheel of `project` needed last (the release nearest below `version`, else above):
    kept in <cache>/tails/<project>.json by every central directory read."""
    needs = _read_tails(cache_root, project)
    if not needs:
        return None
    below = [(v, n) for v, n in needs.items() if v <= version]
    if below:
        return max(below)[1]
    return min(needs.items())[1]


def _cached(cache: ArtifactCache, path: Path) -> bool:
    try:
        return cache.exists(path)
    except Damaged:
        return False


def _read_tails(cache_root: Path, project: str) -> dict:
    from packaging.version import InvalidVersion, Version

    try:
        raw = load_json(ArtifactCache(cache_root).read_file(ArtifactCache(cache_root).tails(project)) or b"")
    except (OSError, ValueError, RecursionError, Damaged):
        return {}
    out = {}
    if isinstance(raw, dict):  # an estimate only: anything that is not {version: int} is ignored
        for key, need in raw.items():
            try:
                if isinstance(need, int) and need > 0:
                    out[Version(key)] = need
            except InvalidVersion:
                continue
    return out


_tails_lock = threading.Lock()  # the matrix reads several releases of a project at once


def record_tail(cache_root: Path, project: str, version: Version, need: int) -> None:
    with _tails_lock:
        needs = {str(v): n for v, n in _read_tails(cache_root, project).items()}
        if needs.get(str(version)) != need:
            needs[str(version)] = need
            cache = ArtifactCache(cache_root)
            cache.write(cache.tails(project), json.dumps(needs, sort_keys=True).encode())
