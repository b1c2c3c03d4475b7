"""Files at a git ref, read with `git show` (no checkout); remote repositories are cloned once,
partially (blobs fetched on demand), into the cache."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

import git

from patchctl.core.errors import EnvironmentProblem, NetworkError, UsageError
from patchctl.sources.cache import ArtifactCache, Damaged
from patchctl.sources.files import Provenance


def _is_local(repo: str) -> bool:
    return Path(repo).expanduser().exists()


def _untrusted_clone(cache: ArtifactCache, clone: Path) -> str | None:
    """Why a clone in the cache may not be run by git: git runs commands its `config` names
    (credential.helper, core.sshCommand, uploadpack), so the folders down to it, the clone itself
    and the files git reads its settings and hooks from must be the running user's or root's and
    writable by no one else, as a smoke venv's (issue 33, item 2). None: it may be used."""
    why = cache.foreign(clone)
    if why:
        return why
    me = os.geteuid()
    for name in ("config", "hooks", "info", "objects/info/alternates", "commondir", "packed-refs"):
        try:
            st = os.lstat(clone / name)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            return f"{clone / name} is a symlink"
        if st.st_uid not in (0, me):
            return f"{clone / name} belongs to uid {st.st_uid}, not to root or to you"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{clone / name} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


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
        why = _untrusted_clone(cache, clone) if cloned else None
        if why:  # git runs what a repository's config names (credential helpers, ssh commands)
            if offline:
                raise EnvironmentProblem(
                    f"patchctl runs no git in {clone}: {why}",
                    hint="set PATCHCTL_CACHE_DIR to a folder of yours (or root's) that "
                    "others cannot write, or go online to clone it again",
                )
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
