"""The matrix page's "First bad version per patch" says what happened to each patch (issue 36, item 6):
a patch obsolete in every cell read "applies everywhere"; one upstreamed from a version on said the
same. It now says where a patch is obsolete or upstreamed, and "applies everywhere" only for a patch
that applies in every version."""

from __future__ import annotations

import re

from patchctl.matrix.build import first_bad
from patchctl.matrix.html_page import render_html

VERSIONS = ("0.9.0", "0.10.0", "0.11.0", "0.12.0")


def matrix(outcomes: dict[str, tuple[str, ...]]) -> dict:
    """One engine; outcomes: patch -> its outcome in each of VERSIONS, oldest first (None: no cell)."""
    versions = {}
    for i, version in enumerate(VERSIONS):
        cells = {p: {"outcome": o[i], "variant": None} for p, o in outcomes.items() if o[i] is not None}
        versions[version] = {"version": version, "sha256": "a" * 64, "patches": cells}
    # The version rows in the order a merged matrix may have them: not sorted.
    shuffled = {v: versions[v] for v in (VERSIONS[2], VERSIONS[0], VERSIONS[3], VERSIONS[1])}
    return {"schema": "patchctl-matrix/1", "engines": {"sglang": {"patches": list(outcomes), "versions": shuffled}}}


def first_bad_lines(doc: dict) -> dict[str, str]:
    page = render_html(doc)
    block = page[page.index('<div class="firstbad">') :]
    block = block[: block.index("</div>")]
    return {name: re.sub(r"<[^>]+>", "", text) for name, text in re.findall(r"<li><code>([^<]+)</code>: (.*?)</li>", block)}


def test_a_patch_obsolete_in_every_cell_does_not_apply_everywhere():
    lines = first_bad_lines(matrix({"nsa-default": ("obsolete",) * 4, "fix": ("clean", "offset", "fuzz", "clean")}))
    assert lines["nsa-default"] == "obsolete in every version"
    assert lines["fix"] == "applies everywhere"


def test_obsolete_and_upstreamed_say_from_or_up_to_which_version():
    lines = first_bad_lines(
        matrix(
            {
                "gone-later": ("clean", "clean", "obsolete", "obsolete"),
                "merged": ("clean", "offset", "upstreamed", "upstreamed"),
                "new-range": ("obsolete", "clean", "clean", "clean"),
                "broke-then-merged": ("clean", "conflict", "conflict", "upstreamed"),
            }
        )
    )
    assert lines["gone-later"] == "obsolete from 0.11.0"
    assert lines["merged"] == "upstreamed from 0.11.0"
    assert lines["new-range"] == "obsolete up to 0.9.0"
    assert lines["broke-then-merged"] == "first bad 0.10.0; upstreamed from 0.12.0"


def test_first_bad_is_the_lowest_conflicting_release_whatever_the_row_order():
    doc = matrix({"p": ("clean", "clean", "conflict", "conflict"), "q": ("obsolete", "obsolete", None, "obsolete")})
    assert first_bad(doc) == {"sglang": {"p": "0.11.0"}}
    assert first_bad_lines(doc) == {"p": "first bad 0.11.0", "q": "obsolete in every version"}
