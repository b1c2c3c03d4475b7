"""Deterministic git plumbing shared by rebase and the test builders: fixed identity and dates,
so the same inputs always give byte-identical commits and format-patch output."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

FIXED_ENV = {
    "GIT_AUTHOR_NAME": "patchctl",
    "GIT_AUTHOR_EMAIL": "patchctl@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "patchctl",
    "GIT_COMMITTER_EMAIL": "patchctl@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    # A user's ~/.gitconfig (diff.noprefix, format.signature, a hook path...) must not change the bytes.
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, **FIXED_ENV)
    env.pop("GIT_DIR", None)
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=check, capture_output=True, text=True)


def init(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "commit.gpgsign", "false")
    git(repo, "config", "core.autocrlf", "false")


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD").stdout.strip()


def format_patch(repo: Path, rev: str = "HEAD") -> bytes:
    out = git(repo, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index", rev)
    return out.stdout.encode()
