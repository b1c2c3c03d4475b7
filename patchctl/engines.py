"""Per-engine facts, loaded from engines.yaml: the one place that knows vLLM from SGLang."""
from __future__ import annotations

import functools
from importlib import resources
from typing import NamedTuple

from packaging.version import Version

from patchctl.errors import UsageError
from patchctl.yamlio import load_yaml


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


class Engine(NamedTuple):
    name: str
    dist: str
    packages: tuple[str, ...]
    layouts: dict[str, str]
    git_url: str | None
    nightly: NightlyDefaults
    moved_to: tuple[Move, ...]
    smoke_env: dict[str, str] = {}

    def layout_prefix(self, tree_kind: str) -> str:
        return self.layouts.get(tree_kind, "")

    def sdist_member_path(self, member: str) -> str | None:
        """An sdist member's path relative to the import root: sdists have one top directory
        (<name>-<version>/), and some keep the repository layout (SGLang's python/)."""
        if "/" not in member:
            return None
        inner = member.split("/", 1)[1]
        prefix = self.layout_prefix("git")
        return inner[len(prefix):] if prefix and inner.startswith(prefix) else inner

    def moves_at(self, version: Version) -> tuple[Move, ...]:
        return tuple(m for m in self.moved_to if version >= m.since)


@functools.cache
def all_engines() -> dict[str, Engine]:
    raw = load_yaml(resources.files("patchctl").joinpath("engines.yaml").read_text())
    engines = {}
    for name, data in raw.items():
        nightly = data.get("nightly") or {"kind": "none"}
        engines[name] = Engine(
            name=name,
            dist=data["dist"],
            packages=tuple(data["packages"]),
            layouts=dict(data.get("layouts") or {}),
            git_url=data.get("git_url"),
            nightly=NightlyDefaults(nightly["kind"], nightly.get("url"), nightly.get("ref"), nightly.get("variant")),
            moved_to=tuple(
                Move(Version(m["from"]), m["engine"], m["what"]) for m in data.get("moved_to") or ()
            ),
            smoke_env=dict(data.get("smoke_env") or {}),
        )
    return engines


def get_engine(name: str) -> Engine:
    engines = all_engines()
    if name not in engines:
        known = ", ".join(sorted(engines))
        raise UsageError(f"unknown engine {name!r}; known engines: {known}")
    return engines[name]
