"""`patchctl show PATCH` prints the short form the docs site's page of the patch has (issue 36, items 2
and 6): title, why, where it applies, what is proven and what is not as short bullets; `--evidence`
prints every field and each evidence item whole. It printed about 100 lines of 100-to-300-word
paragraphs for triton-sparse-mla."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.invoke import run_json

from patchctl.cli.main import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "patches"


def show(*args: str) -> str:
    result = CliRunner().invoke(main, ["show", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def sections(text: str, heading: str) -> dict[str, list[str]]:
    """`HEADING:` / `## HEADING` sections and their `- ` bullets, from show's text or a docs page."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = re.fullmatch(heading, line)
        if match:
            current = out.setdefault(match.group(1), [])
        elif current is not None and line.lstrip().startswith("- "):
            current.append(line.lstrip()[2:])
        elif current is not None and line.strip() and not line.startswith(" "):
            current = None
    return out


def unescape(line: str) -> str:
    return line.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def test_show_prints_short_bullets_and_evidence_prints_each_item_whole():
    doc = run_json("show", "triton-sparse-mla", expect=0)["patch"]
    longest = max([*doc["evidence"]["proven"], *doc["evidence"]["not_proven"]], key=len)
    assert len(longest) > 300  # the patch this was reported on: its items run to hundreds of words
    short = show("triton-sparse-mla")
    bullets = [line for line in short.splitlines() if line.startswith("  - ")]
    proven = sections(short, r"(What is proven|What is not proven):")
    assert len(proven["What is proven"]) == len(doc["evidence"]["proven"])
    assert all(len(b) <= 200 for sec in proven.values() for b in sec)
    assert longest not in short and "--evidence prints them whole" in short
    assert bullets and doc["title"] in short
    full = show("triton-sparse-mla", "--evidence")
    assert " ".join(longest.split()) in " ".join(full.split())
    assert len(full) > 2 * len(short)


@pytest.mark.parametrize("page", sorted(DOCS.glob("*/*.md")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_show_and_the_docs_page_say_the_same(page):
    """One function makes both: each section of the page is what show prints, bullet for bullet."""
    text = page.read_text()
    name, engine = re.search(r"^# (\S+) \((\S+)\)$", text, re.M).groups()  # type: ignore[union-attr]
    on_page = sections(text[: text.index("## Evidence in full")], r"## (.+)")
    printed = sections(show(name, engine), r"(.+):")
    for heading in ("Where it applies", "Upstream", "What is proven", "What is not proven"):
        page_bullets = [unescape(b) for b in on_page[heading] if b != "(none recorded)"]
        assert page_bullets == [b for b in printed[heading] if b != "(none recorded)"], heading
