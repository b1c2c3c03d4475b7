"""`ENGINE[@VERSION]` → EngineRef.

VERSION is an exact PEP 440 version, `latest`, `nightly`, `git:REF`, `commit:SHA`, or a local
directory (anything containing a path separator, or starting with `.` or `~`).

`commit:SHA` (7 to 40 hex digits) names the build of one upstream commit on the engine's nightly
wheel index: vLLM's `<root>/<SHA>/` (e.g. `vllm@commit:2f3f441f8`). For a git nightly source (SGLang) it
is the same as `git:SHA`.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

from packaging.version import InvalidVersion, Version

from patchctl.engines import Engine, get_engine
from patchctl.errors import UsageError

KINDS = ("installed", "exact", "latest", "nightly", "git", "commit", "path")

_SHA = re.compile(r"[0-9a-f]{7,40}")


class EngineRef(NamedTuple):
    engine: Engine
    kind: str  # one of KINDS; "installed" when no VERSION was given
    version: Version | None = None  # for "exact"
    git_ref: str | None = None  # for "git"; the commit for "commit"
    path: str | None = None  # for "path"

    def __str__(self) -> str:
        suffix = {
            "installed": "",
            "exact": f"@{self.version}",
            "latest": "@latest",
            "nightly": "@nightly",
            "git": f"@git:{self.git_ref}",
            "commit": f"@commit:{self.git_ref}",
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
    if rest.startswith("commit:"):
        sha = rest[7:].lower()
        if not _SHA.fullmatch(sha):
            raise UsageError(f"bad spec {text!r}: commit: needs a commit hash of 7 to 40 hex digits, "
                             f"e.g. {name}@commit:2f3f441f8")
        return EngineRef(engine, "commit", git_ref=sha)
    if os.sep in rest or rest.startswith((".", "~")):
        return EngineRef(engine, "path", path=os.path.expanduser(rest))
    try:
        version = Version(rest)
    except InvalidVersion:
        raise UsageError(
            f"bad spec {text!r}: {rest!r} is not a PEP 440 version, 'latest', 'nightly', "
            "'git:REF', 'commit:SHA' or a directory"
        ) from None
    return EngineRef(engine, "exact", version=version)
