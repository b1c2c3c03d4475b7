"""Reading a store's files: series.yaml and each patch.yaml checked against their schemas, regular files
only and bounded, and a parsed series memoized while its files stay as they were."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier
from packaging.version import InvalidVersion

from patchctl.core.engines import get_engine
from patchctl.core.errors import EnvironmentProblem, StoreError
from patchctl.core.schemas import validate
from patchctl.core.versions import parse_specifier_set, parse_version
from patchctl.core.yamlio import load_yaml
from patchctl.store.series import PATCH_MAX_BYTES, VARIANT_RE, Patch, Series, Variant

# Store.series memo: (root as given, absolute root, engine) -> (fingerprint, Series).
_series_cache: dict[tuple[str, str, str], tuple[tuple, Series]] = {}
_series_lock = threading.Lock()
_SERIES_CACHE_MAX = 64
# A file changed this recently may change again within the filesystem's timestamp granularity
# (a jiffy on ext4, 2 s on FAT) without its stat changing: such a parse is not memoized (git's
# "racy clean" rule). The real store's files are old; tests that write a store and read it at once
# simply parse every time, as before.
_RACY_NS = 2_000_000_000


def clear_series_cache() -> None:
    """Forget every memoized series (benchmarks that want a new process's cost)."""
    with _series_lock:
        _series_cache.clear()


def _stat(path: Path) -> tuple[int, int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)


def _fingerprint(series_file: Path, series: Series) -> tuple:
    """What a parse of the series read: series.yaml, and each patch's folder (its variant files'
    names) and patch.yaml. A variant's content is read when used, never memoized."""
    return (_stat(series_file),) + tuple((_stat(p.directory), _stat(p.directory / "patch.yaml")) for p in series.patches)


def _settled(fingerprint: tuple, started_ns: int) -> bool:
    stats = [fingerprint[0]] + [s for pair in fingerprint[1:] for s in pair]
    return all(s is None or max(s[0], s[1]) < started_ns - _RACY_NS for s in stats)


_HINT = "see docs/patch-format.md"


def has_series(path: Path) -> bool:
    """Whether series.yaml is there; a FIFO, a device or a folder in its place is EnvironmentProblem
    (exit 3) naming it: skipped, it made a store look empty to lint and apply without a word."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise EnvironmentProblem(f"{path}: cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path)
    return True


def _not_regular(path: Path) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"{path} is not a regular file (a FIFO, a device, a socket or a folder): patchctl "
        f"reads store files from regular files only",
        hint="replace it with the file, or remove it",
    )


def _read_store_file(path: Path) -> bytes:
    """A store YAML file's bytes: one descriptor, opened without waiting (a FIFO swapped in after the
    check above would hang the read), a regular file of at most PATCH_MAX_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise EnvironmentProblem(f"{path}: cannot be read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _not_regular(path)
        data = f.read(PATCH_MAX_BYTES + 1)
    if len(data) > PATCH_MAX_BYTES:
        raise StoreError(f"{path}: more than a store file may have ({PATCH_MAX_BYTES} bytes)")
    return data


def load_store_yaml(path: Path) -> Any:  # a YAML document: its shape is checked by the caller's schema
    raw = _read_store_file(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreError(
            f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})", hint="store files are UTF-8 YAML"
        ) from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise StoreError(f"{path}: not valid YAML: {exc}") from None


def _load_patch(engine: str, directory: Path, pins: dict) -> Patch:
    meta_file = directory / "patch.yaml"
    if not meta_file.is_file():
        raise StoreError(f"{meta_file} is missing (listed in {engine}/series.yaml)")
    meta = load_store_yaml(meta_file) or {}
    if not isinstance(meta, dict):
        raise StoreError(f"{meta_file}: expected a mapping")
    for key in ("title", "applies_to"):
        if not meta.get(key):
            raise StoreError(f"{meta_file}: '{key}' is required")
    # The checks with messages of their own first; then the schema (patchctl/core/schemas/patch.json)
    # for every other key's type, so that what follows reads well-typed values.
    generated_by = _generated_by(meta_file, meta.get("generated_by"))
    drop_when = meta.get("drop_when")
    if drop_when is not None and not _drop_rule_ok(drop_when):
        raise StoreError(f"{meta_file}: drop_when {drop_when!r} must be 'upstreamed' or a requirement like 'vllm>=0.24'")
    validate("patch", meta, str(meta_file), hint=_HINT)
    try:
        applies_to = parse_specifier_set(meta["applies_to"])
    except InvalidSpecifier:
        raise StoreError(f"{meta_file}: applies_to {meta['applies_to']!r} is not a PEP 440 specifier set") from None
    for req in meta.get("requires") or ():
        try:
            _requirement(req)
        except (InvalidRequirement, InvalidSpecifier):
            raise StoreError(f"{meta_file}: requires entry {req!r} is not a valid requirement") from None
    upstreamed_in = None
    if meta.get("upstreamed_in"):
        try:
            upstreamed_in = parse_specifier_set(meta["upstreamed_in"])
        except InvalidSpecifier:
            raise StoreError(f"{meta_file}: upstreamed_in {meta['upstreamed_in']!r} is not a PEP 440 specifier set") from None
    variants = []
    for file in sorted(directory.glob("*.patch")):
        match = VARIANT_RE.match(file.name)
        try:
            base = parse_version(match["base"]) if match else None
        except InvalidVersion:
            base = None
        if base is None:
            raise StoreError(f"{file}: variant files are named <base-version>.patch")
        if not file.is_file():
            raise StoreError(f"{file}: a variant must be a file")
        variants.append(Variant(base, file, pins.get(file.name)))
    unknown_pins = set(pins) - {v.filename for v in variants}
    if unknown_pins:
        raise StoreError(f"{engine}/series.yaml pins missing variant files of {directory.name}: {sorted(unknown_pins)}")
    variants.sort(key=lambda v: v.base)
    return Patch(
        engine=engine,
        name=directory.name,
        directory=directory,
        title=str(meta["title"]),
        why=str(meta.get("why") or "").strip(),
        upstream=tuple(meta.get("upstream") or ()),
        applies_to=applies_to,
        drop_when=drop_when,
        requires=tuple(meta.get("requires") or ()),
        depends_on=tuple(meta.get("depends_on") or ()),
        smoke=dict(meta.get("smoke") or {}),
        evidence=dict(meta.get("evidence") or {}),
        variants=tuple(variants),
        upstreamed_in=upstreamed_in,
        generated_by=generated_by,
        overrides=bool(meta.get("overrides", False)),
    )


def _drop_rule_ok(value: object) -> bool:
    """drop_when: "upstreamed", or `<dist><specifier>` that drop_rule_met can check against a version."""
    if value == "upstreamed":
        return True
    if not isinstance(value, str):
        return False
    try:
        req = _requirement(value)
    except (InvalidRequirement, InvalidSpecifier):
        return False
    return bool(req.specifier) and req.url is None and req.marker is None


def _generated_by(meta_file: Path, value: object) -> dict | None:
    """patch.yaml `generated_by`: {generator: path, sources: [path, ...]} (paths relative to the
    store's parent folder), or absent."""
    if value is None:
        return None
    shape = "generated_by must be a mapping {generator: PATH, sources: [PATH, ...]}"
    if not isinstance(value, dict):
        raise StoreError(f"{meta_file}: {shape}")
    unknown = sorted(set(map(str, value)) - {"generator", "sources"})
    if unknown:
        raise StoreError(f"{meta_file}: generated_by has unknown key(s) {', '.join(unknown)}: {shape}")
    generator, sources = value.get("generator"), value.get("sources")
    if not isinstance(generator, str) or not generator.strip():
        raise StoreError(f"{meta_file}: generated_by.generator must name the script that makes the variants")
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s.strip() for s in sources):
        raise StoreError(f"{meta_file}: generated_by.sources must list the files the variants are made from")
    return {"generator": generator, "sources": list(sources)}


def _requirement(text: str) -> Requirement:
    """Requirement(text) with its versions bounded (patchctl/core/versions.py)."""
    req = Requirement(text)
    parse_specifier_set(str(req.specifier))
    return req


def read_series(root: Path, engine: str) -> Series:
    """The engine's series in one store folder, parsed once per process: later calls return the same Series for as
    long as series.yaml, the patch folders and their patch.yaml are unchanged (by stat)."""
    get_engine(engine)
    key = (str(root), os.path.abspath(root), engine)
    series_file = root / engine / "series.yaml"
    cached = _series_cache.get(key)
    if cached is not None and cached[0] == _fingerprint(series_file, cached[1]):
        return cached[1]
    started = time.time_ns()
    series = _parse_series(root, engine)
    fingerprint = _fingerprint(series_file, series)
    if _settled(fingerprint, started):
        with _series_lock:
            _series_cache[key] = (fingerprint, series)
            while len(_series_cache) > _SERIES_CACHE_MAX:
                _series_cache.pop(next(iter(_series_cache)))
    return series


def _parse_series(root: Path, engine: str) -> Series:
    directory = root / engine
    series_file = directory / "series.yaml"
    if not has_series(series_file):
        return Series(engine, directory, ())
    data = load_store_yaml(series_file)
    if not isinstance(data, dict) or not isinstance(data.get("patches"), list):
        raise StoreError(f"{series_file}: expected a mapping with a 'patches' list")
    if data.get("engine", engine) != engine:
        raise StoreError(f"{series_file}: says engine {data.get('engine')!r}, lies under {engine!r}")
    for entry in data["patches"]:
        if not isinstance(entry, dict) or "name" not in entry:
            raise StoreError(f"{series_file}: every entry needs a 'name'")
        if not isinstance(entry.get("variants") or {}, dict):
            raise StoreError(f"{series_file}: {entry['name']}: 'variants' must map file -> sha256")
    validate("series", data, str(series_file), hint=_HINT)
    patches = [_load_patch(engine, directory / entry["name"], entry.get("variants") or {}) for entry in data["patches"]]
    names = [p.name for p in patches]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise StoreError(f"{series_file}: patches listed twice: {', '.join(sorted(dupes))}")
    since = data.get("matrix_since")
    try:
        since = parse_version(str(since)) if since else None
    except InvalidVersion:
        raise StoreError(f"{series_file}: matrix_since {since!r} is not a version") from None
    return Series(engine, directory, tuple(patches), since)
