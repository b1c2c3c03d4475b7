"""The patch store: series order, metadata, variant choice for a version, integrity, which patches a
--patch/--exclude choice takes (with their depends_on), and the stores a tree's record names."""
from __future__ import annotations

import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patchctl.core.atomic import write_atomic
from patchctl.core.engines import all_engines, get_engine
from patchctl.core.errors import EnvironmentProblem, StoreError, UsageError
from patchctl.core.schemas import validate
from patchctl.core.versions import parse_specifier_set, parse_version
from patchctl.core.yamlio import dump_yaml, load_yaml

VARIANT_RE = re.compile(r"^(?P<base>.+)\.patch$")
# The most a variant file may hold (README, Limits): the largest real variant is about 55 KB; a file
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
            raise StoreError(f"{path}: {st.st_size} bytes, more than a patch file may have ({PATCH_MAX_BYTES} bytes)",
                             hint="a variant this large is not a reviewable patch")
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


def default_store_dir() -> Path:
    """The bundled patch set (in the package, or the checkout's patches/): never the current directory,
    whose patches/ belongs to patch-package or quilt."""
    from patchctl.core.bundled import bundled_store

    found = bundled_store()
    if found is None:
        raise StoreError("this patchctl has no bundled patch set", hint="reinstall it, or pass --store DIR")
    return found


def user_store_dirs(flags: list[str] | tuple[str, ...] = ()) -> list[Path]:
    """The user's stores, highest priority first: --store flags, then PATCHCTL_STORE (a path list),
    then `stores:` in the config file."""
    from patchctl.core.config import load_config

    paths = [Path(f) for f in flags]
    paths += [Path(p) for p in os.environ.get("PATCHCTL_STORE", "").split(os.pathsep) if p]
    paths += [Path(os.path.expanduser(p)) for p in load_config().get("stores") or ()]
    return list(dict.fromkeys(paths))


class Store(NamedTuple):
    """One store (`root`), or the user's stores layered over the bundled one (`layers`, highest
    priority first; `root` is the first). A patch name in two layers is an error naming both, unless
    the higher one's patch.yaml says `overrides: true`; the bundled series comes first in apply order,
    the user's patches after it (they may depend on bundled ones)."""

    root: Path
    layers: tuple[Path, ...] = ()
    # The layers a command may write into (rebase, resolve, pin, new, refresh): the stores the user
    # named. None: every layer (a Store built directly, for a root its caller chose). The bundled patch
    # set is never one of them inside an installed package (pip does not know files written there), and
    # in a source checkout only when named (--store <checkout>/patches).
    writable: tuple[Path, ...] | None = None

    @classmethod
    def open(cls, root: str | Path | None = None) -> Store:
        path = Path(root) if root else default_store_dir()
        if not path.is_dir():
            raise StoreError(
                f"patch store {path} does not exist",
                hint="pass --store DIR or set PATCHCTL_STORE",
            )
        named = (path,) if root and _may_write(path) else ()
        return cls(path, (path,), named)

    @classmethod
    def layered(cls, flags: list[str] | tuple[str, ...] = (), *, bundled: bool = True) -> Store:
        """The CLI's store: the user's stores over the bundled one (`bundled=False` or PATCHCTL_BUNDLED=0
        leave it out, which only means something when the user has a store)."""
        users = user_store_dirs(flags)
        for path in users:
            if not path.is_dir():
                raise StoreError(f"patch store {path} does not exist",
                                 hint="create it (patchctl new writes one), or fix --store / PATCHCTL_STORE")
        keep_bundled = bundled and os.environ.get("PATCHCTL_BUNDLED", "1") != "0"
        layers = users + ([default_store_dir()] if keep_bundled or not users else [])
        layers = list(dict.fromkeys(p.resolve() for p in layers))
        named = tuple(p for p in dict.fromkeys(u.resolve() for u in users) if _may_write(p))
        return cls(layers[0], tuple(layers), named)

    def single_layers(self) -> list[Store]:
        return [Store(layer, (layer,)) for layer in (self.layers or (self.root,))]

    def may_write(self, root: Path) -> bool:
        """Whether commands may write into the store at root (see `writable`)."""
        if self.writable is None:
            return _may_write(root)
        return any(_same_dir(root, w) for w in self.writable)

    def home_for_writing(self, patch: Patch) -> Patch:
        """The patch as it lives in a store commands may write: itself, when its store is one; else a
        copy in the user's first writable store that overrides it (`overrides: true`, its patch.yaml
        and pinned variants copied), so a rebased bundled patch lands beside the user's own patches."""
        if self.may_write(self.store_of(patch)):
            return patch
        users = [w for w in (self.writable or ())]
        if not users:
            raise StoreError(
                f"{patch.engine}/{patch.name} is in {_describe(self.store_of(patch))}, which patchctl does not write",
                hint="name a store of yours: --store DIR (it is created) or PATCHCTL_STORE; in a source checkout, "
                     "--store <checkout>/patches writes the bundled patch set itself")
        return _override_copy(users[0], patch)

    def store_of(self, patch: Patch) -> Path:
        """The store a patch comes from."""
        return patch.directory.parent.parent

    def engines(self) -> list[str]:
        return [e for e in sorted(all_engines())
                if any([_has_series(layer / e / "series.yaml") for layer in self.layers or (self.root,)])]

    def series(self, engine: str) -> Series:
        if len(self.layers) > 1:
            return self._merged_series(engine)
        return self._layer_series(engine)

    def _merged_series(self, engine: str) -> Series:
        merged: list[Patch] = []
        origin: dict[str, Path] = {}
        since = None
        for layer in reversed(self.layers):  # the bundled store first
            series = Store(layer, (layer,))._layer_series(engine)
            since = since or series.matrix_since
            for patch in series.patches:
                if patch.name not in origin:
                    merged.append(patch)
                elif patch.overrides:
                    merged[[p.name for p in merged].index(patch.name)] = patch
                else:
                    raise StoreError(
                        f"patch {engine}/{patch.name} is in two stores: {origin[patch.name]} and {layer}",
                        hint=f"rename one, or say `overrides: true` in {patch.directory / 'patch.yaml'} to "
                             f"replace the other")
                origin[patch.name] = layer
        return Series(engine, self.root / engine, tuple(merged), since)

    def _layer_series(self, engine: str) -> Series:
        """The engine's series, parsed once per process: later calls return the same Series for as
        long as series.yaml, the patch folders and their patch.yaml are unchanged (by stat)."""
        get_engine(engine)
        key = (str(self.root), os.path.abspath(self.root), engine)
        series_file = self.root / engine / "series.yaml"
        cached = _series_cache.get(key)
        if cached is not None and cached[0] == _fingerprint(series_file, cached[1]):
            return cached[1]
        started = time.time_ns()
        series = self._parse_series(engine)
        fingerprint = _fingerprint(series_file, series)
        if _settled(fingerprint, started):
            with _series_lock:
                _series_cache[key] = (fingerprint, series)
                while len(_series_cache) > _SERIES_CACHE_MAX:
                    _series_cache.pop(next(iter(_series_cache)))
        return series

    def _parse_series(self, engine: str) -> Series:
        directory = self.root / engine
        series_file = directory / "series.yaml"
        if not _has_series(series_file):
            return Series(engine, directory, ())
        data = _load_yaml(series_file)
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
        patches = [_load_patch(engine, directory / entry["name"], entry.get("variants") or {})
                   for entry in data["patches"]]
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
    return (_stat(series_file),) + tuple(
        (_stat(p.directory), _stat(p.directory / "patch.yaml")) for p in series.patches)


def _settled(fingerprint: tuple, started_ns: int) -> bool:
    stats = [fingerprint[0]] + [s for pair in fingerprint[1:] for s in pair]
    return all(s is None or max(s[0], s[1]) < started_ns - _RACY_NS for s in stats)


_HINT = "see docs/patch-format.md"


def _has_series(path: Path) -> bool:
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
    return EnvironmentProblem(f"{path} is not a regular file (a FIFO, a device, a socket or a folder): patchctl "
                              f"reads store files from regular files only", hint="replace it with the file, or remove it")


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


def _load_yaml(path: Path) -> Any:  # a YAML document: its shape is checked by the caller's schema
    raw = _read_store_file(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})",
                         hint="store files are UTF-8 YAML") from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise StoreError(f"{path}: not valid YAML: {exc}") from None


load_store_yaml = _load_yaml  # for the commands that rewrite a store's files (pin, new)


def _load_patch(engine: str, directory: Path, pins: dict) -> Patch:
    meta_file = directory / "patch.yaml"
    if not meta_file.is_file():
        raise StoreError(f"{meta_file} is missing (listed in {engine}/series.yaml)")
    meta = _load_yaml(meta_file) or {}
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
        raise StoreError(
            f"{meta_file}: drop_when {drop_when!r} must be 'upstreamed' or a requirement like 'vllm>=0.24'"
        )
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
    if (not isinstance(sources, list) or not sources
            or not all(isinstance(s, str) and s.strip() for s in sources)):
        raise StoreError(f"{meta_file}: generated_by.sources must list the files the variants are made from")
    return {"generator": generator, "sources": list(sources)}


def _requirement(text: str) -> Requirement:
    """Requirement(text) with its versions bounded (patchctl/core/versions.py)."""
    req = Requirement(text)
    parse_specifier_set(str(req.specifier))
    return req


def drop_rule_met(patch: Patch, dist: str, version: Version) -> bool | None:
    """Whether a `dist>=X` drop_when rule holds for this version; None when not decidable here."""
    if not patch.drop_when or patch.drop_when == "upstreamed":
        return None
    req = Requirement(patch.drop_when)
    if req.name.replace("_", "-").lower() != dist.lower():
        return None
    return req.specifier.contains(version, prereleases=True)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _installed_bundled(root: Path) -> bool:
    """The bundled patch set inside an installed patchctl (patchctl/bundled/): pip owns those files."""
    from patchctl.core.bundled import bundled_store

    found = bundled_store()
    return found is not None and found.name == "bundled" and _same_dir(root, found)


def _may_write(root: Path) -> bool:
    return not _installed_bundled(root)


def _describe(root: Path) -> str:
    from patchctl.core.bundled import bundled_store

    found = bundled_store()
    if found is not None and _same_dir(root, found):
        return f"the bundled patch set ({root})"
    return str(root)


def _override_copy(user_root: Path, patch: Patch) -> Patch:
    """patch copied into user_root as an override of the original (idempotent: an existing copy is used)."""
    folder = user_root / patch.engine / patch.name
    series_file = user_root / patch.engine / "series.yaml"
    if not (folder / "patch.yaml").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        meta = _load_yaml(patch.directory / "patch.yaml")
        meta["overrides"] = True
        write_atomic(folder / "patch.yaml", dump_yaml(meta, sort_keys=False).encode())
        for variant in patch.variants:
            write_atomic(folder / variant.filename, variant.read_bytes())
    doc: dict = _load_yaml(series_file) if series_file.is_file() else {"engine": patch.engine, "patches": []}
    if not any(entry["name"] == patch.name for entry in doc["patches"]):
        doc["patches"].append({"name": patch.name, "variants": {v.filename: v.actual_sha256() for v in patch.variants}})
        write_atomic(series_file, dump_yaml(doc, sort_keys=False).encode())
    return patch._replace(directory=folder, overrides=True,
                          variants=tuple(v._replace(path=folder / v.filename) for v in patch.variants))


def write_variant(store: Store, patch: Patch, filename: str, data: bytes) -> None:
    """Add (or replace) a variant file of a patch and pin its sha256 in the series — in a store
    commands may write (Store.home_for_writing: a bundled patch goes to the user's store as an override)."""
    patch = store.home_for_writing(patch)
    write_atomic(patch.directory / filename, data)
    series_file = patch.directory.parent / "series.yaml"  # the patch's own store
    doc = _load_yaml(series_file)
    for entry in doc["patches"]:
        if entry["name"] == patch.name:
            pins = dict(entry.get("variants") or {})
            pins[filename] = hashlib.sha256(data).hexdigest()
            entry["variants"] = dict(sorted(pins.items(), key=lambda kv: Version(kv[0].removesuffix(".patch"))))
    write_atomic(series_file, dump_yaml(doc, sort_keys=False).encode())


def store_kind(root: Path) -> str:
    """`bundled` for the patch set shipped with patchctl (installed or a checkout's patches/), else `user`."""
    from patchctl.core.bundled import bundled_store

    found = bundled_store()
    return "bundled" if found is not None and _same_dir(root, found) else "user"


def recorded_layers(store: Store, recorded: list[tuple[str, str]]) -> tuple[Store, list[tuple[str, str]]]:
    """The store `ensure` applies from: the stores a tree's record names (path, kind; highest priority
    first), with the ones this command names (--store, PATCHCTL_STORE, the config) in front. A
    recorded `bundled` store is the bundled patch set of this patchctl, wherever it is installed now.
    Returns the store and the recorded stores that are gone (path, kind)."""
    named = [layer for layer in (store.layers or (store.root,)) if store_kind(layer) == "user"]
    layers: list[Path] = list(named)
    gone: list[tuple[str, str]] = []
    for path, kind in recorded:
        if kind == "bundled":
            try:
                layers.append(default_store_dir().resolve())
            except StoreError:
                gone.append((path, kind))
        elif Path(path).is_dir():
            layers.append(Path(path).resolve())
        else:
            gone.append((path, kind))
    if any(store_kind(layer) == "bundled" for layer in (store.layers or (store.root,))) and named:
        layers.append(default_store_dir().resolve())  # named with the bundled set over it, as the command asked
    layers = list(dict.fromkeys(layers))
    if not layers:
        return store, gone
    # Bundled last: it is the lowest layer, whatever order the record lists it in.
    layers.sort(key=lambda p: store_kind(p) == "bundled")
    writable = tuple(p for p in layers if store_kind(p) == "user" and _may_write(p))
    return Store(layers[0], tuple(layers), writable), gone


def variant_sha256(patch: Patch, filename: str | None) -> str | None:
    """The fingerprint a record keeps of the variant applied: the sha256 of its bytes (its pin, unless
    --allow-modified applied a variant that differs from it)."""
    for variant in patch.variants:
        if variant.filename == filename:
            return variant.actual_sha256()
    return None


# --- choosing patches: --patch / --exclude, checked against the series and its depends_on ---------
# (the choice is kept in the tree's record, tree.journal.Selection, so that `ensure` keeps applying it)

def unknown_names(series: Sequence[Patch], names: Iterable[str], engine: str) -> None:
    known = [p.name for p in series]
    for name in names:
        if name not in known:
            raise UsageError(f"no patch {name!r} in the {engine} series",
                             hint=f"the series has: {', '.join(known) or 'no patches'} (`patchctl list {engine}`)")


def dependencies(series: Sequence[Patch], names: Iterable[str]) -> set[str]:
    """names with every patch they depend on, transitively."""
    by_name = {p.name: p for p in series}
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in wanted or name not in by_name:
            continue
        wanted.add(name)
        todo.extend(by_name[name].depends_on)
    return wanted


def dependents(series: Sequence[Patch], names: Iterable[str], among: Iterable[str]) -> dict[str, list[str]]:
    """For each of `among` that depends (transitively) on one of `names`: which of them."""
    out: dict[str, list[str]] = {}
    names = set(names)
    for patch in series:
        if patch.name in among and patch.name not in names:
            hit = sorted(dependencies(series, [patch.name]) & names)
            if hit:
                out[patch.name] = hit
    return out


def select(series: Sequence[Patch], only: Sequence[str] | None, exclude: Sequence[str], engine: str) -> tuple[Patch, ...]:
    """The patches of the series `--patch` (only; None: every patch) and `--exclude` choose, in series
    order. A name the series lacks is exit 2 naming it; `--patch P` brings the patches P depends on;
    excluding a patch that a chosen one depends on is exit 2 naming both."""
    unknown_names(series, [*(only or ()), *exclude], engine)
    chosen = {p.name for p in series} if only is None else dependencies(series, only)
    chosen -= set(exclude)
    needs = dependents(series, exclude, chosen)
    if needs:
        name, deps = next(iter(needs.items()))
        raise UsageError(f"{name} depends on {', '.join(deps)}, which --exclude leaves out",
                         hint=f"exclude {name} too, or keep {', '.join(deps)}")
    return tuple(p for p in series if p.name in chosen)
