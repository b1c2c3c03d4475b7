"""`ENGINE[@VERSION]` → EngineRef.

VERSION is an exact PEP 440 version, `latest`, `nightly`, `git:REF`, or a local directory
(anything containing a path separator, or starting with `.` or `~`).
"""
from __future__ import annotations

import os
from typing import NamedTuple

from packaging.version import InvalidVersion, Version

from patchctl.engines import Engine, get_engine
from patchctl.errors import UsageError

KINDS = ("installed", "exact", "latest", "nightly", "git", "path")


class EngineRef(NamedTuple):
    engine: Engine
    kind: str  # one of KINDS; "installed" when no VERSION was given
    version: Version | None = None  # for "exact"
    git_ref: str | None = None  # for "git"
    path: str | None = None  # for "path"

    def __str__(self) -> str:
        suffix = {
            "installed": "",
            "exact": f"@{self.version}",
            "latest": "@latest",
            "nightly": "@nightly",
            "git": f"@git:{self.git_ref}",
            "path": f"@{self.path}",
        }[self.kind]
        return self.engine.name + suffix


def parse_spec(text: str) -> EngineRef:
    name, sep, rest = text.strip().partition("@")
    if not name:
        raise UsageError(f"bad spec {text!r}: expected ENGINE[@VERSION], e.g. vllm@0.23.0")
    engine = get_engine(name)
    if not sep:
        return EngineRef(engine, "installed")
    if not rest:
        raise UsageError(f"bad spec {text!r}: nothing after '@'")
    if rest in ("latest", "nightly"):
        return EngineRef(engine, rest)
    if rest.startswith("git:"):
        ref = rest[4:]
        if not ref:
            raise UsageError(f"bad spec {text!r}: git: needs a ref, e.g. {name}@git:main")
        return EngineRef(engine, "git", git_ref=ref)
    if os.sep in rest or rest.startswith((".", "~")):
        return EngineRef(engine, "path", path=os.path.expanduser(rest))
    try:
        version = Version(rest)
    except InvalidVersion:
        raise UsageError(
            f"bad spec {text!r}: {rest!r} is not a PEP 440 version, 'latest', 'nightly', "
            "'git:REF' or a directory"
        ) from None
    return EngineRef(engine, "exact", version=version)
