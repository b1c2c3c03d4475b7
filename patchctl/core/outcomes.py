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
# Outcomes after which the patch's changes are on the tree (written, or found there): the only ones
# counted as applied; a record keeps obsolete and upstreamed patches too, which were never written.
ON_TREE = (*WRITES, ALREADY_APPLIED)
# Outcomes after which the patch's intent holds on the target.
SATISFIED = (CLEAN, OFFSET, FUZZ, THREE_WAY, ALREADY_APPLIED, UPSTREAMED)
