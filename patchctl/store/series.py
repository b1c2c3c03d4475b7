"""A patch series as data: its patches, their variants, which variant fits a version, and whether a
patch's drop rule is met. Read from disk by store/reading.py, layered by store/layered.py."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchctl.core.errors import StoreError

VARIANT_RE = re.compile(r"^(?P<base>.+)\.patch$")
# The most a variant file may hold (docs/limits.md): the largest real variant is about 55 KB; a file
# past this is refused before it is read whole, so a huge one costs no memory.
PATCH_MAX_BYTES = 8 << 20


def read_variant_bytes(path: Path) -> bytes:
    """A variant file's bytes: a regular file of at most PATCH_MAX_BYTES (StoreError otherwise),
    read through one descriptor so that what was checked is what is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise StoreError(f"{path}: cannot read the variant: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path}: a variant must be a regular file")
        if st.st_size > PATCH_MAX_BYTES:
            raise StoreError(
                f"{path}: {st.st_size} bytes, more than a patch file may have ({PATCH_MAX_BYTES} bytes)",
                hint="a variant this large is not a reviewable patch",
            )
        data = f.read(PATCH_MAX_BYTES + 1)
    if len(data) > PATCH_MAX_BYTES:
        raise StoreError(f"{path}: more than a patch file may have ({PATCH_MAX_BYTES} bytes)")
    return data


class Variant(NamedTuple):
    base: Version
    path: Path
    pinned_sha256: str | None

    @property
    def filename(self) -> str:
        return self.path.name

    def actual_sha256(self) -> str:
        return hashlib.sha256(self.read_bytes()).hexdigest()

    def read_bytes(self) -> bytes:
        return read_variant_bytes(self.path)


class Patch(NamedTuple):
    engine: str
    name: str
    directory: Path
    title: str
    why: str
    upstream: tuple[str, ...]
    applies_to: SpecifierSet
    drop_when: str | None
    requires: tuple[str, ...]
    depends_on: tuple[str, ...]
    smoke: dict
    evidence: dict
    variants: tuple[Variant, ...]  # sorted by base version
    # Versions whose upstream already behaves as patched although the code moved (so no variant
    # reverse-applies): reported `upstreamed`, proven by running the checks on the pristine tree.
    upstreamed_in: SpecifierSet | None = None
    # patch.yaml `generated_by`: the variants are made by a script, not by hand:
    # {"generator": path, "sources": [path, ...]}, paths relative to the store's parent folder.
    generated_by: dict | None = None
    # patch.yaml `overrides: true`, in a user's store: replaces the bundled patch of the same name.
    overrides: bool = False

    def in_range(self, version: Version) -> bool:
        return self.applies_to.contains(version, prereleases=True)

    def upstreamed_at(self, version: Version) -> bool:
        return self.upstreamed_in is not None and self.upstreamed_in.contains(version, prereleases=True)


class VariantChoice(NamedTuple):
    variant: Variant | None
    reason: str


class Series(NamedTuple):
    engine: str
    directory: Path
    patches: tuple[Patch, ...]
    matrix_since: Version | None = None  # the matrix covers releases from here (default: oldest claimed)

    def get(self, name: str) -> Patch:
        for patch in self.patches:
            if patch.name == name:
                return patch
        known = ", ".join(p.name for p in self.patches) or "none"
        raise StoreError(f"no patch {name!r} in the {self.engine} series (patches: {known})")


def choose_variant(patch: Patch, version: Version) -> VariantChoice:
    """The newest variant whose base is <= version, among bases inside applies_to."""
    if not patch.in_range(version):
        return VariantChoice(None, f"{version} is outside applies_to {patch.applies_to}")
    usable = [v for v in patch.variants if patch.in_range(v.base)]
    if not usable:
        return VariantChoice(None, f"no variant has a base inside applies_to {patch.applies_to}")
    below = [v for v in usable if v.base <= version]
    if below:
        chosen = below[-1]
        how = "same base" if chosen.base == version else f"newest base <= {version}"
        return VariantChoice(chosen, f"{chosen.filename}: {how}")
    chosen = usable[0]
    return VariantChoice(chosen, f"{chosen.filename}: no base <= {version}; oldest variant tried")


def drop_rule_met(patch: Patch, dist: str, version: Version) -> bool | None:
    """Whether a `dist>=X` drop_when rule holds for this version; None when not decidable here."""
    if not patch.drop_when or patch.drop_when == "upstreamed":
        return None
    req = Requirement(patch.drop_when)
    if req.name.replace("_", "-").lower() != dist.lower():
        return None
    return req.specifier.contains(version, prereleases=True)


def variant_sha256(patch: Patch, filename: str | None) -> str | None:
    """The fingerprint a record keeps of the variant applied: the sha256 of its bytes (its pin, unless
    --allow-modified applied a variant that differs from it)."""
    for variant in patch.variants:
        if variant.filename == filename:
            return variant.actual_sha256()
    return None
