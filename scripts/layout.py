"""Print the README's Layout section from the tree itself: each package and module of patchctl/ with
the first sentence of its docstring, then the top-level folders. `tests/test_readme.py` fails when the
README's copy differs, so the section cannot drift.

    python scripts/layout.py            print it
    python scripts/layout.py --write    rewrite the section in README.md
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {
    "patches/": "the bundled patch set: <engine>/series.yaml, <engine>/<patch>/{patch.yaml, <base>.patch, checks/}; "
                "checklib/ (helpers the checks share), envs/ (smoke environments)",
    "kernels/": "the sparse-MLA Triton kernel, source of truth for the generated triton-sparse-mla variants; "
                "sparse_mla/next/ the development kernel, not shipped until measured on a GPU",
    "tests/": "mirrors patchctl/; real releases, real wheels on a local index, real git; "
              "support/ (builders, fixtures, the index and registry stand-ins: never shipped)",
    "benchmarks/": "measurements run on demand, each with its baseline in the same run",
    "scripts/": "generate_variants.py (generated variants), layout.py (this section), the llama.cpp server setup",
    "ci/": "the nightly workflow's steps as scripts; .github/workflows/nightly.yml runs them",
    "docs/": "json-schema.md (every --json document), patch-format.md, matrix.md",
}


def summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?[.:;])(\s|$)", first)
    return (match.group(1) if match else first).rstrip(".:;")


def layout() -> str:
    pkg = ROOT / "patchctl"
    lines = []
    entries = sorted(p for p in pkg.iterdir() if p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir()))
    for entry in entries:
        if entry.is_dir():
            if not (entry / "__init__.py").is_file():
                continue
            lines.append((f"patchctl/{entry.name}/", summary(entry / "__init__.py")))
            for module in sorted(entry.glob("*.py")):
                if module.name != "__init__.py":
                    lines.append((f"  {module.stem}", summary(module)))
        elif entry.name != "__init__.py":
            lines.append((f"patchctl/{entry.name}", summary(entry)))
    lines.append(("patchctl/core/engines.yaml",
                  "everything engine-specific: distribution, packages, layouts, nightly source, moves"))
    lines += list(FOLDERS.items())
    width = max(len(name) for name, _ in lines) + 2
    return "\n".join(f"{name:<{width}}{text}".rstrip() for name, text in lines)


def readme_section(text: str) -> tuple[int, int]:
    start = text.index("## Layout\n\n```\n") + len("## Layout\n\n```\n")
    return start, text.index("```", start)


def main() -> int:
    block = layout() + "\n"
    if "--write" in sys.argv:
        readme = ROOT / "README.md"
        text = readme.read_text()
        start, end = readme_section(text)
        readme.write_text(text[:start] + block + text[end:])
    else:
        sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
