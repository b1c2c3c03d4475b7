"""Generate patchctl/core/schemas/compiled/<schema>.py from patchctl/core/schemas/<schema>.json (fastjsonschema's
code for each, headed by the schema's sha256). Run after editing a schema; tests/test_schemas.py fails
while a generated module is stale.

    python scripts/compile_schemas.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patchctl.core.schemas import generated_module, module_name  # noqa: E402


def main() -> None:
    out = ROOT / "patchctl" / "core" / "schemas" / "compiled"
    names = sorted(p.stem for p in (ROOT / "patchctl" / "core" / "schemas").glob("*.json"))
    for stale in out.glob("*.py"):
        if stale.name != "__init__.py" and stale.stem not in {module_name(n) for n in names}:
            stale.unlink()
    for name in names:
        (out / f"{module_name(name)}.py").write_text(generated_module(name), encoding="utf-8")
        print(f"wrote {out / module_name(name)}.py")


if __name__ == "__main__":
    main()
