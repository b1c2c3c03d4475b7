"""What an image reference means: `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]` (Docker's grammar:
a first component with a dot, a colon or `localhost` is the registry, else Docker Hub) or
`oci:DIR[:TAG]` (an OCI image layout directory, skopeo's spelling). Also the one rule for plain
HTTP: loopback registries without a flag, any other only with `--insecure`."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import NamedTuple

from patchctl.core.errors import ImageRefError

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"  # where docker.io's API answers
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::[0-9]{1,5})?")
MAX_REFERENCE = 1024


class ImageRef(NamedTuple):
    registry: str | None  # host[:port]; None for an OCI layout directory
    repository: str  # library/ubuntu, team/vllm; the directory for a layout
    tag: str | None = None
    digest: str | None = None
    layout: Path | None = None  # oci:DIR

    @property
    def api_host(self) -> str:
        assert self.registry is not None  # only registry references have an API host
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def target(self) -> str:
        """The manifest to read: the digest when one was given, else the tag (default `latest`)."""
        return self.digest or self.tag or "latest"

    def with_tag(self, tag: str) -> ImageRef:
        return self._replace(tag=tag, digest=None)

    def __str__(self) -> str:
        if self.layout is not None:
            return f"oci:{self.layout}" + (f":{self.tag}" if self.tag else "")
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> ImageRef:
    """Raises ImageRefError (exit 2) for anything that is not a reference."""
    if not text or len(text) > MAX_REFERENCE or any(c.isspace() or ord(c) < 32 for c in text):
        raise ImageRefError(
            f"{text[:80]!r} is not an image reference", hint="REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST], or oci:DIR[:TAG]"
        )
    if text.startswith("oci:"):
        return _parse_layout(text[4:])
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise ImageRefError(f"{text!r}: {digest!r} is not a sha256:<64 hex> digest")
    tag = None
    head, slash, last = rest.rpartition("/")
    if ":" in last:
        last, tag = last.split(":", 1)
        if not _TAG.fullmatch(tag):
            raise ImageRefError(f"{text!r}: {tag!r} is not a tag (letters, digits, _ . -, at most 128)")
    rest = f"{head}{slash}{last}"
    parts = rest.split("/")
    registry = DOCKER_HUB
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry = parts.pop(0)
        if not _HOST.fullmatch(registry):
            raise ImageRefError(f"{text!r}: {registry!r} is not a registry host[:port]")
    if not parts or not all(_COMPONENT.fullmatch(p) for p in parts):
        raise ImageRefError(
            f"{text!r}: {'/'.join(parts)!r} is not a repository name "
            f"(lowercase letters, digits and . _ - between them, parts joined by /)"
        )
    if registry == DOCKER_HUB and len(parts) == 1:
        parts.insert(0, "library")
    return ImageRef(registry, "/".join(parts), tag, digest)


def _parse_layout(rest: str) -> ImageRef:
    if not rest:
        raise ImageRefError("oci: needs a directory: oci:DIR[:TAG]")
    path, tag = rest, None
    # oci:DIR:TAG — a colon in the last path part separates the tag (as skopeo reads it).
    head, slash, last = rest.rpartition("/")
    if ":" in last:
        name, tag = last.rsplit(":", 1)
        path = f"{head}{slash}{name}"
        if not _TAG.fullmatch(tag):
            raise ImageRefError(f"oci:{rest!r}: {tag!r} is not a tag (letters, digits, _ . -, at most 128)")
    if not path:
        raise ImageRefError(f"oci:{rest!r} names no directory")
    return ImageRef(None, path, tag, None, Path(path))


def is_loopback(registry: str) -> bool:
    """localhost, 127.0.0.0/8 and ::1, with or without a port: reached over plain HTTP without a flag,
    as Docker and crane treat them (nothing leaves the machine)."""
    host = registry
    if host.startswith("["):
        host = host[1 : host.index("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
