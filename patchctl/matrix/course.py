"""What each patch does across a matrix's versions, in words: the matrix page's "First bad version per
patch". A patch that never conflicts is "applies everywhere" only when it applies in every version:
one obsolete or upstreamed in some of them says from (or up to) which version, so a patch that is
obsolete in every cell never reads as if it were applied anywhere."""

from __future__ import annotations

from typing import NamedTuple

from packaging.version import Version

from patchctl.core import outcomes as O

APPLIES = "applies"


def version_key(version: str) -> tuple[int, Version]:
    """A matrix's rows in version order, the nightly last."""
    return (1, Version("0")) if version == "nightly" else (0, Version(version))


class Course(NamedTuple):
    first_bad: str | None  # the lowest version where it conflicts (build.first_bad's answer)
    words: str  # the rest: "applies everywhere", "upstreamed from 0.12.0", "obsolete in every version", ...


def courses(data: dict) -> dict[str, Course]:
    """patch -> its course over one engine's versions (rows with an error, and cells a row lacks, say
    nothing about it); the nightly counts as the newest version."""
    versions = sorted(data.get("versions") or {}, key=version_key)
    out = {}
    for patch in data.get("patches") or []:
        cells = []
        for version in versions:
            cell = (data["versions"][version].get("patches") or {}).get(patch)
            if cell and cell.get("outcome"):
                outcome = cell["outcome"]
                cells.append((version, APPLIES if outcome in O.ON_TREE else outcome))
        out[patch] = course(cells)
    return out


def course(cells: list[tuple[str, str]]) -> Course:
    """cells: (version, APPLIES or an outcome), oldest first."""
    if not cells:
        return Course(None, "no version evaluated it")
    first_bad = next((v for v, what in cells if what == O.CONFLICT), None)
    runs: list[tuple[str, str, str]] = []  # (what, first version, last version), in version order
    for version, what in cells:
        if runs and runs[-1][0] == what:
            runs[-1] = (what, runs[-1][1], version)
        else:
            runs.append((what, version, version))
    if len(runs) == 1:
        what = runs[0][0]
        every = {APPLIES: "applies everywhere", O.CONFLICT: "conflicts in every version"}
        return Course(first_bad, every.get(what, f"{what} in every version"))
    words = []
    for i, (what, first, last) in enumerate(runs):
        if what in (APPLIES, O.CONFLICT):  # the rest of the line is what it is not applied for
            continue
        if i == len(runs) - 1:
            words.append(f"{what} from {first}")
        elif i == 0:
            words.append(f"{what} up to {last}")
        else:
            words.append(f"{what} in {first}" + (f" to {last}" if last != first else ""))
    return Course(first_bad, "; ".join(words))  # "" beside a first bad version that is all there is to say
