"""Variant files → per-file hunks, and applying hunks to text with offset and fuzz.

The matcher is ours (not GNU patch) because files come from sparse sources as bytes in memory and
every hunk's offset and fuzz must be reported, not just success. With no fuzz it is `git apply`'s
(tests/patching/test_differential_git.py); the variant is read by the strict reader (diffread).
"""

from __future__ import annotations

import email
import posixpath
from typing import NamedTuple

from patchctl.core.errors import StoreError
from patchctl.patching.diffread import RawHunk, read_diff
from patchctl.store.series import PATCH_MAX_BYTES

MAX_FUZZ = 2


class Hunk(NamedTuple):
    source_start: int  # 1-based line in the pre-image
    old: tuple[str, ...]  # context + removed lines, with line endings
    new: tuple[str, ...]  # context + added lines
    leading_context: int
    trailing_context: int
    header: str
    # git's anchors (apply.c match_beginning / match_end): a hunk whose range starts at line 1 (or 0)
    # matches only at the start of the file, one without trailing context only at its end, unless
    # context is reduced (fuzz). new_starts_file is the start anchor when the hunk is applied in reverse.
    starts_file: bool = False
    new_starts_file: bool = False
    ends_file: bool = False
    target_start: int | None = None  # 1-based line in the post-image (None: as source_start)


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
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise StoreError(f"{where}: refusing path {path!r}: it holds control characters")
    norm = posixpath.normpath(path)
    if norm.startswith("..") or "/../" in f"/{path}/" or norm == ".":
        raise StoreError(f"{where}: refusing path {path!r}: it leaves the engine root")
    if norm != path:  # `a/./b`, `a//b`, `a/`: git refuses some of these and reads others its own way
        raise StoreError(f"{where}: refusing path {path!r}: not in its plain form ({norm!r})")
    return norm


def parse_variant(data: bytes, where: str) -> ParsedVariant:
    """A variant's subject and its file diffs, read strictly (patching/diffread.py: as `git apply`
    reads them, refusing what patchctl cannot apply as git would)."""
    if len(data) > PATCH_MAX_BYTES:
        raise StoreError(
            f"{where}: {len(data)} bytes, more than a patch file may have ({PATCH_MAX_BYTES} bytes)",
            hint="a variant this large is not a reviewable patch",
        )
    if b"\r\n" in data:
        raise StoreError(
            f"{where}: the variant has CRLF line endings (saved on Windows?); "
            "upstream files use LF: convert it with dos2unix and re-pin"
        )
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
    files = []
    seen: dict[str, int] = {}
    for raw in read_diff(data, where):
        name = raw.new_path if raw.new_path is not None else raw.old_path
        assert name is not None  # the reader never returns a diff without a name
        path = check_relative_path(name, where)
        if path in seen:
            raise StoreError(
                f"{where}: line {raw.line_number}: {path} is diffed twice (first at line {seen[path]}); make it one diff"
            )
        seen[path] = raw.line_number
        files.append(FilePatch(path, raw.old_path is None, raw.new_path is None, tuple(_hunk(h) for h in raw.hunks)))
    return ParsedVariant(subject, tuple(files))


def _hunk(raw: RawHunk) -> Hunk:
    """A hunk's old and new lines with exact text: a "\\ No newline at end of file" line strips the
    newline of the line before it; an empty context line so marked is no line at all (as in git)."""
    old: list[str] = []
    new: list[str] = []
    body = raw.lines
    for k, line in enumerate(body):
        kind = line[:1]
        if kind == b"\\":
            continue
        text = line[1:] if kind != b"\n" else b"\n"
        if k + 1 < len(body) and body[k + 1][:1] == b"\\":
            if kind == b"\n":
                continue
            text = text[:-1]
        decoded = text.decode("utf-8")
        if kind in (b" ", b"\n", b"-"):
            old.append(decoded)
        if kind in (b" ", b"\n", b"+"):
            new.append(decoded)
    return Hunk(
        raw.old_start,
        tuple(old),
        tuple(new),
        raw.leading,
        raw.trailing,
        raw.header.decode("utf-8").rstrip("\n"),
        starts_file=raw.old_start <= 1,
        new_starts_file=raw.new_start <= 1,
        ends_file=raw.trailing == 0,
        target_start=raw.new_start,
    )


def split_lines(text: str) -> list[str]:
    """Lines ending at "\\n" only, each with its ending (str.splitlines also splits at \\r, form feeds
    and more, which git and every upstream file do not)."""
    lines = text.split("\n")
    last = lines.pop()
    out = [line + "\n" for line in lines]
    if last:
        out.append(last)
    return out


def apply_hunks(text: str | None, fp: FilePatch, *, reverse: bool = False, max_fuzz: int = MAX_FUZZ) -> FileResult:
    """Apply (or, reverse, take back) one file's hunks. With no fuzz this is `git apply`: each hunk's
    old lines exactly, nearest to where it is expected (the later one on a tie), never on lines an
    earlier hunk wrote, and at the start or end of the file where git anchors it; a created file is
    the hunks applied to an empty one, a deleted file's hunks must take all of it."""
    adds, removes = (fp.is_removed, fp.is_new) if reverse else (fp.is_new, fp.is_removed)
    if adds:
        created = _apply(split_lines(""), [], fp, reverse, 0)
        if created is None or not created[1]:
            results = created[0] if created is not None else ()
            return FileResult(None, results, False, "hunks failed")
        wanted = "".join(created[2])
        if text is None:
            return FileResult(wanted, created[0], True)
        if text == wanted and not reverse:  # the file already is what the patch wants
            return FileResult(text, created[0], True)
        return FileResult(
            None,
            (HunkResult(1, "failed", 0, 0, 1),),
            False,
            "file already exists" if not reverse else "the file the patch deletes is there",
        )
    if text is None:
        return FileResult(None, (), False, "file is missing")
    lines = split_lines(text)
    applied = _apply(lines, [False] * len(lines), fp, reverse, max_fuzz)
    assert applied is not None
    results, ok, lines = applied
    if not ok:
        return FileResult(None, results, False, "hunks failed")
    result_text = "".join(lines)
    if removes:
        if result_text:
            return FileResult(None, results, False, "file to delete has other content")
        return FileResult(None, results, True)
    return FileResult(result_text, results, True)


def _apply(
    lines: list[str], patched: list[bool], fp: FilePatch, reverse: bool, max_fuzz: int
) -> tuple[tuple[HunkResult, ...], bool, list[str]] | None:
    results = []
    delta = 0  # how far the file grew or shrank through earlier hunks, and their offsets
    ok = True
    for index, hunk in enumerate(fp.hunks, start=1):
        old, new = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        at_start = hunk.new_starts_file if reverse else hunk.starts_file
        # Where the hunk's old lines begin in the file as it is now: its header's line on the side
        # it is applied from, moved by what the earlier hunks changed and how far they were found off.
        base = hunk.target_start if reverse and hunk.target_start is not None else hunk.source_start
        expected = max(base - 1, 0) + delta
        found = None
        for fuzz in range(0, max_fuzz + 1):
            cut_lead = min(fuzz, hunk.leading_context, len(old))
            cut_trail = min(fuzz, hunk.trailing_context, len(old) - cut_lead)
            if fuzz and not (cut_lead or cut_trail):
                break
            pattern = tuple(old[cut_lead : len(old) - cut_trail])
            pos = _find(
                lines, patched, pattern, expected + cut_lead, at_start=at_start and not fuzz, at_end=hunk.ends_file and not fuzz
            )
            if pos is not None:
                found = (pos - cut_lead, fuzz, cut_lead, cut_trail)
                break
        if found is None:
            ok = False
            results.append(HunkResult(index, "failed", 0, 0, expected + 1))
            continue
        start, fuzz, cut_lead, cut_trail = found
        replacement = list(new[cut_lead : len(new) - cut_trail])
        at = start + cut_lead
        width = len(old) - cut_lead - cut_trail
        lines[at : at + width] = replacement
        patched[at : at + width] = [True] * len(replacement)
        offset = start - expected
        status = "fuzz" if fuzz else ("offset" if offset else "clean")
        results.append(HunkResult(index, status, offset, fuzz, start + 1))
        delta += offset + len(new) - len(old)
    return tuple(results), ok, lines


def _find(
    lines: list[str], patched: list[bool], pattern: tuple[str, ...], expected: int, *, at_start: bool, at_end: bool
) -> int | None:
    """Where the hunk's old lines are, nearest to `expected` (the later one on a tie, as git's
    find_pos), on no line an earlier hunk wrote; at 0 only when at_start, ending at the file's end
    only when at_end; None when they are nowhere."""
    n, m = len(lines), len(pattern)
    if m > n:
        return None
    if at_start:
        candidates = [0]
    elif at_end:
        candidates = [n - m]
    elif m == 0:
        return min(max(expected, 0), n)
    else:
        candidates = []
        pos, last = 0, n - m
        first = pattern[0]
        while pos <= last:  # list.index scans in C: a hunk that matches nowhere reads the file once
            try:
                pos = lines.index(first, pos, last + 1)
            except ValueError:
                break
            candidates.append(pos)
            pos += 1
        candidates.sort(key=lambda p: (abs(p - expected), -p))
    for pos in candidates:
        if at_end and pos + m != n:
            continue
        if tuple(lines[pos : pos + m]) == pattern and not any(patched[pos : pos + m]):
            return pos
    return None
