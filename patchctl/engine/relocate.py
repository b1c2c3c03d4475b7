"""When upstream moves code to another file (SGLang moved its NSA defaults from server_args.py to
arg_groups/overrides.py), find where each hunk's context went and propose the hunk there.

A proposal is marked `relocated` and never written as a variant by itself: a person reviews it."""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from patchctl.engine.hunks import FilePatch, Hunk, ParsedVariant, apply_hunks

if TYPE_CHECKING:
    from patchctl.engines import Engine
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
            out.append(line[min(-delta, _indent(line)):])
    return tuple(out)


def find_new_home(hunk: Hunk, files: dict[str, str], exclude: str | None = None) -> dict[str, Any] | None:
    keys = _key_lines(hunk)
    if not keys:
        return None
    scored = []
    for path, text in files.items():
        if path == exclude:
            continue
        stripped = {line.strip() for line in text.splitlines()}
        share = len(keys & stripped) / len(keys)
        if share >= MIN_SHARE:
            scored.append((share, path))
    for share, path in sorted(scored, reverse=True)[:3]:
        text = files[path]
        lines = text.splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(None, [line.strip() for line in hunk.old], [line.strip() for line in lines],
                                          autojunk=False)
        block = max(matcher.get_matching_blocks(), key=lambda b: b.size)
        if block.size == 0:
            continue
        delta = _indent(lines[block.b]) - _indent(hunk.old[block.a])
        start = block.b - block.a
        moved = Hunk(max(start, 0) + 1, _reindent(hunk.old, delta), _reindent(hunk.new, delta),
                     hunk.leading_context, hunk.trailing_context, hunk.header)
        result = apply_hunks(text, FilePatch(path, False, False, (moved,)))
        if result.ok:
            # apply_hunks returns text for every successful apply that neither creates nor deletes
            assert result.text is not None
            diff = "".join(difflib.unified_diff(lines, result.text.splitlines(keepends=True),
                                                f"a/{path}", f"b/{path}", n=3))
            return {"to": path, "line": result.hunks[0].line, "share_of_context_found": round(share, 2),
                    "status": "relocated", "fuzz": result.hunks[0].fuzz, "reindent": delta, "diff": diff}
    return None


def _candidate_files(source: ReleaseSource, engine: Engine) -> dict[str, str]:
    paths = [p for p in source.files_under(engine.packages[0] + "/") if p.endswith(".py")]
    source.prefetch(paths)
    files = {}
    for path in paths:
        data = source.read(path)
        if data is not None:
            files[path] = data.decode("utf-8", errors="replace")
    return files


def propose(parsed: ParsedVariant, full_source: ReleaseSource, engine: Engine,
            paths: list[str]) -> list[dict[str, Any]]:
    """Relocation proposals for every hunk of the given files (gone, or conflicting)."""
    wanted = [fp for fp in parsed.files if fp.path in paths]
    if not wanted:
        return []
    files = _candidate_files(full_source, engine)
    proposals = []
    for fp in wanted:
        current = files.get(fp.path)
        for index, hunk in enumerate(fp.hunks, start=1):
            if current is not None and apply_hunks(current, FilePatch(fp.path, False, False, (hunk,))).ok:
                continue  # this hunk still fits where it was
            home = find_new_home(hunk, files, exclude=fp.path)
            if home:
                proposals.append({"from": f"{fp.path}#{index}", **home})
    return proposals
