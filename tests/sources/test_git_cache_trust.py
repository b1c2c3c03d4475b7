"""A clone in the download cache is run by git, and git runs what a repository's config names
(here `remote.origin.uploadpack`, run on every fetch): a clone whose config another user owns or may
write is cloned again, never fetched into (issue 33, item 2: nothing another user wrote runs as root)."""

from __future__ import annotations

import os
import subprocess

import pytest

from patchctl.core.errors import EnvironmentProblem
from patchctl.sources.cache import ArtifactCache
from patchctl.sources.git import open_repo

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def upstream(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    _git("-C", str(repo), "init", "-q", "-b", "main")
    (repo / "f.py").write_text("A = 1\n")
    _git("-C", str(repo), "add", "-A")
    _git("-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    return f"file://{repo}"


def _plant(cache_root, url, marker):
    """What a hostile writer of the clone's config does: an upload-pack that leaves a mark first."""
    clone = ArtifactCache(cache_root).git_clone(url)
    script = clone.parent / "evil.sh"
    script.write_text(f'#!/bin/sh\ntouch {marker}\nexec git-upload-pack "$@"\n')
    script.chmod(0o755)
    _git("--git-dir", str(clone), "config", "remote.origin.uploadpack", str(script))
    return clone


def _foreign_config(clone):
    os.chown(clone / "config", 4001, 4001)


def _writable_config(clone):
    (clone / "config").chmod(0o666)


def _foreign_clone(clone):
    os.chown(clone, 4001, 4001)


def _config_link(clone):
    real = clone.parent / "real-config"
    (clone / "config").rename(real)
    (clone / "config").symlink_to(real)


def _writable_hooks(clone):
    (clone / "hooks").chmod(0o777)


PLANTS = [_foreign_config, _writable_config, _foreign_clone, _config_link, _writable_hooks]


def test_a_clone_of_ours_is_fetched_into(upstream, tmp_path):
    """The control: the planted upload-pack runs when the config is root's own (git does what the
    config says; patchctl's check is what keeps another user's config out)."""
    marker = tmp_path / "ran"
    open_repo(upstream, tmp_path / "cache")
    _plant(tmp_path / "cache", upstream, marker)
    open_repo(upstream, tmp_path / "cache")
    assert marker.exists()


@root_only
@pytest.mark.parametrize("plant", PLANTS, ids=[p.__name__.strip("_") for p in PLANTS])
def test_a_clone_another_user_could_write_is_cloned_again(upstream, tmp_path, plant):
    marker = tmp_path / "ran"
    open_repo(upstream, tmp_path / "cache")
    clone = _plant(tmp_path / "cache", upstream, marker)
    plant(clone)
    repo = open_repo(upstream, tmp_path / "cache")
    assert not marker.exists(), "git ran the planted upload-pack as root"
    assert repo.git.config("--get", "remote.origin.uploadpack", with_exceptions=False) == ""
    assert os.stat(clone / "config").st_uid == os.geteuid()


@root_only
@pytest.mark.parametrize("plant", PLANTS, ids=[p.__name__.strip("_") for p in PLANTS])
def test_offline_a_clone_another_user_could_write_is_refused_by_name(upstream, tmp_path, plant):
    marker = tmp_path / "ran"
    open_repo(upstream, tmp_path / "cache")
    clone = _plant(tmp_path / "cache", upstream, marker)
    plant(clone)
    with pytest.raises(EnvironmentProblem) as caught:
        open_repo(upstream, tmp_path / "cache", offline=True)
    assert str(clone) in caught.value.message and not marker.exists()
