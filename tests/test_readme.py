"""The README stays short and true: at most 200 lines, the two set-up commands `.ci/run` runs, and the
commands it names exist. Its former Layout section lives in CONTRIBUTING.md, generated from the tree
(scripts/layout.py). The docs site has its own tests (tests/test_docs.py)."""

import re
import subprocess
import sys
from pathlib import Path

from patchctl.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200  # issue 36: read in five minutes; the rest is a docs page


def test_readme_is_at_most_200_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"{len(lines)} lines: move the material to a page under docs/"


def test_readme_keeps_the_test_command_ci_runs():
    """.ci/run runs "the README's test command": the two set-up commands stay in the README."""
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m pip install -e '.[test]'" in readme
    assert "python3 -m pytest -ra" in readme
    ci = (ROOT / ".ci/run").read_text()
    assert "pip install -q -e '.[test]'" in ci and "python3 -m pytest -ra" in ci


def test_layout_section_matches_the_tree():
    generated = subprocess.run(
        [sys.executable, str(ROOT / "scripts/layout.py")], capture_output=True, text=True, check=True
    ).stdout
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    start = contributing.index("## Layout\n\n```\n") + len("## Layout\n\n```\n")
    assert contributing[start : contributing.index("```", start)] == generated, "run `python scripts/layout.py --write`"


def test_every_command_the_readme_and_docs_name_exists():
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {name: page for page in pages for name in re.findall(r"`patchctl ([a-z]+)\b", page.read_text())}
    assert named, "the README names no command"
    unknown = {name: str(page.relative_to(ROOT)) for name, page in named.items() if name not in COMMANDS}
    assert not unknown, unknown
