"""Registry credentials from the standard files, never from the command line: `REGISTRY_AUTH_FILE`
(podman, skopeo, buildah), else `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`. Only the
stored `auth` (base64 `user:password`) is read; a credential helper (`credsStore`, `credHelpers`)
is named in the refusal's hint instead of being run."""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path
from typing import NamedTuple

from patchctl.core.errors import RegistryError
from patchctl.core.yamlio import load_json
from patchctl.image.reference import DOCKER_HUB, DOCKER_HUB_API

_MAX_AUTH_FILE = 1 << 20


class Credentials(NamedTuple):
    username: str
    password: str
    source: Path  # which file they came from, for messages


def auth_files() -> list[Path]:
    files = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        files.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    docker = Path(os.environ["DOCKER_CONFIG"]) if os.environ.get("DOCKER_CONFIG") else Path.home() / ".docker"
    files.append(docker / "config.json")
    return files


def _keys(registry: str) -> list[str]:
    if registry in (DOCKER_HUB, DOCKER_HUB_API):
        return ["https://index.docker.io/v1/", "index.docker.io", DOCKER_HUB, DOCKER_HUB_API]
    return [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/"]


def credentials_for(registry: str) -> Credentials | None:
    """The first stored login for the registry, in the order of auth_files(); None: anonymous."""
    for file in auth_files():
        doc = _read(file)
        auths = _section(doc, "auths")
        for key in _keys(registry):
            entry = auths.get(key)
            if isinstance(entry, dict):
                found = _decode(entry, file, key)
                if found is not None:
                    return found
    return None


def helper_for(registry: str) -> str | None:
    """The credential helper a file names for this registry (not run: said in the hint)."""
    for file in auth_files():
        doc = _read(file)
        helpers = _section(doc, "credHelpers")
        for key in _keys(registry):
            if isinstance(helpers.get(key), str):
                return f"docker-credential-{helpers[key]} ({file})"
        if isinstance(doc.get("credsStore"), str):
            return f"docker-credential-{doc['credsStore']} ({file})"
    return None


def _section(doc: dict, key: str) -> dict:
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _read(file: Path) -> dict:
    try:
        with open(file, "rb") as f:
            raw = f.read(_MAX_AUTH_FILE + 1)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise RegistryError(f"cannot read the registry credentials in {file}: {exc.strerror}") from None
    if len(raw) > _MAX_AUTH_FILE:
        raise RegistryError(f"{file} is larger than {_MAX_AUTH_FILE} bytes: not a credentials file")
    try:
        doc = load_json(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RegistryError(f"{file} is not JSON: {exc}", hint="fix or remove it (docker login writes it)") from None
    return doc if isinstance(doc, dict) else {}


def _decode(entry: dict, file: Path, key: str) -> Credentials | None:
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credentials(entry["username"], entry["password"], file)
    auth = entry.get("auth")
    if not isinstance(auth, str) or not auth:
        return None
    try:
        user, sep, password = base64.b64decode(auth, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise RegistryError(f"{file}: the auth of {key} is not base64 of user:password") from None
    if not sep:
        raise RegistryError(f"{file}: the auth of {key} is not base64 of user:password")
    return Credentials(user, password, file)
