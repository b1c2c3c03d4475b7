"""`patchctl pin`: record the sha256 of every variant file in series.yaml, once a person reviewed them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from packaging.version import Version

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import store_option
from patchctl.core.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from patchctl.store.layered import Store


def run(store: Store) -> tuple[dict, int]:
    """Rewrite series.yaml pins from the variant files on disk (after a human reviewed them)."""
    import hashlib

    from patchctl.core.atomic import write_atomic
    from patchctl.core.schemas import validate
    from patchctl.core.yamlio import dump_yaml
    from patchctl.store.reading import load_store_yaml

    changed = []
    # The stores the user named: the bundled patch set is pinned where it is developed, by naming it
    # (--store <checkout>/patches), never inside an installed patchctl.
    layers = [layer for layer in store.single_layers() if store.may_write(layer.root)]
    if not layers:
        raise UsageError(
            "pin rewrites the series of a store you name; none was named",
            hint="pass --store DIR (or PATCHCTL_STORE); in a source checkout, --store patches pins the bundled patch set",
        )
    for layer, engine_name in [(lay, e) for lay in layers for e in lay.engines()]:
        path = layer.root / engine_name / "series.yaml"
        # Its shape is checked (a damaged series.yaml is a StoreError, not a traceback); its pins are
        # what pin rewrites, so a pin of a missing file is no error here.
        data = validate("series", load_store_yaml(path), str(path))
        for entry in data["patches"]:
            folder = path.parent / entry["name"]
            pins = {}
            for variant in sorted(folder.glob("*.patch")):
                pins[variant.name] = hashlib.sha256(variant.read_bytes()).hexdigest()
            if pins != (entry.get("variants") or {}):
                changed.append(f"{engine_name}/{entry['name']}")
            entry["variants"] = dict(sorted(pins.items(), key=lambda kv: _version_key(kv[0])))
        write_atomic(path, dump_yaml(data, sort_keys=False).encode())
    return document(
        "pin",
        EXIT_OK,
        changed=changed,
        message=f"pins updated for {len(changed)} patch(es)" if changed else "pins already current",
    ), EXIT_OK


def _version_key(filename: str) -> Version:
    return Version(filename.removesuffix(".patch"))


@patchctl_command(
    "pin",
    example=(
        "patchctl pin --store ~/patches                after reviewing a refreshed variant of yours",
        "patchctl pin --store patches && git diff patches/   in a source checkout: the bundled set",
    ),
)
@store_option
def command(store: Store) -> tuple[dict, int]:
    """Record the sha256 of every variant file in series.yaml (after reviewing them)."""
    return run(store)
