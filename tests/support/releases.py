"""The real releases a test may iterate: the rows of the committed compat_matrix.yaml, never the
package index's listing. A new upstream release then cannot turn an unrelated change red; the
nightly workflow notices it and proposes the matrix row that carries it, and from that pull
request on the tests iterate it too (issue 34, item 7; vLLM 0.34.0 did, on 2026-12-02)."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

MATRIX = Path(__file__).resolve().parents[2] / "compat_matrix.yaml"


def committed_releases(engine: str | None = None, matrix: Path = MATRIX) -> list[tuple[str, Version]]:
    """(engine, release) for every release row of the committed matrix ('nightly' is not a
    release), engines in the file's order, releases ascending; only `engine`'s when given."""
    # The tool's own reader: it checks the document against the matrix schema.
    from patchctl.matrix.build import load

    doc = load(matrix)
    return [
        (name, version)
        for name, data in doc["engines"].items()
        if engine in (None, name)
        for version in sorted(Version(v) for v in data["versions"] if v != "nightly")
    ]
