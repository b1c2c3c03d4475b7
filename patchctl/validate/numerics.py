"""Numerics against a known-good run: the top-1 logprob of every greedy token, compared over the
prefix where the two runs chose the same tokens.

Greedy text catches a change only once it flips a token; the logprobs show how far the numbers moved
where the text still agrees (a kernel that drifts, a cache read from the wrong slot that still lands
on the same argmax). The thresholds are what a healthy restart of the same server stays inside, with
margin (docs/validate.md gives the measurement): MEAN_ABS_LIMIT on the mean absolute difference over
the shared prefix, MAX_ABS_LIMIT on the largest single one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

# Measured on llama.cpp (llama-cpp-python 0.3.36, Gemma 3 270M Q4_K_M, CPU, 2026-12-05; the table in
# docs/validate.md): two restarts of the same server agree exactly (0.0 mean and max over the 4 golden
# prompts x 48 tokens and a 1,925-token document's 64); a restart with another batch shape (another
# summation order) moves the document's by a mean of 0.013 and a max of 0.065; a wrong rope base
# (10000 for 1e6) by means of 0.014 to 0.155 and maxima of 0.08 to 0.31. The mean's limit is four times
# the batch-shape spread, the max's eight (room for a GPU engine's bf16 batch variance).
MEAN_ABS_LIMIT = 0.05
MAX_ABS_LIMIT = 0.5


class Numerics(NamedTuple):
    """One comparison. status: compared | text only (why in `reason`)."""

    status: str
    compared: int  # tokens of the shared prefix whose logprobs were compared
    mean_abs: float | None
    max_abs: float | None
    max_at: int | None  # the token index of max_abs
    gap_at_divergence: float | None  # |expected - got| logprob at the first diverging token: a near tie, or not
    passed: bool
    reason: str


COMPARED = "compared"
TEXT_ONLY = "text only"


def text_only(reason: str) -> Numerics:
    return Numerics(TEXT_ONLY, 0, None, None, None, None, True, reason)


def compare(
    expected_tokens: Sequence[str] | None,
    expected_logprobs: Sequence[float] | None,
    got_tokens: Sequence[str] | None,
    got_logprobs: Sequence[float] | None,
    mean_limit: float = MEAN_ABS_LIMIT,
    max_limit: float = MAX_ABS_LIMIT,
) -> Numerics:
    """Mean and max |logprob difference| over the tokens both runs share from the start; fails past
    either limit. Without logprobs on one side it compares nothing, and says which side had none."""
    if expected_tokens is None or expected_logprobs is None:
        return text_only("the known-good run has no logprobs (recorded before they were kept, or its server gave none)")
    if got_tokens is None or got_logprobs is None:
        return text_only("the server returned no logprobs this time")
    n = min(len(expected_tokens), len(got_tokens), len(expected_logprobs), len(got_logprobs))
    shared = next((i for i in range(n) if expected_tokens[i] != got_tokens[i]), n)
    gap = abs(expected_logprobs[shared] - got_logprobs[shared]) if shared < n else None
    if shared == 0:
        return Numerics(COMPARED, 0, None, None, None, gap, True, "the first token differs: no shared prefix to compare")
    diffs = [abs(a - b) for a, b in zip(expected_logprobs[:shared], got_logprobs[:shared], strict=True)]
    mean = sum(diffs) / len(diffs)
    worst = max(range(shared), key=diffs.__getitem__)
    problems = []
    if mean > mean_limit:
        problems.append(f"mean |Δlogprob| {mean:.4f} over {shared} shared tokens > {mean_limit:g}")
    if diffs[worst] > max_limit:
        problems.append(f"max |Δlogprob| {diffs[worst]:.4f} at token {worst} > {max_limit:g}")
    reason = "; ".join(problems) or f"mean |Δlogprob| {mean:.4f}, max {diffs[worst]:.4f} over {shared} shared tokens"
    return Numerics(COMPARED, shared, mean, diffs[worst], worst, gap, not problems, reason)
