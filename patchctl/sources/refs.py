"""`EngineRef`: what `ENGINE[@VERSION]` names, as data. Below every kind of upstream, so that the kinds,
the resolved `Upstream` (sources/fetch.py) and the parser (sources/spec.py) all name it without a
circle. A ref prints itself through its kind's `suffix` (the inverse of the kind's parse), which the
kinds' registry (sources/registry.py) enters in KIND_SUFFIX as it loads, as pip's `vcs.register` does:
refs are made by `spec.parse_spec` or imported from `spec`, which loads the registry first."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from packaging.version import Version

from patchctl.core.engines import Engine

# kind name -> what follows the engine's name in str(ref); filled by sources/registry.py
KIND_SUFFIX: dict[str, Callable[[EngineRef], str]] = {}


class EngineRef(NamedTuple):
    engine: Engine
    kind: str  # a kind's name (sources/registry.py); "installed" when no VERSION was given
    version: Version | None = None  # for "exact"
    git_ref: str | None = None  # for "git"; the commit for "commit"
    path: str | None = None  # for "path" (a directory) and "file" (a wheel or sdist)

    def __str__(self) -> str:
        return self.engine.name + KIND_SUFFIX[self.kind](self)
