"""Variant files → per-file hunks, and applying hunks to text with offset and fuzz.

The matcher is ours (not GNU patch) because files come from sparse sources as bytes in memory and
every hunk's offset and fuzz must be reported, not just success.
"""
from __future__ import annotations

import email
import posixpath
from typing import NamedTuple

import unidiff

from patchctl.errors import StoreError

MAX_FUZZ = 2


class Hunk(NamedTuple):
    source_start: int  # 1-based line in the pre-image
    old: tuple[str, ...]  # context + removed lines, with line endings
    new: tuple[str, ...]  # context + added lines
    leading_context: int
    trailing_context: int
    header: str


class FilePatch(NamedTuple):
    path: str  # relative to the import root, posix
    is_new: bool
    is_removed: bool
    hunks: tuple[Hunk, ...]


class ParsedVariant(NamedTuple):
    subject: str
    files: tuple[FilePatch, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(f.path for f in self.files)


class HunkResult(NamedTuple):
    # The field shadows tuple.index(); nothing calls that on a result, and renaming it would change
    # the field every report and test reads.
    index: int  # type: ignore[assignment]  # 1-based
    status: str  # clean | offset | fuzz | failed
    offset: int  # lines moved against the variant's base
    fuzz: int
    line: int  # 1-based line where it applied (or was expected)


class FileResult(NamedTuple):
    text: str | None  # None when the result is a deleted file or the apply failed
    hunks: tuple[HunkResult, ...]
    ok: bool
    problem: str | None = None


def check_relative_path(path: str, where: str) -> str:
    """Refuse paths that could leave the engine root before anything is written."""
    if not path or path.startswith("/") or "\\" in path or posixpath.isabs(path):
        raise StoreError(f"{where}: refusing absolute or odd path {path!r}")
    norm = posixpath.normpath(path)
    if norm.startswith("..") or "/../" in f"/{path}/" or norm == ".":
        raise StoreError(f"{where}: refusing path {path!r}: it leaves the engine root")
    return norm


def parse_variant(data: bytes, where: str) -> ParsedVariant:
    if b"\r\n" in data:
        raise StoreError(
            f"{where}: the variant has CRLF line endings (saved on Windows?); "
            "upstream files use LF: convert it with dos2unix and re-pin"
        )
    if b"GIT binary patch" in data or b"\nBinary files " in data:
        raise StoreError(f"{where}: binary patches are not supported")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StoreError(f"{where}: not UTF-8 text") from None
    header_end = text.find("\ndiff --git ")
    subject = ""
    if header_end > 0:
        message = email.message_from_string(text[:header_end])
        subject = " ".join(str(message.get("Subject", "")).split())
        subject = subject.removeprefix("[PATCH] ")
    try:
        patch_set = unidiff.PatchSet(text)
    except unidiff.UnidiffParseError as exc:
        raise StoreError(f"{where}: not a parseable diff: {exc}") from None
    if not len(patch_set):
        raise StoreError(f"{where}: contains no file diffs")
    files = []
    for pf in patch_set:
        if pf.is_binary_file:
            raise StoreError(f"{where}: binary patches are not supported ({pf.path})")
        if pf.is_rename:
            raise StoreError(f"{where}: renames are not supported ({pf.source_file} -> {pf.target_file})")
        raw = pf.target_file if not pf.is_removed_file else pf.source_file
        path = raw[2:] if raw.startswith(("a/", "b/")) else raw
        path = check_relative_path(path, where)
        hunks = []
        for h in pf:
            lines, texts = _hunk_lines(h)
            old = tuple(t for ln, t in zip(lines, texts, strict=False) if ln.is_context or ln.is_removed)
            new = tuple(t for ln, t in zip(lines, texts, strict=False) if ln.is_context or ln.is_added)
            changed = [i for i, ln in enumerate(lines) if not ln.is_context]
            lead = changed[0] if changed else len(lines)
            trail = len(lines) - 1 - changed[-1] if changed else 0
            hunks.append(Hunk(h.source_start, old, new, lead, trail, str(h).splitlines()[0]))
        files.append(FilePatch(path, pf.is_added_file, pf.is_removed_file, tuple(hunks)))
    return ParsedVariant(subject, tuple(files))


def _hunk_lines(hunk: unidiff.Hunk) -> tuple[list[unidiff.patch.Line], list[str]]:
    """Lines of a hunk with exact text: a "\\ No newline at end of file" marker strips the newline
    of the line before it (unidiff keeps the marker as a line of its own)."""
    lines: list[unidiff.patch.Line] = []
    texts: list[str] = []
    for line in hunk:
        if line.line_type == "\\":
            if texts:
                texts[-1] = texts[-1].rstrip("\n")
            continue
        lines.append(line)
        texts.append(line.value)
    return lines, texts


def apply_hunks(text: str | None, fp: FilePatch, *, reverse: bool = False, max_fuzz: int = MAX_FUZZ) -> FileResult:
    adds, removes = (fp.is_removed, fp.is_new) if reverse else (fp.is_new, fp.is_removed)
    if adds:
        created = "".join("".join(h.old if reverse else h.new) for h in fp.hunks)
        if text is None:
            return FileResult(created, (HunkResult(1, "clean", 0, 0, 1),), True)
        if text == created:  # the file already is what the patch wants
            return FileResult(text, (HunkResult(1, "clean", 0, 0, 1),), True)
        return FileResult(None, (HunkResult(1, "failed", 0, 0, 1),), False, "file already exists")
    if text is None:
        return FileResult(None, (), False, "file is missing")
    lines = text.splitlines(keepends=True)
    results = []
    delta = 0  # how far the file grew or shrank through earlier hunks
    floor = 0  # hunks never match inside an earlier hunk's result
    ok = True
    for index, hunk in enumerate(fp.hunks, start=1):
        old, new = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        expected = max(hunk.source_start - 1, 0) + delta
        found = None
        for fuzz in range(0, max_fuzz + 1):
            cut_lead = min(fuzz, hunk.leading_context)
            cut_trail = min(fuzz, hunk.trailing_context)
            if fuzz and not (cut_lead or cut_trail):
                break
            pattern = old[cut_lead : len(old) - cut_trail]
            pos = _find(lines, pattern, expected + cut_lead, floor)
            if pos is not None:
                found = (pos - cut_lead, fuzz, cut_lead, cut_trail)
                break
        if found is None:
            ok = False
            results.append(HunkResult(index, "failed", 0, 0, expected + 1))
            continue
        start, fuzz, cut_lead, cut_trail = found
        replacement = new[cut_lead : len(new) - cut_trail]
        at = start + cut_lead
        lines[at : at + len(old) - cut_lead - cut_trail] = list(replacement)
        offset = start - expected
        status = "fuzz" if fuzz else ("offset" if offset else "clean")
        results.append(HunkResult(index, status, offset, fuzz, start + 1))
        delta += offset + len(new) - len(old)
        floor = at + len(replacement)
    if not ok:
        return FileResult(None, tuple(results), False, "hunks failed")
    result_text = "".join(lines)
    if removes:
        if result_text:
            return FileResult(None, tuple(results), False, "file to delete has other content")
        return FileResult(None, tuple(results), True)
    return FileResult(result_text, tuple(results), True)


def _find(lines: list[str], pattern: tuple[str, ...], expected: int, floor: int) -> int | None:
    """Where the hunk's old lines are, nearest to `expected` (the lower one on a tie), at or after
    `floor`, no farther than the file's length; None when they are nowhere."""
    n, m = len(lines), len(pattern)
    if m == 0:
        return max(min(expected, n), floor)
    first, last = pattern[0], n - m
    candidates = []
    pos = max(floor, 0)
    while pos <= last:  # list.index scans in C: a hunk that matches nowhere reads the file once
        try:
            pos = lines.index(first, pos, last + 1)
        except ValueError:
            break
        if abs(pos - expected) <= n:
            candidates.append(pos)
        pos += 1
    for pos in sorted(candidates, key=lambda p: (abs(p - expected), p)):
        if tuple(lines[pos : pos + m]) == pattern:
            return pos
    return None
