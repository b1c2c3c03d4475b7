"""Files at a git ref, read with `git show` (no checkout); remote repositories are cloned once,
partially (blobs fetched on demand), into the cache."""
from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

import git

from patchctl.errors import NetworkError, UsageError
from patchctl.sources.cache import ArtifactCache, Damaged
from patchctl.sources.files import Provenance


def _is_local(repo: str) -> bool:
    return Path(repo).expanduser().exists()


def open_repo(repo: str, cache_root: Path, *, offline: bool = False, fetch: bool = True) -> git.Repo:
    if _is_local(repo):
        try:
            return git.Repo(Path(repo).expanduser(), search_parent_directories=False)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise UsageError(f"{repo} is not a git repository") from None
    cache = ArtifactCache(cache_root)
    clone = cache.git_clone(repo)
    try:
        try:
            cloned = cache.is_dir(clone)
        except Damaged:  # a symlink or a file in place of the clone: never followed, cloned again
            cache.remove(clone)
            cloned = False
        if not cloned:
            if offline:
                raise NetworkError(f"offline, and {repo} was never cloned into the cache")
            cache.make_dirs(clone.parent)
            git.Repo.clone_from(repo, clone, bare=True, multi_options=["--filter=blob:none"])
        elif fetch and not offline:
            git.Repo(clone).git.fetch("origin", "+refs/heads/*:refs/heads/*", "--tags", "--prune")
    except git.GitCommandError as exc:
        raise NetworkError(
            f"cannot clone or fetch {repo}: {_git_reason(exc)}",
            hint="check the network, or pass --repo with a local clone",
        ) from None
    return git.Repo(clone)


def _git_reason(exc: git.GitCommandError) -> str:
    """git's own 'fatal: …' line, without GitPython's wrapping."""
    text = str(exc.stderr or "").strip().strip("'").strip()
    fatal = [line for line in text.splitlines() if line.startswith(("fatal:", "error:"))]
    return (fatal[-1] if fatal else text.splitlines()[-1] if text else str(exc))[:300]


class GitSource:
    def __init__(self, repo: git.Repo, ref: str, prefix: str, description: str):
        self.repo = repo
        self.prefix = prefix
        self.description = description
        try:
            self.commit = repo.commit(ref).hexsha
        except (git.BadName, ValueError, git.GitCommandError):
            raise UsageError(f"{description}: no such ref {ref!r}") from None

    def read(self, path: str) -> bytes | None:
        proc = subprocess.run(
            ["git", "-C", self.repo.git_dir, "show", f"{self.commit}:{self.prefix}{path}"],
            capture_output=True,
        )
        return proc.stdout if proc.returncode == 0 else None

    def prefetch(self, paths: Iterable[str]) -> None:
        pass

    def provenance(self) -> Provenance:
        return Provenance("git", f"{self.description}@{self.commit[:12]}", None)
