"""The apply engine: one patch series against one tree of upstream files, entirely in memory.

It decides each patch's outcome and the resulting file contents; writing them to a real target is
the job of `target.py`, which makes that all-or-nothing.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from patchctl.core import outcomes as O
from patchctl.core.errors import StoreError
from patchctl.core.paths import outside_packages
from patchctl.patching.hunks import FilePatch, FileResult, Hunk, ParsedVariant, apply_hunks, parse_variant, split_lines
from patchctl.patching.options import Options
from patchctl.sources.files import FileSource
from patchctl.store.series import Patch, Variant, choose_variant


class HunkReport(NamedTuple):
    file: str
    # The field shadows tuple.index(); nothing calls that on a report, and renaming it would change
    # the field every report and test reads.
    index: int  # type: ignore[assignment]
    status: str
    offset: int
    fuzz: int
    line: int
    context: str | None = None  # for failed hunks: the hunk and the upstream lines around it


class PatchOutcome(NamedTuple):
    name: str
    outcome: str
    variant: str | None
    reason: str
    hunks: tuple[HunkReport, ...] = ()
    files: tuple[str, ...] = ()


class FileChange(NamedTuple):
    path: str
    before: bytes | None
    after: bytes | None


class SeriesResult(NamedTuple):
    version: Version
    outcomes: tuple[PatchOutcome, ...]
    changes: tuple[FileChange, ...]  # net change per file, in first-touched order

    @property
    def ok(self) -> bool:
        return all(o.outcome != O.CONFLICT for o in self.outcomes)

    def outcome_of(self, name: str) -> PatchOutcome:
        return next(o for o in self.outcomes if o.name == name)


BaseFiles = Callable[[Version], FileSource]


def load_variant(variant: Variant, allow_modified: bool) -> ParsedVariant:
    where = str(variant.path)
    data = variant.read_bytes()  # refused past store.PATCH_MAX_BYTES before it is read
    if variant.pinned_sha256 is None:
        if not allow_modified:
            raise StoreError(f"{where} has no sha256 pin in series.yaml", hint="run `patchctl pin` after reviewing it")
    elif not allow_modified:
        actual = hashlib.sha256(data).hexdigest()
        if actual != variant.pinned_sha256:
            raise StoreError(
                f"{where} was modified: sha256 {actual[:12]}… does not match the pin {variant.pinned_sha256[:12]}…",
                hint="review the change, then `patchctl pin`; or pass --allow-modified",
            )
    if len(data) > _CACHED_MAX_BYTES:
        return parse_variant(data, where)
    return _parse_cached(data, where)


# Only variants of a reviewable size are memoized: 256 entries of the largest allowed size would
# hold 2 GB.
_CACHED_MAX_BYTES = 1 << 20


@functools.lru_cache(maxsize=256)
def _parse_cached(data: bytes, where: str) -> ParsedVariant:
    # Variants are parsed for the prefetch list and again to apply them; the matrix parses the
    # same few files for every version.
    return parse_variant(data, where)


def outside_package(patch: Patch, variant: Variant, parsed: ParsedVariant) -> None:
    """A patch may change or create files only inside its engine's own packages (engines.yaml): a
    `.pth` beside the package runs code at every interpreter start, another distribution's files or a
    dist-info are not ours to touch. Refused before anything is read or written (exit 2)."""
    from patchctl.core.engines import get_engine

    packages = get_engine(patch.engine).packages
    bad = outside_packages(parsed.paths, packages)
    if bad:
        raise StoreError(
            f"{patch.engine}/{patch.name}/{variant.filename}: refusing {', '.join(bad)}: a patch may only change "
            f"files inside the {', '.join(p + '/' for p in packages)} package",
            hint="a patch of another distribution belongs in that engine's series",
        )


def needed_paths(patches: Iterable[Patch], version: Version, allow_modified: bool) -> list[str]:
    paths: list[str] = []
    for patch in patches:
        choice = choose_variant(patch, version)
        if choice.variant is not None:
            paths.extend(load_variant(choice.variant, allow_modified).paths)
    return list(dict.fromkeys(paths))


def evaluate(
    patches: tuple[Patch, ...],
    version: Version,
    source: FileSource,
    *,
    options: Options = Options(),
    base_files: BaseFiles | None = None,
    earlier: dict[str, PatchOutcome] | None = None,
) -> SeriesResult:
    """earlier: outcomes of patches evaluated before these (rebase replays one patch at a time)."""
    source.prefetch(needed_paths(patches, version, options.allow_modified))
    original: dict[str, bytes | None] = {}
    current: dict[str, str | None] = {}

    def read(path: str) -> str | None:
        if path not in current:
            data = source.read(path)
            original[path] = data
            current[path] = None if data is None else data.decode("utf-8", errors="surrogateescape")
        return current[path]

    results: list[PatchOutcome] = []
    by_name: dict[str, PatchOutcome] = dict(earlier or {})
    for patch in patches:
        outcome, new_texts = _evaluate_one(patch, version, read, by_name, options, base_files)
        current.update(new_texts)
        results.append(outcome)
        by_name[patch.name] = outcome
    changes = []
    for path, before in original.items():
        text = current[path]
        after = None if text is None else text.encode("utf-8", errors="surrogateescape")
        if after != before:
            changes.append(FileChange(path, before, after))
    return SeriesResult(version, tuple(results), tuple(changes))


def _evaluate_one(
    patch: Patch,
    version: Version,
    read: Callable[[str], str | None],
    done: dict[str, PatchOutcome],
    options: Options,
    base_files: BaseFiles | None,
) -> tuple[PatchOutcome, dict[str, str | None]]:
    for dep in patch.depends_on:
        dep_outcome = done.get(dep)
        if dep_outcome is None:
            return PatchOutcome(patch.name, O.CONFLICT, None, f"depends on {dep}, which is not earlier in the series"), {}
        if dep_outcome.outcome in (O.CONFLICT, O.OBSOLETE):
            return PatchOutcome(patch.name, dep_outcome.outcome, None, f"depends on {dep}, which is {dep_outcome.outcome}"), {}
    choice = choose_variant(patch, version)
    if choice.variant is None and patch.upstreamed_at(version):
        return PatchOutcome(
            patch.name,
            O.UPSTREAMED,
            None,
            f"said by patch.yaml's upstreamed_in {patch.upstreamed_in}, not proven here: upstream "
            "should behave as patched; `patchctl smoke` proves it by running the checks on the "
            "pristine release",
        ), {}
    if choice.variant is None:
        return PatchOutcome(patch.name, O.OBSOLETE, None, choice.reason), {}
    variant = choice.variant
    parsed = load_variant(variant, options.allow_modified)
    outside_package(patch, variant, parsed)
    texts = {fp.path: read(fp.path) for fp in parsed.files}
    # A file the patch deletes may be gone: that is the patch's own change, which the reverse check
    # below recognises (upstreamed, or already-applied).
    gone = [fp.path for fp in parsed.files if not fp.is_new and not fp.is_removed and texts[fp.path] is None]
    kept = [fp.path for fp in parsed.files if not fp.is_new and texts[fp.path] is not None]
    if gone and kept:
        # Part of the code it fixes is still there (vLLM 0.34 removed the V1 runner's block_table.py,
        # not the V2 one the same fix patches): obsolete would drop a live fix without a word.
        return PatchOutcome(
            patch.name,
            O.CONFLICT,
            variant.filename,
            f"target file gone in {version}: {', '.join(gone)}, while {', '.join(kept)} "
            f"{'is' if len(kept) == 1 else 'are'} still there: it needs a variant for {version} "
            f"without the gone file (`patchctl rebase {patch.engine} --onto {version}`)",
            files=parsed.paths,
        ), {}
    if gone:
        return PatchOutcome(
            patch.name, O.OBSOLETE, variant.filename, f"target file gone in {version}: {', '.join(gone)}", files=parsed.paths
        ), {}

    # Already there? Asked before any forward apply: a forward apply with fuzz can find a second,
    # similar site in a patched file and insert the change twice (SGLang's server_args.py did).
    reverse = {fp.path: apply_hunks(texts[fp.path], fp, reverse=True, max_fuzz=0) for fp in parsed.files}
    forward = {fp.path: apply_hunks(texts[fp.path], fp) for fp in parsed.files}
    unchanged = all(r.ok and r.text == texts[p] for p, r in forward.items())
    if all(r.ok for r in reverse.values()) or unchanged:
        if patch.name in options.applied:
            return PatchOutcome(
                patch.name,
                O.ALREADY_APPLIED,
                variant.filename,
                "the state record lists it and its changes are present",
                files=parsed.paths,
            ), {}
        return PatchOutcome(
            patch.name,
            O.UPSTREAMED,
            variant.filename,
            "its changes are already in this version (the patch reverse-applies)",
            files=parsed.paths,
        ), {}

    hunks = _hunk_reports(parsed.files, forward, texts)
    if all(r.ok for r in forward.values()):
        statuses = {h.status for h in hunks}
        if "fuzz" in statuses:
            kind = O.FUZZ
            reason = f"{choice.reason}; applied with reduced context (fuzz)"
            if options.strict:
                return PatchOutcome(
                    patch.name, O.CONFLICT, variant.filename, reason + "; " + options.fuzz_refusal, hunks, parsed.paths
                ), {}
        elif "offset" in statuses:
            kind, reason = O.OFFSET, f"{choice.reason}; hunks moved"
        else:
            kind, reason = O.CLEAN, choice.reason
        return PatchOutcome(patch.name, kind, variant.filename, reason, hunks, parsed.paths), {
            p: r.text for p, r in forward.items()
        }

    if base_files is not None:
        merged = _three_way(parsed, variant, texts, base_files)
        if merged is not None:
            return PatchOutcome(
                patch.name,
                O.THREE_WAY,
                variant.filename,
                f"merged against the pristine files of {variant.base}",
                hunks,
                parsed.paths,
            ), merged
    failed = [h for h in hunks if h.status == "failed"]
    where = ", ".join(f"{h.file} hunk {h.index}" for h in failed)
    return PatchOutcome(patch.name, O.CONFLICT, variant.filename, f"does not apply: {where}", hunks, parsed.paths), {}


def _hunk_reports(
    files: tuple[FilePatch, ...], results: dict[str, FileResult], texts: dict[str, str | None]
) -> tuple[HunkReport, ...]:
    reports = []
    for fp in files:
        result = results[fp.path]
        if not result.hunks and result.problem:
            reports.append(HunkReport(fp.path, 0, "failed", 0, 0, 0, result.problem))
        for h in result.hunks:
            context = None
            if h.status == "failed" and h.index - 1 < len(fp.hunks):
                context = _failure_context(fp.hunks[h.index - 1], texts.get(fp.path), h.line)
            reports.append(HunkReport(fp.path, h.index, h.status, h.offset, h.fuzz, h.line, context))
    return tuple(reports)


def _failure_context(hunk: Hunk, text: str | None, line: int) -> str:
    wanted = "".join(hunk.old)
    around = ""
    if text:
        lines = split_lines(text)
        lo, hi = max(0, line - 4), min(len(lines), line + len(hunk.old) + 3)
        around = "".join(f"{n + 1:6d}  {lines[n]}" for n in range(lo, hi))
    return f"{hunk.header}\nexpected:\n{wanted}upstream near line {line}:\n{around}"


def _three_way(
    parsed: ParsedVariant, variant: Variant, texts: dict[str, str | None], base_files: BaseFiles
) -> dict[str, str | None] | None:
    """Merge each file: base = the variant's pristine base, ours = the target, theirs = base + patch."""
    try:
        base_source = base_files(variant.base)
        base_source.prefetch(parsed.paths)
    except Exception:
        return None
    merged: dict[str, str | None] = {}
    for fp in parsed.files:
        raw = base_source.read(fp.path)
        base = None if raw is None else raw.decode("utf-8", errors="surrogateescape")
        theirs = apply_hunks(base, fp, max_fuzz=0)
        ours = texts[fp.path]
        if not theirs.ok or base is None or ours is None or theirs.text is None:
            return None
        result = merge_file(ours, base, theirs.text)
        if result is None:
            return None
        merged[fp.path] = result
    return merged


def merge_file(ours: str, base: str, theirs: str) -> str | None:
    """git merge-file; None when it leaves conflicts."""
    with tempfile.TemporaryDirectory(prefix="patchctl-merge-") as tmp:
        paths = []
        for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            p = Path(tmp) / name
            p.write_bytes(text.encode("utf-8", errors="surrogateescape"))
            paths.append(str(p))
        proc = subprocess.run(["git", "merge-file", "-p", *paths], capture_output=True)
    if proc.returncode != 0:
        return None
    return proc.stdout.decode("utf-8", errors="surrogateescape")
