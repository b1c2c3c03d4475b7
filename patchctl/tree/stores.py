"""Which stores a write to a tree applies from, decided from the tree's record (read once, under the
lock, by tree.service): the record is the contract for `apply` and `ensure` alike. Also what a record
keeps of them: their layers (path, bundled/user) and a fingerprint of what they say for the engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from patchctl.core.errors import RecordUnmet

if TYPE_CHECKING:
    from patchctl.store.layered import Store
    from patchctl.tree.bookkeeping import StateRecord, StoreRef


@dataclass(frozen=True)
class Stores:
    """The stores a command was given. named: the command line named them (--store, --no-bundled), so
    `apply` applies from these instead of the record's; the stores of the environment and the config
    (PATCHCTL_STORE, `stores:`) are layered over the recorded ones, as `ensure` always did."""

    store: Store
    named: bool = False


@dataclass(frozen=True)
class Decided:
    """The store to apply from and the recorded stores that are gone (path, kind)."""

    store: Store
    gone: tuple[tuple[str, str], ...] = ()


def decide(
    record: StateRecord | None, stores: Stores, *, keep_record: bool, refuse_gone: bool, root: str, engine: str
) -> Decided:
    """keep_record: apply from the stores the record names (with the command's own in front), else
    from `stores` alone. refuse_gone: a recorded store that is gone is exit 3 (RecordUnmet) naming it
    and the patches recorded from it (ensure never starts an engine without them); else it is
    returned, and the caller names the patches that leave with it."""
    from patchctl.store.layered import recorded_layers

    if not keep_record or record is None or not record.stores:
        return Decided(stores.store)  # nothing applied, or no store recorded (`new` without --store)
    layered, gone = recorded_layers(stores.store, [(s.path, s.kind) for s in record.stores])
    if gone and refuse_gone:
        path, kind = gone[0]
        names = [p.name for p in record.patches if p.store is not None and p.store.path == path] or ["(none listed)"]
        raise RecordUnmet(
            f"the {kind} store {path} is gone: the record of {root} lists {', '.join(names)} as applied "
            f"from it; ensure does not start the engine without them",
            hint=f"restore {path}, or change the set explicitly: `patchctl apply {engine}` with the "
            f"stores you have (--store DIR, --exclude NAME)",
        )
    return Decided(layered, tuple(gone))


def refs(store: Store) -> tuple[StoreRef, ...]:
    """The store's layers as a record names them (path, bundled/user), highest priority first."""
    from patchctl.store.layered import store_kind
    from patchctl.tree.bookkeeping import StoreRef

    return tuple(StoreRef(str(layer), store_kind(layer)) for layer in (store.layers or (store.root,)))


def fingerprint(store: Store, engine: str) -> str:
    """sha256 over the engine's series.yaml and every patch folder's patch.yaml and variant files, in
    every store layer: what ensure compares with the record instead of parsing YAML."""
    import hashlib

    digest = hashlib.sha256()
    for layer in store.layers or (store.root,):
        folder = layer / engine
        digest.update(str(layer).encode() + b"\0")
        for path in sorted([folder / "series.yaml", *folder.glob("*/patch.yaml"), *folder.glob("*/*.patch")]):
            if path.is_file():
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
