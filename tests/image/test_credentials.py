"""Which stored login a registry gets: REGISTRY_AUTH_FILE first, then $DOCKER_CONFIG/config.json
(or ~/.docker/config.json); Docker Hub under its historical key; helpers named, never run."""

from __future__ import annotations

import base64
import json

import pytest

from patchctl.core.errors import RegistryError
from patchctl.image.auth import credentials_for, helper_for


def write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def token(user, password):
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_auth_file_first_then_docker_config(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    (tmp_path / "docker").mkdir()
    write(
        tmp_path / "docker" / "config.json",
        {"auths": {"reg.example": {"auth": token("d", "1")}, "https://index.docker.io/v1/": {"auth": token("hub", "2")}}},
    )
    assert credentials_for("reg.example")[:2] == ("d", "1")
    assert credentials_for("docker.io")[:2] == ("hub", "2")
    assert credentials_for("other.example") is None
    monkeypatch.setenv(
        "REGISTRY_AUTH_FILE", str(write(tmp_path / "auth.json", {"auths": {"reg.example": {"auth": token("p", "3")}}}))
    )
    assert credentials_for("reg.example")[:2] == ("p", "3")


def test_damaged_files_are_exit_3_and_helpers_are_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    write(tmp_path / "config.json", {"auths": {"reg.example": {"auth": "!!"}}, "credHelpers": {"gcr.io": "gcloud"}})
    with pytest.raises(RegistryError) as info:
        credentials_for("reg.example")
    assert info.value.exit_code == 3
    assert helper_for("gcr.io").startswith("docker-credential-gcloud")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RegistryError):
        credentials_for("reg.example")
