"""When upstream moves code to another file (SGLang moved its NSA defaults from server_args.py to
arg_groups/overrides.py), find where each hunk's context went and propose the hunk there. Only hunks
that really lost their place are searched for, and only as far as needed.

A proposal is marked `relocated` and never written as a variant by itself: a person reviews it."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from patchctl.patching.hunks import FilePatch, Hunk, ParsedVariant, apply_hunks

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.release import ReleaseSource

MIN_KEY_LENGTH = 12
MIN_SHARE = 0.5


def _key_lines(hunk: Hunk) -> set[str]:
    return {line.strip() for line in hunk.old if len(line.strip()) >= MIN_KEY_LENGTH}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _reindent(lines: Iterable[str], delta: int) -> tuple[str, ...]:
    out = []
    for line in lines:
        if not line.strip():
            out.append(line)
        elif delta >= 0:
            out.append(" " * delta + line)
        else:
            out.append(line[min(-delta, _indent(line)) :])
    return tuple(out)


def stripped_lines(text: str) -> frozenset[str]:
    return frozenset(line.strip() for line in text.splitlines())


def find_new_home(
    hunk: Hunk, files: dict[str, str], exclude: str | None = None, lines_of: dict[str, frozenset[str]] | None = None
) -> dict[str, Any] | None:
    """lines_of: each file's stripped lines, when the caller searches the same files for many hunks."""
    keys = _key_lines(hunk)
    if not keys:
        return None
    scored = []
    for path, text in files.items():
        if path == exclude:
            continue
        stripped = lines_of[path] if lines_of is not None else stripped_lines(text)
        share = len(keys & stripped) / len(keys)
        if share >= MIN_SHARE:
            scored.append((share, path))
    for share, path in sorted(scored, reverse=True)[:3]:
        text = files[path]
        lines = text.splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(
            None, [line.strip() for line in hunk.old], [line.strip() for line in lines], autojunk=False
        )
        block = max(matcher.get_matching_blocks(), key=lambda b: b.size)
        if block.size == 0:
            continue
        delta = _indent(lines[block.b]) - _indent(hunk.old[block.a])
        start = block.b - block.a
        moved = Hunk(
            max(start, 0) + 1,
            _reindent(hunk.old, delta),
            _reindent(hunk.new, delta),
            hunk.leading_context,
            hunk.trailing_context,
            hunk.header,
        )
        result = apply_hunks(text, FilePatch(path, False, False, (moved,)))
        if result.ok:
            # apply_hunks returns text for every successful apply that neither creates nor deletes
            assert result.text is not None
            diff = "".join(difflib.unified_diff(lines, result.text.splitlines(keepends=True), f"a/{path}", f"b/{path}", n=3))
            return {
                "to": path,
                "line": result.hunks[0].line,
                "share_of_context_found": round(share, 2),
                "status": "relocated",
                "fuzz": result.hunks[0].fuzz,
                "reindent": delta,
                "diff": diff,
            }
    return None


def _share_in(hunk: Hunk, text: str) -> float:
    keys = _key_lines(hunk)
    if not keys:
        return 1.0  # nothing distinctive to look for: never counted as lost
    return len(keys & {line.strip() for line in text.splitlines()}) / len(keys)


def lost_hunks(
    parsed: ParsedVariant, paths: Iterable[str], current: Callable[[str], str | None]
) -> list[tuple[FilePatch, int, Hunk]]:
    """Hunks (of the given files) that lost their place in the new tree: the file is gone, or the hunk
    no longer applies there and most of its distinctive context is no longer in that file either.
    A hunk whose context is still there conflicts with an edit beside it: that is for a person, and no
    other file is searched for it."""
    wanted = set(paths)
    lost = []
    for fp in parsed.files:
        if fp.path not in wanted or fp.is_new:
            continue
        text = current(fp.path)
        for index, hunk in enumerate(fp.hunks, start=1):
            if text is not None and (
                apply_hunks(text, FilePatch(fp.path, False, False, (hunk,))).ok or _share_in(hunk, text) >= MIN_SHARE
            ):
                continue
            if _key_lines(hunk):
                lost.append((fp, index, hunk))
    return lost


def _dir_parts(path: str) -> tuple[str, ...]:
    return tuple(path.split("/")[:-1])


def _distance(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return len(a) + len(b) - 2 * common


def candidate_rings(names: Iterable[str], near: Iterable[str]) -> list[list[str]]:
    """Candidate files, nearest first: a file of the same name elsewhere (a module moved to another
    package: vllm/attention/ -> vllm/v1/attention/), then by how far their directory is from the
    nearest lost file's (steps in the directory tree): moved code usually lands beside its old file or
    one level away (SGLang's server_args.py -> arg_groups/overrides.py), so the search mostly stops in
    the first rings."""
    near = list(near)
    homes = [_dir_parts(p) for p in near]
    same_name = {p.rsplit("/", 1)[-1] for p in near} - {"__init__.py"}
    rings: dict[int, list[str]] = {}
    for name in names:
        ring = -1 if name.rsplit("/", 1)[-1] in same_name else min(_distance(_dir_parts(name), h) for h in homes)
        rings.setdefault(ring, []).append(name)
    return [sorted(rings[d]) for d in sorted(rings)]


def propose(
    parsed: ParsedVariant, source: ReleaseSource, engine: Engine, paths: list[str], current: Callable[[str], str | None]
) -> list[dict[str, Any]]:
    """Relocation proposals for the hunks of the given files that lost their place (`current` reads a
    file of the new tree, None when it is gone). Nothing is listed or read unless a hunk is lost; then
    the package's .py files are read ring by ring outward from the lost file, through the source's
    sparse reads (a wheel's central directory and just the members), until every lost hunk has a home."""
    lost = lost_hunks(parsed, paths, current)
    if not lost:
        return []
    own = {fp.path for fp, _, _ in lost}
    names = [p for p in source.files_under(engine.packages[0] + "/") if p.endswith(".py") and p not in own]
    # A source read whole opens (an sdist: gunzips) its archive once per batch: one batch then.
    rings = candidate_rings(names, own) if getattr(source, "sparse", False) else [sorted(names)]
    homes: dict[tuple[str, int], dict[str, Any]] = {}
    for ring in rings:
        source.prefetch(ring)
        # Only this ring is searched: the nearer ones had no home for what is still lost.
        files: dict[str, str] = {}
        for path in ring:
            data = source.read(path)
            if data is not None:
                files[path] = data.decode("utf-8", errors="replace")
        lines_of = {path: stripped_lines(text) for path, text in files.items()}
        for fp, index, hunk in lost:
            if (fp.path, index) not in homes:
                home = find_new_home(hunk, files, exclude=fp.path, lines_of=lines_of)
                if home:
                    homes[(fp.path, index)] = home
        if len(homes) == len(lost):
            break
    return [{"from": f"{fp.path}#{index}", **homes[(fp.path, index)]} for fp, index, _ in lost if (fp.path, index) in homes]
