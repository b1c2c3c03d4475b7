"""Carry the series onto a new upstream version, the rebase-helper way: the old pristine base as a
git repo, each patch a commit on it, the commits replayed one by one onto the new pristine version
(`git rebase --onto`, done pick by pick so each patch is classified on its own), with git's rerere
remembering how a person resolved a conflict, and a search for code that moved to another file."""

from __future__ import annotations

import email
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchctl.core import gitutil
from patchctl.core import outcomes as O
from patchctl.core.engines import get_engine
from patchctl.core.errors import UsageError
from patchctl.core.gitutil import git
from patchctl.patching import evaluate
from patchctl.patching import relocate as relocate
from patchctl.patching.hunks import parse_variant
from patchctl.rebase.rerere import rerere_dir
from patchctl.sources import fetch
from patchctl.sources.files import DirectorySource
from patchctl.store.layered import Store, write_variant
from patchctl.store.series import Patch, Variant, choose_variant

UNCHANGED, REFRESHED, CONFLICT, UPSTREAMED, OBSOLETE = "unchanged", "refreshed", "conflict", "upstreamed", "obsolete"


class RebaseItem(NamedTuple):
    name: str
    classification: str
    old_variant: str | None
    new_variant: str | None
    reason: str
    resolution: str | None = None  # "reused" when a recorded resolution resolved the conflict
    conflict: dict | None = None  # files, hunks with markers, upstream code around, worktree
    relocations: tuple[dict, ...] = ()
    # With --past-applies-to: the applies_to that ends below the new version. The patch was replayed
    # as if that upper bound were lifted; nothing is written for it until a person widens it.
    outside_applies_to: str | None = None


class RebaseReport(NamedTuple):
    engine: str
    old: str
    new: str
    items: tuple[RebaseItem, ...]
    workdir: str | None


def variant_message(data: bytes) -> str:
    """Subject and body of a format-patch mail, for the replayed commit."""
    text = data.decode("utf-8", errors="replace")
    head = text.split("\ndiff --git ", 1)[0]
    message = email.message_from_string(head)
    subject = " ".join(str(message.get("Subject", "patch")).split()).removeprefix("[PATCH] ")
    payload = message.get_payload()
    body = payload if isinstance(payload, str) else ""
    body = body.split("\n---\n", 1)[0].strip()
    return subject + ("\n\n" + body if body else "")


# verify(patch, version, the variant made for it) -> (ok, reason): the smoke checks gating a reused resolution.
Verifier = Callable[[Patch, Version, bytes], tuple[bool, str]]


class _Plan(NamedTuple):
    patch: Patch
    source: Variant | None  # what the old base gets: the variant replayed from there (None: none there)
    target: Variant  # what the new version gets today

    @property
    def target_is_newer(self) -> bool:
        """The store already holds a variant made after the old base, and the new version gets it:
        replaying the old variant would redo (and conflict with) work a person already did."""
        return self.source is None or self.target.base > self.source.base


def without_upper_bound(patch: Patch) -> Patch:
    """The patch with applies_to's upper bounds (<, <=) lifted, its other clauses kept."""
    kept = [str(s) for s in patch.applies_to if s.operator not in ("<", "<=")]
    return patch._replace(applies_to=SpecifierSet(",".join(kept)))


def rebase(
    engine_name: str,
    store: Store,
    new: Version,
    ctx: fetch.SourceContext,
    *,
    old: Version | None = None,
    workdir: Path | None = None,
    write: bool = True,
    verify: Verifier | None = None,
    past_applies_to: bool = False,
    only: frozenset[str] | None = None,
) -> RebaseReport:
    """verify(patch, version, variant bytes) -> (ok, reason): smoke checks that gate a reused resolution.
    only: write variants for these patches alone (--patch); the others are still replayed, since a
    later patch is carried on top of them, and classified, but nothing is written for them.
    past_applies_to: also replay the patches whose applies_to ends below `new` (an upper bound is
    often just the last release looked at), to show whether their code carries; they are never written.

    Each patch is first evaluated as `patchctl check` would: the variant the new version gets, on the
    new tree (with the patches before it carried). If that applies cleanly there is nothing to carry
    (unchanged); if it is upstream already, upstreamed. Otherwise the variant of the old base is
    replayed onto the new version by git (a three-way cherry-pick), or, when the store already has a
    newer variant that applies with moved lines, that one is refreshed."""
    engine = get_engine(engine_name)
    series = store.series(engine_name)
    items: list[RebaseItem] = []
    targets: list[tuple[Patch, Variant]] = []
    # What each patch is on the new version, as `check` would say it: the patches after it see it.
    on_new: dict[str, evaluate.PatchOutcome] = {}
    past: dict[str, str] = {}  # name -> the applies_to that excludes `new` (--past-applies-to)
    for patch in series.patches:
        choice = choose_variant(patch, new)
        if choice.variant is None and past_applies_to and not patch.upstreamed_at(new):
            lifted = without_upper_bound(patch)
            if choose_variant(lifted, new).variant is not None:
                past[patch.name] = str(patch.applies_to)
                patch, choice = lifted, choose_variant(lifted, new)
        if choice.variant is not None:
            targets.append((patch, choice.variant))
            continue
        if patch.upstreamed_at(new):  # as check says it: upstream behaves as patched (upstreamed_in)
            kind, verdict, why = UPSTREAMED, O.UPSTREAMED, f"upstreamed_in {patch.upstreamed_in} covers {new}"
        else:
            kind, verdict, why = OBSOLETE, O.OBSOLETE, choice.reason
        on_new[patch.name] = evaluate.PatchOutcome(patch.name, verdict, None, why)
        items.append(RebaseItem(patch.name, kind, None, None, why))
    if not targets:
        return RebaseReport(engine_name, str(old or ""), str(new), tuple(items), None)
    old = old or max(v.base for _, v in targets)
    if old > new:
        raise UsageError(f"--from {old} is newer than --onto {new}")
    plans = [_Plan(patch, choose_variant(patch, old).variant, target) for patch, target in targets]
    parsed = {
        v.path: parse_variant(v.read_bytes(), str(v.path)) for plan in plans for v in (plan.source, plan.target) if v is not None
    }
    paths = sorted({path for pv in parsed.values() for path in pv.paths})
    old_src = fetch.release(engine, old, ctx)
    new_src = fetch.release(engine, new, ctx)
    old_src.prefetch(paths)
    new_src.prefetch(paths)

    keep = workdir is not None
    root = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="patchctl-rebase-"))
    if root.exists() and any(root.iterdir()):
        raise UsageError(f"--workdir {root} is not empty")
    repo = root / "repo"
    gitutil.init(repo)
    git(repo, "config", "rerere.enabled", "true")
    git(repo, "config", "rerere.autoupdate", "true")
    recorded = rerere_dir(store, engine_name)
    if recorded.is_dir():
        shutil.copytree(recorded, repo / ".git" / "rr-cache", dirs_exist_ok=True)

    _write(repo, {p: old_src.read(p) for p in paths}, paths)
    old_commit = gitutil.commit_all(repo, f"upstream {old}")
    git(repo, "checkout", "-q", "-b", "patches")
    commits: dict[str, str] = {}
    on_old: dict[str, evaluate.PatchOutcome] = {}
    for plan in plans:
        if plan.source is None:
            continue
        result = evaluate.evaluate((plan.patch,), old, DirectorySource(repo), earlier=on_old)
        on_old[plan.patch.name] = outcome = result.outcomes[0]
        if outcome.outcome in O.WRITES:
            _apply_changes(repo, result.changes)
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "--allow-empty", "-m", variant_message(plan.source.read_bytes()))
            commits[plan.patch.name] = git(repo, "rev-parse", "HEAD").stdout.strip()

    git(repo, "checkout", "-q", "-b", "upstream-new", old_commit)
    new_files = {p: new_src.read(p) for p in paths}
    _write(repo, new_files, paths)
    gitutil.commit_all(repo, f"upstream {new}")
    git(repo, "checkout", "-q", "-b", "rebased")

    def tree_file(path: str) -> str | None:
        data = DirectorySource(repo).read(path)  # the new version with the patches carried so far
        return None if data is None else data.decode("utf-8", errors="replace")

    def relocations(variant: Variant, files: list[str]) -> tuple[dict[str, Any], ...]:
        return tuple(relocate.propose(parsed[variant.path], new_src, engine, files, tree_file))

    failed: set[str] = set()

    def unasked(patch: Patch) -> bool:
        return only is not None and patch.name not in only

    def writes(patch: Patch) -> bool:
        return write and patch.name not in past and not unasked(patch)

    def marked(item: RebaseItem) -> RebaseItem:
        outside = past.get(item.name)
        if outside is None:
            return item
        return item._replace(
            outside_applies_to=outside, reason=f"{new} is outside applies_to {outside}; as if it were not: {item.reason}"
        )

    def fail(plan: _Plan, classification: str, old_variant: str | None, reason: str, **extra: Any) -> None:
        failed.add(plan.patch.name)
        outcome = O.OBSOLETE if classification == OBSOLETE else O.CONFLICT
        on_new[plan.patch.name] = evaluate.PatchOutcome(plan.patch.name, outcome, None, reason)
        items.append(marked(RebaseItem(plan.patch.name, classification, old_variant, None, reason, **extra)))

    def carried(plan: _Plan, item: RebaseItem) -> None:
        on_new[plan.patch.name] = evaluate.PatchOutcome(plan.patch.name, O.CLEAN, item.new_variant, item.reason)
        items.append(marked(item))

    for plan in plans:
        patch, source, target = plan
        gone_deps = [d for d in patch.depends_on if d in on_new and on_new[d].outcome == O.OBSOLETE]
        if gone_deps:  # as check says it: nothing to build on in the new version
            fail(plan, OBSOLETE, (source or target).filename, f"depends on {gone_deps[0]}, which is obsolete on {new}")
            continue
        blocked = [d for d in patch.depends_on if d in failed]
        if blocked:
            fail(plan, CONFLICT, (source or target).filename, f"depends on {blocked[0]}, which did not carry over")
            continue
        # As `patchctl check` sees it: the variant the new version gets, on the new tree.
        direct = evaluate.evaluate((patch,), new, DirectorySource(repo), earlier=on_new)
        outcome = direct.outcomes[0]
        if outcome.outcome == O.CLEAN:
            _commit(repo, direct.changes, target)
            since = (
                f" (made after the old base {old}; {source.filename} is not replayed)"
                if plan.target_is_newer and source is not None
                else ""
            )
            carried(
                plan,
                RebaseItem(
                    patch.name, UNCHANGED, target.filename, target.filename, f"{target.filename} applies to {new} cleanly{since}"
                ),
            )
            continue
        if outcome.outcome in (O.UPSTREAMED, O.ALREADY_APPLIED):
            items.append(
                marked(
                    RebaseItem(
                        patch.name,
                        UPSTREAMED,
                        target.filename,
                        None,
                        f"{target.filename} reverse-applies on {new}: its changes are upstream",
                    )
                )
            )
            on_new[patch.name] = outcome
            continue
        if plan.target_is_newer and outcome.outcome in (O.OFFSET, O.FUZZ):
            # The newer variant is nearer to the new version than a replay from the old base.
            _commit(repo, direct.changes, target)
            how = "with reduced context (fuzz): review it" if outcome.outcome == O.FUZZ else "with moved lines"
            carried(
                plan,
                _refreshed(
                    store,
                    patch,
                    target,
                    new,
                    gitutil.format_patch(repo),
                    writes(patch),
                    f"{target.filename} applies {how}",
                    unasked=unasked(patch),
                ),
            )
            continue
        sha = commits.get(patch.name)
        tried = f"{target.filename} does not apply to {new} ({outcome.reason}); " if plan.target_is_newer else ""
        if sha is None:
            base_outcome = on_old.get(patch.name)
            if source is not None and base_outcome is not None:
                why = f"on its own base {old}: {base_outcome.reason}"
                kind = CONFLICT if base_outcome.outcome == O.CONFLICT else OBSOLETE
            else:
                why, kind = (
                    f"{outcome.reason}; nothing to replay from {old}",
                    (CONFLICT if outcome.outcome == O.CONFLICT else OBSOLETE),
                )
            lost = [fp.path for fp in parsed[target.path].files]
            fail(plan, kind, (source or target).filename, tried + why, relocations=relocations(target, lost))
            continue
        assert source is not None
        edited = [fp.path for fp in parsed[source.path].files if not fp.is_new]
        gone = [path for path in edited if new_files.get(path) is None]
        if gone and len(gone) == len(edited):  # all gone: obsolete; some: the cherry-pick's conflict below
            proposals = relocations(source, gone)
            fail(
                plan,
                OBSOLETE,
                source.filename,
                tried + f"target file gone in {new}: {', '.join(gone)}" + ("; relocation proposed" if proposals else ""),
                relocations=proposals,
            )
            continue
        pick = git(repo, "cherry-pick", "--keep-redundant-commits", sha, check=False)
        resolution = None
        if pick.returncode != 0:
            unmerged = git(repo, "diff", "--name-only", "--diff-filter=U").stdout.split()
            if not unmerged and _has_staged_resolution(repo):
                git(repo, "-c", "core.editor=true", "cherry-pick", "--continue")
                resolution = "reused"
            else:
                git(repo, "rerere", "clear", check=False)  # the worktree below records this conflict once
                git(repo, "cherry-pick", "--abort", check=False)
                conflict = _conflict_report(repo, unmerged, root, patch, sha, keep, gone)
                # Part of what the patch fixes is gone and part is not: a person decides whether the
                # gone part moved (the relocations) or is no longer needed (git rm it, then resolve).
                removed = (
                    (
                        f"; {', '.join(gone)} gone in {new} while the patch's other files are still "
                        f"there: `git rm` it in the conflict worktree if the fix is not needed there, "
                        f"or carry it to where the code moved"
                    )
                    if gone
                    else ""
                )
                fail(
                    plan,
                    CONFLICT,
                    source.filename,
                    tried + f"conflicts in {', '.join(unmerged) or 'the replay'}{removed}",
                    conflict=conflict,
                    relocations=relocations(source, unmerged),
                )
                continue
        if not git(repo, "diff", "--name-only", "HEAD~1", "HEAD").stdout.strip():
            items.append(
                marked(
                    RebaseItem(
                        patch.name,
                        UPSTREAMED,
                        source.filename,
                        None,
                        f"replaying it onto {new} changes nothing: the patched result is identical",
                    )
                )
            )
            on_new[patch.name] = evaluate.PatchOutcome(patch.name, O.UPSTREAMED, None, "")
            continue
        new_bytes = gitutil.format_patch(repo)
        if resolution == "reused" and verify is not None:
            ok, why = verify(patch, new, new_bytes)
            if not ok:
                git(repo, "reset", "-q", "--hard", "HEAD~1")
                fail(
                    plan,
                    CONFLICT,
                    source.filename,
                    f"a recorded resolution applies, but it is only used when the smoke checks pass: {why}",
                    resolution="rejected",
                )
                continue
        if new_bytes == source.read_bytes():
            carried(
                plan,
                RebaseItem(
                    patch.name,
                    UNCHANGED,
                    source.filename,
                    source.filename,
                    f"{source.filename} applies to {new} unchanged",
                    resolution,
                ),
            )
            continue
        carried(
            plan,
            _refreshed(
                store,
                patch,
                source,
                new,
                new_bytes,
                writes(patch),
                tried + f"replayed {source.filename} from {old} (context or line moves)",
                resolution,
                unasked=unasked(patch),
            ),
        )
    order = {p.name: n for n, p in enumerate(series.patches)}
    items.sort(key=lambda i: order[i.name])
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return RebaseReport(engine_name, str(old), str(new), tuple(items), str(root) if keep else None)


def _refreshed(
    store: Store,
    patch: Patch,
    variant: Variant,
    new: Version,
    data: bytes,
    write: bool,
    how: str,
    resolution: str | None = None,
    unasked: bool = False,
) -> RebaseItem:
    new_name = f"{new}.patch"
    generator = (patch.generated_by or {}).get("generator")
    if write and not generator:
        write_variant(store, patch, new_name, data)
        return RebaseItem(patch.name, REFRESHED, variant.filename, new_name, f"wrote {new_name}: {how}", resolution)
    # A generated patch's variants are its generator's output (tests/rebase/test_generated_variants.py
    # holds them to it): written bytes would diverge from what the generator makes.
    made = f"; {generator} makes this patch's variants: run it for {new}" if generator and write else ""
    if unasked:
        made += "; not named by --patch"
    return RebaseItem(patch.name, REFRESHED, variant.filename, new_name, f"would write {new_name}: {how}{made}", resolution)


def _commit(repo: Path, changes: Sequence[evaluate.FileChange], variant: Variant) -> None:
    _apply_changes(repo, changes)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", variant_message(variant.read_bytes()))


def _write(repo: Path, files: dict[str, bytes | None], paths: list[str]) -> None:
    for rel in paths:
        target = repo / rel
        data = files.get(rel)
        if data is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def _apply_changes(repo: Path, changes: Sequence[evaluate.FileChange]) -> None:
    _write(repo, {c.path: c.after for c in changes}, [c.path for c in changes])


def _has_staged_resolution(repo: Path) -> bool:
    return (
        bool(git(repo, "diff", "--cached", "--name-only").stdout.strip())
        or "Resolved" in git(repo, "rerere", "status", check=False).stdout
    )


def _conflict_report(repo: Path, unmerged: list[str], root: Path, patch: Patch, sha: str, keep: bool, gone: list[str]) -> dict:
    # Re-create the conflict where a person can work on it (and read the markers from there).
    worktree = root / "conflicts" / patch.name
    git(repo, "worktree", "add", "-q", "--detach", str(worktree), "HEAD")
    git(worktree, "cherry-pick", sha, check=False)
    files = []
    for rel in unmerged:
        text = (worktree / rel).read_text(errors="replace") if (worktree / rel).is_file() else ""
        lines = text.splitlines()
        regions = []
        for n, line in enumerate(lines):
            if line.startswith("<<<<<<< "):
                end = next((m for m in range(n, len(lines)) if lines[m].startswith(">>>>>>> ")), n)
                lo, hi = max(0, n - 8), min(len(lines), end + 9)
                regions.append({"line": n + 1, "text": "\n".join(lines[lo:hi])})
        files.append({"path": rel, "conflicts": regions})
    # `resolve` reads gone_upstream: a resolution that keeps such a file would create it whole.
    report = {"patch": patch.name, "files": files, "gone_upstream": gone, "worktree": str(worktree) if keep else None}
    (root / "conflicts" / f"{patch.name}.json").write_text(json.dumps(report, indent=2))
    return report
