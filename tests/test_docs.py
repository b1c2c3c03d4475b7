"""The docs site (docs/, mkdocs.yml) stays true and whole:

- its generated pages (the command reference, one page per patch, their nav) are what
  scripts/docs_pages.py writes from the click commands and the patch.yaml files today;
- every page is reachable from mkdocs.yml's nav, and every relative link of the README, CONTRIBUTING.md
  and the docs resolves (file and anchor);
- each row of the Guarantees table names tests that exist (a renamed or deleted test breaks the tie);
- `mkdocs build --strict` passes, where mkdocs is installed (CI's docs job always has it).
"""

import fnmatch
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def test_generated_pages_are_current():
    done = subprocess.run([sys.executable, str(ROOT / "scripts/docs_pages.py")], capture_output=True, text=True)
    assert done.returncode == 0, f"stale: {done.stdout.split()}{done.stderr}; run `python scripts/docs_pages.py --write`"


def test_the_generated_reference_has_a_page_per_command():
    from patchctl.cli.main import COMMANDS

    for name in COMMANDS:
        page = (DOCS / "reference" / f"{name}.md").read_text()
        assert f"Usage: patchctl {name} " in page and "--help" in page, name


def test_the_generated_patch_pages_have_one_page_per_patch():
    for patch_yaml in (ROOT / "patches").glob("*/*/patch.yaml"):
        engine, name = patch_yaml.parent.parent.name, patch_yaml.parent.name
        page = (DOCS / "patches" / engine / f"{name}.md").read_text()
        for heading in ("## Why", "## Where it applies", "## What is proven", "## What is not proven"):
            assert heading in page, (engine, name, heading)


def _nav_files(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return []


def test_every_page_is_in_the_nav():
    nav = _nav_files(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    on_disk = {p.relative_to(DOCS).as_posix() for p in pages()}
    assert sorted(on_disk - set(nav)) == [], "pages mkdocs.yml's nav leaves out"
    assert sorted(set(nav) - on_disk) == [], "nav entries with no page"


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (mkdocs) and GitHub give a heading, for the headings used here."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"\s+", "-", text)


def _anchors(page: Path) -> set[str]:
    text, fence = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            text.append(_slug(line.lstrip("#")))
    return set(text)


def test_every_relative_link_resolves():
    broken = []
    for page in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *pages()]:
        for match in LINK.finditer(page.read_text()):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:: not ours to check here
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def _held_by(cell: str) -> list[tuple[Path, str | None]]:
    """The tests a "held by" cell names: `file.py::test_*` (tests/tree/ unless a path is given),
    `::test_*` (the file before), `file.py`."""
    named, last = [], None
    for ref in re.findall(r"`([^`]+)`", cell):
        file, _, test = ref.partition("::")
        if file:
            if not file.endswith(".py"):
                continue  # a word in code type (e.g. `hostile`), not a test
            last = ROOT / file if "/" in file else ROOT / "tests" / "tree" / file
        if last is not None:
            named.append((last, test or None))
    return named


def test_each_guarantee_names_tests_that_exist():
    rows = [
        line
        for line in (DOCS / "guarantees.md").read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| promise")
    ]
    assert len(rows) >= 15, "the Guarantees table lost its rows"
    for row in rows:
        held = _held_by(row.strip().strip("|").rsplit("|", 1)[1])
        assert held, f"a promise no test holds: {row[:80]}"
        for file, test in held:
            assert file.is_file(), f"{file.relative_to(ROOT)} (named in the Guarantees table) does not exist"
            if test:
                defined = re.findall(r"^(?:async )?def (test_\w+)", file.read_text(), re.M)
                assert fnmatch.filter(defined, test), f"no {test} in {file.relative_to(ROOT)}"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs / mkdocs-material not installed (pip install -e '.[docs]'); CI's docs job builds it",
)
def test_the_site_builds_strict(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "check" / "index.html").is_file()
