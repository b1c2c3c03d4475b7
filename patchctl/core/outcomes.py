"""The one vocabulary for what happened to a patch on one upstream version."""

from __future__ import annotations

CLEAN = "clean"
OFFSET = "offset"
FUZZ = "fuzz"
THREE_WAY = "three-way"
ALREADY_APPLIED = "already-applied"
UPSTREAMED = "upstreamed"
OBSOLETE = "obsolete"
CONFLICT = "conflict"

ALL = (CLEAN, OFFSET, FUZZ, THREE_WAY, ALREADY_APPLIED, UPSTREAMED, OBSOLETE, CONFLICT)
# Outcomes that change files when applied.
WRITES = (CLEAN, OFFSET, FUZZ, THREE_WAY)
# Outcomes after which the patch's intent holds on the target.
SATISFIED = (CLEAN, OFFSET, FUZZ, THREE_WAY, ALREADY_APPLIED, UPSTREAMED)
