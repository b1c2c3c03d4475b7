"""`patchctl pin`: record the sha256 of every variant file in series.yaml, once a person reviewed them."""
from __future__ import annotations

from packaging.version import Version

from patchctl.commands.base import command
from patchctl.documents import document
from patchctl.errors import EXIT_OK
from patchctl.options import store_option


def run(store) -> tuple[dict, int]:
    """Rewrite series.yaml pins from the variant files on disk (after a human reviewed them)."""
    import hashlib

    import yaml

    changed = []
    for engine_name in store.engines():
        path = store.root / engine_name / "series.yaml"
        data = yaml.safe_load(path.read_text())
        for entry in data["patches"]:
            folder = path.parent / entry["name"]
            pins = {}
            for variant in sorted(folder.glob("*.patch")):
                pins[variant.name] = hashlib.sha256(variant.read_bytes()).hexdigest()
            if pins != (entry.get("variants") or {}):
                changed.append(f"{engine_name}/{entry['name']}")
            entry["variants"] = dict(sorted(pins.items(), key=lambda kv: _version_key(kv[0])))
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return document("pin", EXIT_OK, changed=changed,
                           message=f"pins updated for {len(changed)} patch(es)" if changed else "pins already current"), EXIT_OK


def _version_key(filename: str):
    return Version(filename.removesuffix(".patch"))


@command("pin", example=(
    "patchctl pin && git diff patches/    after reviewing a refreshed variant",
))
@store_option
def command(store):
    """Record the sha256 of every variant file in series.yaml (after reviewing them)."""
    return run(store)
