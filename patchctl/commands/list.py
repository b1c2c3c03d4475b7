from __future__ import annotations

from packaging.version import Version

from patchctl import report, store as st
from patchctl.errors import EXIT_OK


def list_patches(store: st.Store, engine: str | None, version: Version | None) -> tuple[dict, int]:
    engines = [engine] if engine else store.engines()
    rows = []
    for name in engines:
        for position, patch in enumerate(store.series(name).patches, start=1):
            row = {
                "engine": name, "position": position, "name": patch.name, "title": patch.title,
                "applies_to": str(patch.applies_to), "drop_when": patch.drop_when,
                "requires": list(patch.requires), "depends_on": list(patch.depends_on),
                "upstream": list(patch.upstream),
                "variants": [v.filename for v in patch.variants],
            }
            if version is not None:
                choice = st.choose_variant(patch, version)
                row["chosen_variant"] = choice.variant.filename if choice.variant else None
                row["why"] = choice.reason
                row["drop_rule_met"] = st.drop_rule_met(patch, store_dist(name), version)
            rows.append(row)
    return report.document("list", EXIT_OK, engine=engine, version=str(version) if version else None,
                           series=rows), EXIT_OK


def store_dist(engine: str) -> str:
    from patchctl.engines import get_engine

    return get_engine(engine).dist
