"""Versioned rerere: a person's conflict resolution, recorded by git rerere in the conflict worktree
that `rebase --workdir` left, is copied into the store (patches/<engine>/.rerere) so that it is
reviewed and versioned with the patches, and reused by the next rebase that meets the same conflict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from packaging.version import Version

from patchctl.core import gitutil
from patchctl.core.errors import UsageError
from patchctl.core.gitutil import git
from patchctl.store.layered import Store, write_variant


def rerere_dir(store: Store, engine: str) -> Path:
    return store.root / engine / "rerere"


def record_resolution(store: Store, engine_name: str, workdir: Path, patch_name: str, new: Version) -> str:
    """After a person resolved the conflict in workdir/conflicts/<patch>: remember the resolution
    (git rerere, copied into the store so it is reviewed and versioned) and write the variant."""
    worktree = workdir / "conflicts" / patch_name
    if not worktree.is_dir():
        raise UsageError(f"no conflict worktree for {patch_name} under {workdir}")
    generator = (store.series(engine_name).get(patch_name).generated_by or {}).get("generator")
    if generator:
        # Its variants are the generator's output (tests/rebase/test_generated_variants.py holds them
        # to it): a written resolution would be deleted as stale by the next regeneration.
        raise UsageError(
            f"{engine_name}/{patch_name}'s variants are made by {generator}: carry the resolution "
            f"into its recipe and run it (the conflict worktree {worktree} shows what changed)"
        )
    leftover = git(worktree, "grep", "-n", "-e", "^<<<<<<< ", "-e", "^>>>>>>> ", check=False).stdout
    if leftover.strip():
        raise UsageError(f"conflict markers are still there:\n{leftover.strip()}")
    git(worktree, "rerere")  # records the postimage of each resolved conflict
    git(worktree, "add", "-A")
    kept = sorted(
        set(_gone_upstream(workdir, patch_name))
        & set(git(worktree, "diff", "--cached", "--name-only", "--diff-filter=A", "HEAD").stdout.split())
    )
    if kept:
        # A file the new version removed, left in the worktree, would make the variant create it whole.
        raise UsageError(
            f"{', '.join(kept)} {'is' if len(kept) == 1 else 'are'} gone upstream but still in "
            f"{worktree}: the variant would create {'it' if len(kept) == 1 else 'them'}; "
            f"`git -C {worktree} rm -qf {' '.join(kept)}` (or carry the change to where the code "
            "moved), then resolve again"
        )
    # Where the variant goes is settled before the worktree's cherry-pick is concluded, so a refusal
    # (the bundled set, no store of the user's) leaves the worktree as it was, to resolve again.
    patch = store.home_for_writing(store.series(engine_name).get(patch_name))
    if git(worktree, "rev-parse", "-q", "--verify", "CHERRY_PICK_HEAD", check=False).returncode == 0:
        git(worktree, "-c", "core.editor=true", "cherry-pick", "--continue")
    data = gitutil.format_patch(worktree)
    filename = f"{new}.patch"
    write_variant(store, patch, filename, data)
    common = Path(git(worktree, "rev-parse", "--git-common-dir").stdout.strip())
    if not common.is_absolute():
        common = worktree / common
    cache = common / "rr-cache"
    if cache.is_dir():
        shutil.copytree(cache, rerere_dir(store, engine_name), dirs_exist_ok=True)
    return filename


def _gone_upstream(workdir: Path, patch_name: str) -> list[str]:
    """The files rebase found gone in the new version (its conflict report; none for an older one)."""
    report = workdir / "conflicts" / f"{patch_name}.json"
    if not report.is_file():
        return []
    gone = json.loads(report.read_text(encoding="utf-8")).get("gone_upstream") or []
    return [str(path) for path in gone]
