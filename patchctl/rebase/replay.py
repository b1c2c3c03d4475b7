"""Carry the series onto a new upstream version, the rebase-helper way: the old pristine base as a
git repo, each patch a commit on it, the commits replayed one by one onto the new pristine version
(`git rebase --onto`, done pick by pick so each patch is classified on its own), with git's rerere
remembering how a person resolved a conflict, and a search for code that moved to another file."""
from __future__ import annotations

import email
import json
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from patchctl import gitutil
from patchctl import outcomes as O
from patchctl.engine import evaluate as engine_apply
from patchctl.engine import relocate as relocate
from patchctl.engine.hunks import parse_variant
from patchctl.engines import get_engine
from patchctl.errors import UsageError
from patchctl.gitutil import git
from patchctl.rebase.rerere import rerere_dir
from patchctl.sources import fetch
from patchctl.sources.base import DirectorySource
from patchctl.store import Patch, Store, choose_variant, write_variant

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
    body = message.get_payload() if isinstance(message.get_payload(), str) else ""
    body = body.split("\n---\n", 1)[0].strip()
    return subject + ("\n\n" + body if body else "")


def rebase(engine_name: str, store: Store, new: Version, ctx: fetch.SourceContext, *, old: Version | None = None,
           workdir: Path | None = None, write: bool = True, verify=None) -> RebaseReport:
    """verify(patch, version) -> (ok, reason): smoke checks that gate a reused resolution."""
    engine = get_engine(engine_name)
    series = store.series(engine_name)
    items: list[RebaseItem] = []
    replay: list[tuple[Patch, object]] = []
    for patch in series.patches:
        choice = choose_variant(patch, new)
        if choice.variant is None:
            items.append(RebaseItem(patch.name, OBSOLETE, None, None, choice.reason))
        else:
            replay.append((patch, choice.variant))
    if not replay:
        return RebaseReport(engine_name, str(old or ""), str(new), tuple(items), None)
    old = old or max(v.base for _, v in replay)
    if old > new:
        raise UsageError(f"--from {old} is newer than --onto {new}")
    parsed = {p.name: parse_variant(v.path.read_bytes(), str(v.path)) for p, v in replay}
    paths = sorted({path for pv in parsed.values() for path in pv.paths})
    old_src = fetch.release(engine, old, ctx)
    new_src = fetch.release(engine, new, ctx)
    old_src.prefetch(paths)
    new_src.prefetch(paths)

    keep = workdir is not None
    root = Path(workdir) if keep else Path(tempfile.mkdtemp(prefix="patchctl-rebase-"))
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
    commits: list[tuple[Patch, object, str]] = []
    done: dict[str, engine_apply.PatchOutcome] = {}
    for patch, variant in replay:
        result = engine_apply.evaluate((patch,), old, DirectorySource(repo), earlier=done)
        outcome = result.outcomes[0]
        done[patch.name] = outcome
        if outcome.outcome not in O.WRITES:
            items.append(RebaseItem(patch.name, CONFLICT if outcome.outcome == O.CONFLICT else OBSOLETE,
                                    variant.filename, None, f"on its own base {old}: {outcome.reason}"))
            continue
        _apply_changes(repo, result.changes)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", variant_message(variant.path.read_bytes()))
        commits.append((patch, variant, git(repo, "rev-parse", "HEAD").stdout.strip()))

    git(repo, "checkout", "-q", "-b", "upstream-new", old_commit)
    new_files = {p: new_src.read(p) for p in paths}
    _write(repo, new_files, paths)
    gitutil.commit_all(repo, f"upstream {new}")
    git(repo, "checkout", "-q", "-b", "rebased")

    full_cache = []

    def full_new():
        # Relocation searches the whole new package: one download beats thousands of range reads.
        if not full_cache:
            source = fetch.release(engine, new, ctx, prefer_sdist=True)
            source.sparse = False
            full_cache.append(source)
        return full_cache[0]

    failed: set[str] = set()
    for patch, variant, sha in commits:
        blocked = [d for d in patch.depends_on if d in failed]
        if blocked:
            failed.add(patch.name)
            items.append(RebaseItem(patch.name, CONFLICT, variant.filename, None,
                                    f"depends on {blocked[0]}, which did not carry over"))
            continue
        gone = [fp.path for fp in parsed[patch.name].files if not fp.is_new and new_files.get(fp.path) is None]
        if gone:
            proposals = relocate.propose(parsed[patch.name], full_new(), engine, gone)
            failed.add(patch.name)
            items.append(RebaseItem(patch.name, OBSOLETE, variant.filename, None,
                                    f"target file gone in {new}: {', '.join(gone)}"
                                    + ("; relocation proposed" if proposals else ""), relocations=tuple(proposals)))
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
                conflict = _conflict_report(repo, unmerged, root, patch, sha, keep)
                proposals = relocate.propose(parsed[patch.name], full_new(), engine, unmerged)
                failed.add(patch.name)
                items.append(RebaseItem(patch.name, CONFLICT, variant.filename, None,
                                        f"conflicts in {', '.join(unmerged) or 'the replay'}", conflict=conflict,
                                        relocations=tuple(proposals)))
                continue
        if not git(repo, "diff", "--name-only", "HEAD~1", "HEAD").stdout.strip():
            items.append(RebaseItem(patch.name, UPSTREAMED, variant.filename, None,
                                    f"replaying it onto {new} changes nothing: the patched result is identical"))
            continue
        new_bytes = gitutil.format_patch(repo)
        if resolution == "reused" and verify is not None:
            ok, why = verify(patch, new, new_bytes)
            if not ok:
                failed.add(patch.name)
                items.append(RebaseItem(patch.name, CONFLICT, variant.filename, None,
                                        f"a recorded resolution applies, but it is only used when the smoke checks pass: {why}",
                                        resolution="rejected"))
                git(repo, "reset", "-q", "--hard", "HEAD~1")
                continue
        if new_bytes == variant.path.read_bytes():
            items.append(RebaseItem(patch.name, UNCHANGED, variant.filename, variant.filename,
                                    f"{variant.filename} applies to {new} unchanged", resolution))
            continue
        new_name = f"{new}.patch"
        if write:
            write_variant(store, patch, new_name, new_bytes)
        items.append(RebaseItem(patch.name, REFRESHED, variant.filename, new_name,
                                ("wrote " if write else "would write ") + f"{new_name} (context or line moves)",
                                resolution))
    order = {p.name: n for n, p in enumerate(series.patches)}
    items.sort(key=lambda i: order[i.name])
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return RebaseReport(engine_name, str(old), str(new), tuple(items), str(root) if keep else None)


def _write(repo: Path, files: dict[str, bytes | None], paths: list[str]) -> None:
    for rel in paths:
        target = repo / rel
        data = files.get(rel)
        if data is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def _apply_changes(repo: Path, changes) -> None:
    _write(repo, {c.path: c.after for c in changes}, [c.path for c in changes])


def _has_staged_resolution(repo: Path) -> bool:
    return bool(git(repo, "diff", "--cached", "--name-only").stdout.strip()) or "Resolved" in git(
        repo, "rerere", "status", check=False).stdout


def _conflict_report(repo: Path, unmerged: list[str], root: Path, patch: Patch, sha: str, keep: bool) -> dict:
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
    report = {"patch": patch.name, "files": files, "worktree": str(worktree) if keep else None}
    (root / "conflicts" / f"{patch.name}.json").write_text(json.dumps(report, indent=2))
    return report
