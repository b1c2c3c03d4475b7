"""The state record's types and their codec: what patchctl did to a target (StateRecord and its
parts), one file change of a journaled write (Change), and the sealed document both state.json and
journal.json are (a sha256 over the canonical content, so truncation or an edit is detected).

Which on-disk format a document is in (its `schema` tag) is upgrade.py's alone: `to_json` writes the
body without it, and `from_json` reads a body upgrade.py has checked and brought to today's format.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.core.errors import StateDamaged
from patchctl.core.yamlio import load_json


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


class FileRecord(NamedTuple):
    path: str
    pristine_sha256: str | None  # None: the patch set created the file
    patched_sha256: str | None  # None: the patch set deleted the file
    pristine_mtime_ns: int | None = None  # restored by revert, so the bytecode below is valid again
    bytecode: tuple[tuple[str, str], ...] = ()  # (path, blob sha256) of the pristine file's .pyc files


class StoreRef(NamedTuple):
    """A store a record's patches came from: its folder, and `bundled` (the patch set shipped with
    patchctl, found again wherever patchctl is installed now) or `user` (a folder of the user's)."""

    path: str
    kind: str  # bundled | user

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> StoreRef | None:
        return None if data is None else cls(data["path"], data["kind"])


class PatchRecord(NamedTuple):
    name: str
    outcome: str
    variant: str | None
    store: StoreRef | None = None  # where the patch came from (None: adopted by `new` with no store)
    sha256: str | None = None  # of the variant applied: its fingerprint

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": self.outcome,
            "variant": self.variant,
            "store": self.store._asdict() if self.store else None,
            "sha256": self.sha256,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchRecord:
        return cls(data["name"], data["outcome"], data["variant"], StoreRef.from_json(data["store"]), data["sha256"])


class Selection(NamedTuple):
    """Which patches of the series were chosen: `patches` (apply --patch; None: every patch of the
    series) less `exclude` (apply --exclude). Recorded, so `ensure` keeps the choice."""

    patches: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"patches": None if self.patches is None else list(self.patches), "exclude": list(self.exclude)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Selection:
        if data is None:
            return cls()
        chosen = data.get("patches")
        return cls(None if chosen is None else tuple(chosen), tuple(data.get("exclude") or ()))

    @property
    def everything(self) -> bool:
        return self.patches is None and not self.exclude


class BuildRecord(NamedTuple):
    """Which build of the engine the patches were applied to: enough to tell one nightly from another.
    kind: `wheel` (a wheel URL from a wheel index: vLLM's nightlies), `git` (a commit built from its
    repository: SGLang's main), `release` (ENGINE==VERSION from the package index), `file` (a wheel or
    sdist on disk, ENGINE@file:PATH), `installed` (found installed, not installed by patchctl: what its
    dist-info says). The kinds of upstream
    (sources/kinds/) say which, in PinnedBuild.kind."""

    kind: str
    version: str
    commit: str | None = None  # from the local version (+g<sha>) or the git commit installed
    url: str | None = None  # what was installed from: the wheel's URL, git+URL@SHA, or direct_url.json's url
    artifact: str | None = None  # the wheel's file name
    sha256: str | None = None  # of the artifact, where patchctl fetched it whole (an index without hashes)
    record_sha256: str | None = None  # of the wheel's RECORD, where patchctl read it (the files it vouches for)
    index_url: str | None = None  # the index page the build was resolved from
    spec: str | None = None  # what was asked for: vllm@nightly, vllm@commit:SHA, sglang@git:main
    installer: str | None = None  # uv or pip, when patchctl installed it

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> BuildRecord | None:
        if data is None:
            return None
        return cls(data["kind"], data["version"], *(data.get(k) for k in cls._fields[2:]))


class StateRecord(NamedTuple):
    engine: str
    root: str
    version: str
    applied_at: float
    patches: tuple[PatchRecord, ...]
    files: tuple[FileRecord, ...]
    store_fingerprint: str | None = None  # series + patch metadata applied: ensure's no-op test
    build: BuildRecord | None = None  # which build was patched (None: not known)
    stores: tuple[StoreRef, ...] = ()  # the stores applied from, highest priority first
    selection: Selection = Selection()

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "root": self.root,
            "version": self.version,
            "applied_at": self.applied_at,
            "store_fingerprint": self.store_fingerprint,
            "patches": [p.to_json() for p in self.patches],
            "files": [dict(f._asdict(), bytecode=[list(b) for b in f.bytecode]) for f in self.files],
            "build": self.build._asdict() if self.build else None,
            "stores": [s._asdict() for s in self.stores],
            "selection": self.selection.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StateRecord:
        return cls(
            engine=data["engine"],
            root=data["root"],
            version=data["version"],
            applied_at=data["applied_at"],
            store_fingerprint=data["store_fingerprint"],
            patches=tuple(PatchRecord.from_json(p) for p in data["patches"]),
            files=tuple(
                FileRecord(
                    f["path"],
                    f["pristine_sha256"],
                    f["patched_sha256"],
                    f["pristine_mtime_ns"],
                    tuple((b[0], b[1]) for b in f["bytecode"]),
                )
                for f in data["files"]
            ),
            build=BuildRecord.from_json(data["build"]),
            stores=tuple(StoreRef(s["path"], s["kind"]) for s in data["stores"]),
            selection=Selection.from_json(data["selection"]),
        )


class Change(NamedTuple):
    """One file to replace: its bytes before and after (None: absent), and what to leave beside it
    after: the source's mtime (None: now) and the .pyc files to put back (revert restores them)."""

    path: str
    before: bytes | None
    after: bytes | None
    after_mtime_ns: int | None = None
    after_bytecode: tuple[tuple[str, str], ...] = ()


def seal(kind: str, body: dict[str, Any]) -> bytes:
    """A document with a sha256 over its canonical content: truncation or an edit is detected."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"sha256": hashlib.sha256(canonical.encode()).hexdigest(), kind: body}, indent=1).encode()


def damaged(where: Path, what: str, hint: str) -> StateDamaged:
    return StateDamaged(f"{where} is damaged ({what}); patchctl will not guess what it did", hint=hint)


def unseal(kind: str, raw: bytes, where: Path, hint: str) -> dict[str, Any]:
    """The body of a sealed document, its checksum checked (its format is upgrade.py's to check)."""
    try:
        outer = load_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(where, f"not JSON: {exc}", hint) from None
    if not isinstance(outer, dict) or not isinstance(outer.get(kind), dict) or not isinstance(outer.get("sha256"), str):
        raise damaged(where, "not a patchctl document", hint)
    body: dict[str, Any] = outer[kind]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(canonical.encode()).hexdigest() != outer["sha256"]:
        raise damaged(where, "its checksum does not match its content", hint)
    return body
