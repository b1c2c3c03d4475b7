"""Versioned rerere: a person's conflict resolution, recorded by git rerere in the conflict worktree
that `rebase --workdir` left, is copied into the store (patches/<engine>/.rerere) so that it is
reviewed and versioned with the patches, and reused by the next rebase that meets the same conflict."""
from __future__ import annotations

import shutil
from pathlib import Path

from packaging.version import Version

from patchctl import gitutil
from patchctl.errors import UsageError
from patchctl.gitutil import git
from patchctl.store import Store, write_variant


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
        raise UsageError(f"{engine_name}/{patch_name}'s variants are made by {generator}: carry the resolution "
                         f"into its recipe and run it (the conflict worktree {worktree} shows what changed)")
    leftover = git(worktree, "grep", "-n", "-e", "^<<<<<<< ", "-e", "^>>>>>>> ", check=False).stdout
    if leftover.strip():
        raise UsageError(f"conflict markers are still there:\n{leftover.strip()}")
    git(worktree, "rerere")  # records the postimage of each resolved conflict
    git(worktree, "add", "-A")
    git(worktree, "-c", "core.editor=true", "cherry-pick", "--continue")
    data = gitutil.format_patch(worktree)
    patch = store.series(engine_name).get(patch_name)
    filename = f"{new}.patch"
    write_variant(store, patch, filename, data)
    common = Path(git(worktree, "rev-parse", "--git-common-dir").stdout.strip())
    if not common.is_absolute():
        common = worktree / common
    cache = common / "rr-cache"
    if cache.is_dir():
        shutil.copytree(cache, rerere_dir(store, engine_name), dirs_exist_ok=True)
    return filename
