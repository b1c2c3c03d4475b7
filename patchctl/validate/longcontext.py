"""Long-context checks: needles in a haystack from below a sparse-attention top-k (2048) up to the
server's limit, and a long document's greedy continuation against the golden file's.

Every other check validate makes is a short prompt, where a sparse-attention model's indexer keeps
every token and the sparse path equals the dense one: a broken indexer, a top-k conversion, a
cache-slot bug past the first page or a loader that drops rope scaling all pass them. These prompts
are long. Their cost is a prefill each, so they run under a time budget: a length whose estimate
(from the requests already timed) does not fit in what is left is skipped, and the report says so.

The long greedy run's reference lives in the golden file, beside the short prompts' (recorded with
--record-golden): it is a known-good engine's output to compare other engines and patch sets with,
which is what golden is; the baseline store is keyed by patch set and engine version, so a patched
deployment would never meet the pristine one's numbers there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.core.errors import BadServerReply, HTTPError, RequestFailed
from patchctl.validate import golden as _golden
from patchctl.validate import haystack
from patchctl.validate import numerics as _numerics
from patchctl.validate.client import COMPLETIONS, OpenAIClient
from patchctl.validate.serverinfo import ContextLimit, context_limit, limit_from_error

OFF, QUICK, FULL = "off", "quick", "full"
MODES = (OFF, QUICK, FULL)


class Plan(NamedTuple):
    lengths: tuple[int, ...]  # prompt lengths in the server's tokens, ascending
    depths: tuple[float, ...]  # where the needle sits: 0 the start of the document, 1 its end
    budget_s: float


# quick: 2 minutes at most, the bound for a 50 tok/s server; the lengths straddle the
# 2048-token top-k of DSA models (1k below it, 4k past it) and reach what a budget allows.
PLANS = {
    QUICK: Plan((1024, 4096, 16384, 65536), (0.1, 0.5, 0.9), 120.0),
    FULL: Plan((1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144), (0.0, 0.25, 0.5, 0.75, 1.0), 1800.0),
}
ANSWER_TOKENS = 8  # a needle's answer: a word of one to three tokens, and room for what follows it
HEADROOM = 32  # tokens left free below the limit, for the answer and what a server adds (a BOS)
LONG_TOKENS = 8192  # the long greedy document, past every top-k of the models the patch set serves
LONG_MAX_TOKENS = 64
LONG_SEED = 37

Progress = Callable[[str], None]


class Settings(NamedTuple):
    mode: str = QUICK
    budget_s: float | None = None  # None: the plan's
    max_context: int | None = None  # --max-context: overrides what the server says
    lengths: tuple[int, ...] | None = None  # None: the plan's
    depths: tuple[float, ...] | None = None


class NeedleResult(NamedTuple):
    depth: float
    prompt_tokens: int | None  # as the server counted the prompt (its usage), None where it did not say
    expected: str
    got: str  # the start of the answer
    passed: bool
    seconds: float
    error: str | None = None  # the request failed: why


class LengthResult(NamedTuple):
    tokens: int  # the length asked for
    status: str  # covered | skipped
    reason: str  # why it was skipped ("" when covered)
    passed: int
    total: int
    seconds: float
    needles: tuple[NeedleResult, ...] = ()


class LongGreedy(NamedTuple):
    status: str  # compared | recorded | skipped
    reason: str  # why it was skipped ("" otherwise)
    prompt_tokens: int | None
    max_tokens: int
    seconds: float
    diff: _golden.GoldenDiff | None = None


COVERED, SKIPPED = "covered", "skipped"


@dataclass(frozen=True)
class LongContextReport:
    mode: str
    budget_s: float
    spent_s: float
    limit: int | None  # the server's context limit, in tokens (None: not known)
    limit_source: str  # where it was read (serverinfo.ContextLimit.source)
    counted_by: str  # tokenize (the server's tokenizer) | usage (calibrated) | guess (4 characters a token)
    depths: tuple[float, ...]
    lengths: tuple[LengthResult, ...]
    long_greedy: LongGreedy | None

    @property
    def covered(self) -> tuple[int, ...]:
        return tuple(r.tokens for r in self.lengths if r.status == COVERED)

    def failures(self) -> list[str]:
        out = []
        for r in self.lengths:
            if r.status == COVERED and r.passed < r.total:
                missed = [n for n in r.needles if not n.passed]
                said = "; ".join(
                    f"depth {n.depth:g}: " + (f"failed ({n.error})" if n.error else f"expected {n.expected}, got {n.got!r}")
                    for n in missed[:3]
                )
                out.append(f"long context: {r.passed}/{r.total} needles found at {r.tokens} tokens ({said})")
        g = self.long_greedy
        if g is not None and g.diff is not None:
            d = g.diff
            if not d.matched:
                out.append(
                    f"long context: the long document's greedy continuation ({g.prompt_tokens} prompt tokens) diverges "
                    f"from the golden at {d.unit} {d.position}, after {d.context}: expected {d.expected}, got {d.got}"
                )
            if d.numerics is not None and not d.numerics.passed:
                out.append(f"long context: the long document's logprobs moved from the golden: {d.numerics.reason}")
        return out

    def notes(self) -> list[str]:
        out = [f"long context: {r.tokens} tokens skipped: {r.reason}" for r in self.lengths if r.status == SKIPPED]
        if self.counted_by == "guess":
            out.append(
                "long context: the server has no tokenizer endpoint and reported no prompt usage: lengths are "
                f"estimated at {haystack.CHARS_PER_TOKEN_GUESS:g} characters a token"
            )
        g = self.long_greedy
        if g is not None and g.status == SKIPPED:
            out.append(f"long context: long greedy continuation skipped: {g.reason}")
        if g is not None and g.diff is not None and g.diff.numerics is not None and g.diff.numerics.status != _numerics.COMPARED:
            out.append(f"long context: long greedy compared on text only: {g.diff.numerics.reason}")
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LongContextReport:
        g = obj.get("long_greedy")
        return cls(
            **{
                **obj,
                "depths": tuple(obj["depths"]),
                "lengths": tuple(
                    LengthResult(**{**r, "needles": tuple(NeedleResult(**n) for n in r["needles"])}) for r in obj["lengths"]
                ),
                "long_greedy": None
                if g is None
                else LongGreedy(**{**g, "diff": None if g.get("diff") is None else _golden.diff_from_json(g["diff"])}),
            }
        )


class _Clock:
    """The budget, and each request's time estimated from those already timed (prefill grows at
    least linearly with the prompt; between two timed lengths, the exponent they show, up to 2)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.t0 = time.monotonic()
        self.timed: dict[int, float] = {}  # prompt tokens -> seconds of one request (the slowest)

    def left(self) -> float:
        return self.budget_s - self.spent()

    def spent(self) -> float:
        return time.monotonic() - self.t0

    def took(self, tokens: int, seconds: float) -> None:
        self.timed[tokens] = max(seconds, self.timed.get(tokens, 0.0))

    def estimate(self, tokens: int, extra_tokens: int = 0) -> float | None:
        """One request's seconds for a prompt of `tokens`, `extra_tokens` more output than a needle's."""
        if not self.timed:
            return None
        lengths = sorted(self.timed)
        big = lengths[-1]
        power = 1.0
        if len(lengths) > 1 and self.timed[lengths[-2]] > 0 and self.timed[big] > 0:
            power = math.log(self.timed[big] / self.timed[lengths[-2]]) / math.log(big / lengths[-2])
            power = min(2.0, max(1.0, power))
        per_output = self.timed[lengths[0]] / ANSWER_TOKENS  # an upper bound: that request's prefill is in it
        return self.timed[big] * (max(tokens, 1) / big) ** power + extra_tokens * per_output


def _status_of(exc: HTTPError) -> int:
    head = str(exc).split(" ", 1)[0]
    return int(head) if head.isdigit() else 0


def _excerpt(text: str, n: int = 40) -> str:
    return " ".join(text.split())[:n]


def run(
    client: OpenAIClient,
    settings: Settings,
    golden_path: Path | None = None,
    record_golden: bool = False,
    extra: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    server_limit: ContextLimit | None = None,  # serverinfo.context_limit's reading, when the run has it
) -> LongContextReport:
    """The needles at each length the limit and the budget allow, then the long greedy run against
    the golden file's (or recorded into it, with --record-golden). NetworkError (exit 3) only when
    the server never answered; a failed request is a failed needle, named."""
    say = progress or (lambda _msg: None)
    plan = PLANS[settings.mode]
    clock = _Clock(settings.budget_s if settings.budget_s is not None else plan.budget_s)
    if settings.max_context is not None or server_limit is None:
        limit = context_limit(client, settings.max_context)
    else:
        limit = server_limit
    counter = haystack.TokenCounter(client, dict(extra or {}))
    depths = settings.depths or plan.depths
    lengths, limit = _run_needles(client, counter, settings.lengths or plan.lengths, depths, limit, clock, extra, say)
    if any(n.error for r in lengths for n in r.needles):
        long_greedy = LongGreedy(SKIPPED, "a needle request got no usable answer", None, LONG_MAX_TOKENS, 0.0)
    else:
        long_greedy = _run_long(client, counter, golden_path, record_golden, limit, clock, extra, say)
    return LongContextReport(
        settings.mode,
        clock.budget_s,
        clock.spent(),
        limit.tokens,
        limit.source,
        counter.method or "guess",
        tuple(depths),
        tuple(lengths),
        long_greedy,
    )


def _lengths_within(lengths: tuple[int, ...], limit: int | None) -> tuple[list[int], list[int]]:
    """(lengths to try, ascending, with the limit's own usable length in place of those past it;
    lengths past the limit)."""
    if limit is None:
        return sorted(lengths), []
    usable = limit - ANSWER_TOKENS - HEADROOM
    inside = sorted(n for n in lengths if n <= usable)
    over = sorted(n for n in lengths if n > usable)
    if over and usable > 0 and (not inside or usable > inside[-1] * 1.1):
        inside.append(usable)  # "capped by the server's limit": its longest prompt is the one that matters
    return inside, over


def _run_needles(
    client: OpenAIClient,
    counter: haystack.TokenCounter,
    asked: tuple[int, ...],
    depths: tuple[float, ...],
    limit: ContextLimit,
    clock: _Clock,
    extra: Mapping[str, Any] | None,
    say: Progress,
) -> tuple[list[LengthResult], ContextLimit]:
    todo, over = _lengths_within(asked, limit.tokens)
    results: list[LengthResult] = []
    stop = ""  # once set, every longer length is skipped for this reason
    for tokens in todo:
        est = clock.estimate(tokens)
        if not stop and est is not None and est * len(depths) > clock.left():
            stop = f"budget (estimated {est * len(depths):.0f} s, {max(0.0, clock.left()):.0f} s of {clock.budget_s:g} s left)"
        if stop:
            results.append(LengthResult(tokens, SKIPPED, stop, 0, 0, 0.0))
            continue
        say(f"long context: needles at {tokens} tokens, depths {', '.join(f'{d:g}' for d in depths)}")
        filler, _n = haystack.sized(counter, partial(haystack.document, tokens), tokens - 32, None)
        needles: list[NeedleResult] = []
        t_len = time.monotonic()
        for i, depth in enumerate(depths):
            if needles and clock.left() <= 0:  # the estimate was short: the budget holds all the same
                stop = f"budget ({clock.budget_s:g} s spent at {tokens} tokens, after {len(needles)} of {len(depths)} depths)"
                break
            needle = haystack.needle_prompt(filler, depth, seed=tokens * 100 + i)
            t0 = time.monotonic()
            try:
                reply = client.complete(
                    COMPLETIONS, needle.prompt, ANSWER_TOKENS, temperature=0.0, extra=extra, label=f"needle {tokens}/{depth:g}"
                )
            except HTTPError as exc:
                told = limit_from_error(str(exc))
                if told is not None:
                    limit = ContextLimit(told, "its error")
                    stop = f"over the server's limit ({told} tokens, from its error)"
                    break
                if 400 <= _status_of(exc) < 500:
                    stop = f"the server refused it: {_excerpt(str(exc), 160)}"
                    break
                needles.append(NeedleResult(depth, None, needle.value, "", False, time.monotonic() - t0, _excerpt(str(exc), 160)))
                continue
            except (RequestFailed, BadServerReply) as exc:
                # No answer within the deadline (or a broken one) at this length: a longer prompt would
                # only wait longer. The failure is named, and the rest is not sent.
                needles.append(NeedleResult(depth, None, needle.value, "", False, time.monotonic() - t0, _excerpt(str(exc), 160)))
                stop = f"a request at {tokens} tokens got no usable answer"
                break
            seconds = time.monotonic() - t0
            said = reply.prompt_tokens
            # a usage that is no count of this prompt (a constant) would scale every estimate absurdly
            clock.took(said if said and tokens / 2 <= said <= tokens * 2 else tokens, seconds)
            found = needle.value in reply.content
            needles.append(NeedleResult(depth, reply.prompt_tokens, needle.value, _excerpt(reply.content), found, seconds))
        if stop and not needles:
            results.append(LengthResult(tokens, SKIPPED, stop, 0, 0, 0.0))
            continue
        passed = sum(n.passed for n in needles)
        results.append(LengthResult(tokens, COVERED, "", passed, len(needles), time.monotonic() - t_len, tuple(needles)))
    for tokens in over:
        results.append(
            LengthResult(tokens, SKIPPED, f"over the server's limit ({limit.tokens} tokens, {limit.source})", 0, 0, 0.0)
        )
    return sorted(results, key=lambda r: r.tokens), limit


def _long_entry_prompt(entry: _golden.LongEntry) -> str | None:
    text = haystack.document(entry.seed, entry.chars)
    return text if haystack.digest(text) == entry.prompt_sha256 else None


def _generate(client: OpenAIClient, prompt: str, max_tokens: int, extra: Mapping[str, Any] | None) -> Any:
    label = "long greedy continuation"
    try:
        return client.complete(COMPLETIONS, prompt, max_tokens, temperature=0.0, logprobs=True, extra=extra, label=label)
    except HTTPError as exc:
        if limit_from_error(str(exc)) is not None:
            raise
        # Some servers refuse logprobs (llama-cpp-python started with --logits_all False): text still compares.
        return client.complete(COMPLETIONS, prompt, max_tokens, temperature=0.0, extra=extra, label=label)


def _run_long(
    client: OpenAIClient,
    counter: haystack.TokenCounter,
    golden_path: Path | None,
    record_golden: bool,
    limit: ContextLimit,
    clock: _Clock,
    extra: Mapping[str, Any] | None,
    say: Progress,
) -> LongGreedy:
    def skipped(why: str, tokens: int | None = None) -> LongGreedy:
        return LongGreedy(SKIPPED, why, tokens, LONG_MAX_TOKENS, 0.0)

    if golden_path is None:
        return skipped("no golden file to compare with (--golden PATH; record it on a known-good server with --record-golden)")
    rec = None
    if golden_path.exists():
        rec = _golden.GoldenRecord.load(golden_path)
    if rec is None:
        return skipped(f"no golden file at {golden_path}")
    if rec.model != client.resolve_model():
        return skipped(f"the golden file was recorded from model {rec.model!r}")
    if record_golden:
        usable = None if limit.tokens is None else limit.tokens - LONG_MAX_TOKENS - HEADROOM
        target = LONG_TOKENS if usable is None else min(LONG_TOKENS, usable)
        prompt, counted = haystack.sized(counter, lambda chars: haystack.document(LONG_SEED, chars), target, usable)
        entry = None
    else:
        entry = rec.long
        if entry is None:
            return skipped(
                f"{golden_path} has no long document (recorded before it was kept: record it again with --record-golden)"
            )
        rebuilt = _long_entry_prompt(entry)
        if rebuilt is None:
            return skipped("the golden file's long document could not be rebuilt (another patchctl generated it)")
        prompt, counted = rebuilt, entry.prompt_tokens
        if limit.tokens is not None and counted + entry.max_tokens > limit.tokens:
            return skipped(f"over the server's limit ({limit.tokens} tokens, {limit.source})", counted)
    tokens = counted or int(len(prompt) / counter.chars_per_token)
    est = clock.estimate(tokens, LONG_MAX_TOKENS - ANSWER_TOKENS)
    if est is not None and est > clock.left():
        return skipped(f"budget (estimated {est:.0f} s, {max(0.0, clock.left()):.0f} s of {clock.budget_s:g} s left)", tokens)
    say(f"long context: greedy continuation of a {tokens}-token document")
    t0 = time.monotonic()
    try:
        reply = _generate(client, prompt, LONG_MAX_TOKENS, extra)
    except HTTPError as exc:
        told = limit_from_error(str(exc))
        why = (
            f"over the server's limit ({told} tokens, from its error)"
            if told
            else f"the server refused it: {_excerpt(str(exc), 160)}"
        )
        return skipped(why, tokens)
    seconds = time.monotonic() - t0
    got = _golden.GoldenEntry(f"long document ({tokens} tokens)", reply.content, reply.tokens, reply.logprobs)
    if entry is None:
        new = _golden.LongEntry(
            LONG_SEED, len(prompt), reply.prompt_tokens or tokens, haystack.digest(prompt), LONG_MAX_TOKENS,
            reply.content, reply.tokens, reply.logprobs,
        )  # fmt: skip
        rec._replace(long=new).save(golden_path)
        return LongGreedy("recorded", "", new.prompt_tokens, LONG_MAX_TOKENS, seconds)
    expected = _golden.GoldenEntry(got.prompt, entry.text, entry.tokens, entry.logprobs)
    return LongGreedy("compared", "", tokens, entry.max_tokens, seconds, _golden.diff_entry(expected, got))
