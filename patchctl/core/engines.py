"""Per-engine facts, loaded from engines.yaml: the one place that knows vLLM from SGLang."""

from __future__ import annotations

import functools
from importlib import resources
from typing import NamedTuple

from packaging.version import Version

from patchctl.core.errors import EnvironmentProblem, UsageError
from patchctl.core.schemas import validate
from patchctl.core.yamlio import load_yaml


class Move(NamedTuple):
    since: Version
    engine: str
    what: str


class NightlySource(NamedTuple):
    kind: str  # "wheel-index", "git" or "none"
    url: str | None  # for a wheel index: the nightly index (<root>/nightly), variant folder included
    ref: str | None


class NightlyDefaults(NamedTuple):
    """engines.yaml's `nightly:` block: the defaults the config file and --nightly-source override."""

    kind: str
    url: str | None
    ref: str | None
    variant: str | None
    # Where one commit's wheels are ({root}: the nightly URL less /nightly, {commit}: the sha), for a
    # wheel index that publishes per-commit builds (vLLM's <root>/<SHA>/); None: it publishes none.
    commit_layout: str | None = None


class Engine(NamedTuple):
    name: str
    dist: str
    packages: tuple[str, ...]
    layouts: dict[str, str]
    git_url: str | None
    nightly: NightlyDefaults
    moved_to: tuple[Move, ...]
    smoke_env: dict[str, str] = {}
    version_package: str = ""  # the package whose version file carries the version
    version_files: tuple[str, ...] = ()  # its version files, in the order they are read
    index_url: str | None = None  # the engine's own package index (None: the configured one)
    kinds: tuple[str, ...] | None = None  # the upstream kinds it supports (None: every kind)

    def version_paths(self) -> tuple[str, ...]:
        """The files (relative to the import root) whose `__version__` names the version."""
        return tuple(f"{self.version_package}/{name}" for name in self.version_files)

    def layout_prefix(self, tree_kind: str) -> str:
        return self.layouts.get(tree_kind, "")

    def sdist_member_path(self, member: str) -> str | None:
        """An sdist member's path relative to the import root: sdists have one top directory
        (<name>-<version>/), and some keep the repository layout (SGLang's python/)."""
        if "/" not in member:
            return None
        inner = member.split("/", 1)[1]
        prefix = self.layout_prefix("git")
        return inner[len(prefix) :] if prefix and inner.startswith(prefix) else inner

    def moves_at(self, version: Version) -> tuple[Move, ...]:
        return tuple(m for m in self.moved_to if version >= m.since)


@functools.cache
def all_engines() -> dict[str, Engine]:
    """engines.yaml, checked against patchctl/core/schemas/engines.json (a broken one is a bug: exit 3)."""
    text = resources.files("patchctl.core").joinpath("engines.yaml").read_text()
    raw = validate(
        "engines",
        load_yaml(text),
        "patchctl/core/engines.yaml",
        error=EnvironmentProblem,
        hint="reinstall patchctl, or fix engines.yaml (docs/configuration.md)",
    )
    engines = {}
    for name, data in raw.items():
        nightly = data.get("nightly") or {"kind": "none"}
        engines[name] = Engine(
            name=name,
            dist=data["dist"],
            packages=tuple(data["packages"]),
            layouts=dict(data.get("layouts") or {}),
            git_url=data.get("git_url"),
            nightly=NightlyDefaults(
                nightly["kind"], nightly.get("url"), nightly.get("ref"), nightly.get("variant"), nightly.get("commit_layout")
            ),
            moved_to=tuple(Move(Version(m["from"]), m["engine"], m["what"]) for m in data.get("moved_to") or ()),
            smoke_env=dict(data.get("smoke_env") or {}),
            version_package=data["version"]["package"],
            version_files=tuple(data["version"]["files"]),
            index_url=data.get("index_url"),
            kinds=tuple(data["kinds"]) if data.get("kinds") is not None else None,
        )
    return engines


def get_engine(name: str) -> Engine:
    engines = all_engines()
    if name not in engines:
        known = ", ".join(sorted(engines))
        raise UsageError(f"unknown engine {name!r}; known engines: {known}")
    return engines[name]
