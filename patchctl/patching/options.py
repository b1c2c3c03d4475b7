"""The rules a patch is evaluated under: the one options type of the apply engine, which apply and
ensure's flags build and the work layer passes down. A module of its own, importing nothing, so
that `ensure` on an intact tree builds it without importing the engine (evaluate.py)."""

from __future__ import annotations

from typing import NamedTuple


class Options(NamedTuple):
    strict: bool = False  # fuzz counts as a failure (the default when writing: apply, ensure)
    allow_modified: bool = False  # accept variants whose bytes differ from the series pin
    applied: frozenset[str] = frozenset()  # patches a state record says we applied (already-applied vs upstreamed)
    fuzz_refusal: str = "--strict forbids fuzz"  # the way out, in the words of the command that refused
