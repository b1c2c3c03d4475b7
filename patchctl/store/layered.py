"""The stores patchctl reads: one folder, or the user's stores layered over the bundled one (a name in
two layers is an error unless the higher says `overrides: true`), writing a variant into a store, and
the stores a tree's record names."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from patchctl.core.atomic import write_atomic
from patchctl.core.engines import all_engines
from patchctl.core.errors import StoreError
from patchctl.core.yamlio import dump_yaml
from patchctl.store.reading import has_series, load_store_yaml, read_series
from patchctl.store.series import Patch, Series


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
                raise StoreError(
                    f"patch store {path} does not exist",
                    hint="create it (patchctl new writes one), or fix --store / PATCHCTL_STORE",
                )
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
                "--store <checkout>/patches writes the bundled patch set itself",
            )
        return _override_copy(users[0], patch)

    def store_of(self, patch: Patch) -> Path:
        """The store a patch comes from."""
        return patch.directory.parent.parent

    def engines(self) -> list[str]:
        return [
            e
            for e in sorted(all_engines())
            if any([has_series(layer / e / "series.yaml") for layer in self.layers or (self.root,)])
        ]

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
                        hint=f"rename one, or say `overrides: true` in {patch.directory / 'patch.yaml'} to replace the other",
                    )
                origin[patch.name] = layer
        return Series(engine, self.root / engine, tuple(merged), since)

    def _layer_series(self, engine: str) -> Series:
        return read_series(self.root, engine)


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
        meta = load_store_yaml(patch.directory / "patch.yaml")
        meta["overrides"] = True
        write_atomic(folder / "patch.yaml", dump_yaml(meta, sort_keys=False).encode())
        for variant in patch.variants:
            write_atomic(folder / variant.filename, variant.read_bytes())
    doc: dict = load_store_yaml(series_file) if series_file.is_file() else {"engine": patch.engine, "patches": []}
    if not any(entry["name"] == patch.name for entry in doc["patches"]):
        doc["patches"].append({"name": patch.name, "variants": {v.filename: v.actual_sha256() for v in patch.variants}})
        write_atomic(series_file, dump_yaml(doc, sort_keys=False).encode())
    return patch._replace(
        directory=folder, overrides=True, variants=tuple(v._replace(path=folder / v.filename) for v in patch.variants)
    )


def write_variant(store: Store, patch: Patch, filename: str, data: bytes) -> None:
    """Add (or replace) a variant file of a patch and pin its sha256 in the series — in a store
    commands may write (Store.home_for_writing: a bundled patch goes to the user's store as an override)."""
    patch = store.home_for_writing(patch)
    write_atomic(patch.directory / filename, data)
    series_file = patch.directory.parent / "series.yaml"  # the patch's own store
    doc = load_store_yaml(series_file)
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
