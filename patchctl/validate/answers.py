"""Coherence mode `answers`: prompts whose replies a program can check.

Each check is a pure function of the reply text so it is tested on fixed
strings; the prompts go to the server at temperature 0. The code task is checked
by parsing the reply, never by executing what a model wrote.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from patchctl.core.errors import NetworkError
from patchctl.validate.client import CHAT, OpenAIClient


class Verdict(NamedTuple):
    passed: bool
    reason: str


class AnswerCheck(NamedTuple):
    name: str
    prompt: str
    max_tokens: int
    check: Callable[[str], Verdict]


class AnswerResult(NamedTuple):
    name: str
    passed: bool
    reason: str
    reply_excerpt: str
    reasoning_chars: int
    # Added after format 1 was first written; defaults keep older stored reports readable.
    reasoning_passed: bool | None = None  # the check applied to reasoning_content; None without reasoning
    finish_reason: str | None = None  # the server's, e.g. "length" when max_tokens cut the reply off
    max_tokens: int | None = None  # what the request allowed: the check's own plus --reasoning-budget


def check_fact(reply: str) -> Verdict:
    if re.search(r"\bparis\b", reply, re.IGNORECASE):
        return Verdict(True, "names Paris")
    return Verdict(False, "does not name Paris")


def check_arithmetic(reply: str) -> Verdict:
    numbers = re.findall(r"-?\d[\d,]*", reply)
    values = [n.replace(",", "") for n in numbers]
    if "391" in values:
        return Verdict(True, "answers 391")
    return Verdict(False, f"expected 391, found numbers {values[:5] or 'none'}")


def check_counting(reply: str) -> Verdict:
    """1..50, one per line, in order; a sentence around the list is tolerated."""
    lines = [ln.strip().rstrip(".,") for ln in reply.splitlines()]
    numbers = [ln for ln in lines if ln]
    try:
        start = numbers.index("1")
    except ValueError:
        first = repr(numbers[0][:30]) if numbers else "nothing"
        return Verdict(False, f"no line reading '1' (first line: {first})")
    run = numbers[start : start + 50]
    for expected, got in enumerate(run, start=1):
        if got != str(expected):
            return Verdict(False, f"line for {expected} reads {got[:30]!r}")
    if len(run) < 50:
        return Verdict(False, f"stops after {len(run)} of 50 lines")
    return Verdict(True, "counts 1 to 50 line by line")


def extract_code(reply: str) -> str:
    fenced = re.findall(r"```(?:python|py)?\s*\n(.*?)```", reply, re.DOTALL)
    return fenced[0] if fenced else reply


def check_code(reply: str) -> Verdict:
    """`def add(a, b): return a + b` in any spelling of the two parameter names."""
    try:
        tree = ast.parse(extract_code(reply))
    except SyntaxError as exc:
        return Verdict(False, f"reply is not valid Python: {exc.msg}")
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "add":
            params = [a.arg for a in node.args.args]
            if len(params) != 2:
                return Verdict(False, f"add takes {len(params)} parameters, not 2")
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.Return) and _is_sum_of(stmt.value, params):
                    return Verdict(True, "defines add(a, b) returning a + b")
            return Verdict(False, "add does not return the sum of its parameters")
    return Verdict(False, "no function named add")


def _is_sum_of(expr: ast.expr | None, params: Sequence[str]) -> bool:
    if not isinstance(expr, ast.BinOp) or not isinstance(expr.op, ast.Add):
        return False
    names = [n.id for n in (expr.left, expr.right) if isinstance(n, ast.Name)]
    return sorted(names) == sorted(params)


DEFAULT_CHECKS: tuple[AnswerCheck, ...] = (
    AnswerCheck("fact", "What is the capital of France? Answer in one word.", 32, check_fact),
    AnswerCheck("arithmetic", "What is 17 * 23? Answer with just the number.", 32, check_arithmetic),
    AnswerCheck(
        "counting",
        "Count from 1 to 50, one number per line. Write nothing else.",
        # ~2 tokens per line; headroom so a slightly chatty model is not cut off.
        320,
        check_counting,
    ),
    AnswerCheck(
        "code",
        "Write a Python function add(a, b) that returns the sum of a and b. Reply with only the code.",
        128,
        check_code,
    ),
)


def run_answers(
    client: OpenAIClient,
    checks: Sequence[AnswerCheck] = DEFAULT_CHECKS,
    api: str = CHAT,
    extra_tokens: int = 0,
    extra: Mapping[str, Any] | None = None,
) -> tuple[AnswerResult, ...]:
    """extra_tokens: budget added to every check, for reasoning models that think first."""
    results = []
    for chk in checks:
        budget = chk.max_tokens + extra_tokens
        try:
            reply = client.complete(api, chk.prompt, budget, temperature=0.0, extra=extra, label=f"answers/{chk.name}")
        except NetworkError:
            raise  # the server never answered anything: no check can run (exit 3)
        except Exception as exc:  # a failed request is a failed check, with its cause
            results.append(AnswerResult(chk.name, False, f"request failed: {exc}"[:300], "", 0, max_tokens=budget))
            continue
        verdict, reasoning_passed = judge(chk, reply.content, reply.reasoning, budget, reply.finish_reason)
        results.append(
            AnswerResult(
                chk.name,
                verdict.passed,
                verdict.reason,
                _excerpt(reply.content),
                len(reply.reasoning),
                reasoning_passed,
                reply.finish_reason,
                budget,
            )
        )
    return tuple(results)


def judge(
    chk: AnswerCheck, content: str, reasoning: str, budget: int, finish_reason: str | None = None
) -> tuple[Verdict, bool | None]:
    """The verdict on one reply, and whether its reasoning_content alone would pass (None: none).

    The answer must be in `content`: a reasoning model that only thought (content empty or null)
    did not answer, whatever its reasoning says. Saying how much it thought, whether it was cut off
    and whether the thinking got the answer right tells a budget that is too small (raise it) from a
    broken reply (a bug to chase)."""
    reasoning_passed = chk.check(reasoning).passed if reasoning.strip() else None
    right_in_reasoning = "; the reasoning reached the right answer, the reply did not" if reasoning_passed else ""
    if not content.strip():
        if not reasoning.strip():
            return Verdict(False, "empty content"), None
        budget_hint = (
            "raise --reasoning-budget (it adds tokens to every answers prompt's max_tokens) or cap the server's reasoning budget"
        )
        if finish_reason == "length":
            why = f"cut off at max_tokens {budget}): {budget_hint}"
        else:
            # It stopped on its own: the reply may sit in the reasoning channel (a reasoning parser
            # that misses the end of thinking), or it thought to the end and said nothing.
            why = (
                f"finish_reason {finish_reason or 'none'} within max_tokens {budget}): check the server's "
                f"reasoning parser, or {budget_hint}"
            )
        return Verdict(
            False, f"the answer is only in reasoning_content ({len(reasoning)} chars, {why}" + right_in_reasoning
        ), reasoning_passed
    verdict = chk.check(content)
    if not verdict.passed and right_in_reasoning:
        verdict = Verdict(False, verdict.reason + right_in_reasoning)
    return verdict, reasoning_passed


def _excerpt(text: str, limit: int = 160) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
