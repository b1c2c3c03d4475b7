"""The README stays true: its Layout section is generated from the tree (scripts/layout.py), and the
commands it names exist."""
import re
import subprocess
import sys
from pathlib import Path

from patchctl.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parent.parent


def test_layout_section_matches_the_tree():
    generated = subprocess.run([sys.executable, str(ROOT / "scripts/layout.py")], capture_output=True, text=True,
                               check=True).stdout
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Layout\n\n```\n") + len("## Layout\n\n```\n")
    assert readme[start: readme.index("```", start)] == generated, "run `python scripts/layout.py --write`"


def test_every_command_the_readme_names_exists():
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`patchctl ([a-z]+)\b", readme))
    assert named, "the README names no command"
    assert named <= set(COMMANDS), sorted(named - set(COMMANDS))
