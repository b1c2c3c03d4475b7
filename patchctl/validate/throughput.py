"""Load generation: N requests at a fixed concurrency, measured per request."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Mapping
from typing import Any

from patchctl.validate.client import PROBE_TIMEOUT_S, OpenAIClient
from patchctl.validate.loadgen import Slot, Target, timed_request
from patchctl.validate.metrics import LevelMetrics, RequestRecord, aggregate

# The field's deterministic throughput prompt (the one people quote single-request tok/s with): at
# temperature 0 every request decodes the same ~100-150 tokens, so requests differ only in timing.
COUNTING_PROMPT = "Count from 1 to 50, writing each number on a new line."
# What validate used before: open-ended, so its length is set by max_tokens alone.
ESSAY_PROMPT = (
    "Write a detailed, multi-paragraph essay about the history of lighthouses, "
    "their keepers, and how their technology changed over two centuries."
)
PROMPTS = {"counting": COUNTING_PROMPT, "essay": ESSAY_PROMPT}
DEFAULT_PROMPT_NAME = "counting"
DEFAULT_PROMPT = PROMPTS[DEFAULT_PROMPT_NAME]
TEMPERATURE = 0.0  # every throughput request: greedy, so runs decode the same tokens

# Requests per level by default: at least 16, and two waves (2 x concurrency) above 8.
# 16: the baseline fails a drop of more than 5%, so the level's own noise must sit well inside 5%.
# The median of n requests has a standard error of about 1.25 s/sqrt(n) (s: the spread of one
# request's tok/s, a few % with the counting prompt at temperature 0), so its 95% interval is about
# +-2.5 s/sqrt(n): with s = 4%, n = 16 gives +-2.5%, half the threshold (4 requests gave +-5%, as
# wide as the threshold itself). Two waves, so a level is not just its first batch's ramp-up.
MIN_REQUESTS = 16


def default_requests(concurrency: int) -> int:
    return max(MIN_REQUESTS, 2 * concurrency)


def resolve_prompt(spec: str) -> tuple[str, str]:
    """--prompt: `counting`, `essay`, or a text file whose content is the prompt -> (name, text); the
    name of a file is its path as given. UsageError for a file that cannot be a prompt."""
    from pathlib import Path

    from patchctl.core.errors import UsageError

    if spec in PROMPTS:
        return spec, PROMPTS[spec]
    path = Path(spec)
    hint = f"--prompt takes {' or '.join(PROMPTS)}, or a text file (./{spec} for a file of that name)"
    if not path.is_file():
        raise UsageError(f"--prompt {spec!r}: no such file", hint=hint)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--prompt {spec!r}: not a readable UTF-8 text file ({exc})", hint=hint) from None
    if not text.strip():
        raise UsageError(f"--prompt {spec!r}: the file is empty", hint=hint)
    return spec, text


def request_prompts(prompt: str, n: int, unique: bool = True) -> list[str]:
    """The prompt of each of a level's n requests. Unique (the default): each starts with a tag of
    its own ("[3f9a1c-7] ", random per level), so a prefix cache (vLLM's automatic prefix caching,
    SGLang's radix cache, llama.cpp's prompt reuse: all on by default) cannot serve a request's
    prefill from an earlier one's, and TTFT is a prefill, as with the peers' random prompts. Shared
    (--shared-prompt): the same text every time, which measures the cache-hit path."""
    if not unique:
        return [prompt] * n
    import secrets

    run = secrets.token_hex(3)
    return [f"[{run}-{i}] {prompt}" for i in range(n)]


def prompt_digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]


LEVEL_SLACK_S = 1.0  # a wave's time between its requests (taking the next, a reconnect), in a level's deadline


def level_deadline(num_requests: int, concurrency: int, timeout_s: float) -> float:
    """A level's default deadline: its waves (ceil(requests / concurrency)) times one request's, and
    LEVEL_SLACK_S a wave, so that by default no request's own deadline is cut short by the level's."""
    return math.ceil(num_requests / max(1, concurrency)) * (timeout_s + LEVEL_SLACK_S)


def run_level(
    client: OpenAIClient,
    concurrency: int,
    num_requests: int,
    api: str,
    prompt: str,
    max_tokens: int,
    stream: bool = True,
    extra: Mapping[str, Any] | None = None,
    unique_prompts: bool = True,
    level_timeout_s: float | None = None,
) -> LevelMetrics:
    """`num_requests` requests, never more than `concurrency` in flight, the first `concurrency` of
    them sent at once; each with a prompt of its own unless unique_prompts is off (request_prompts).

    On one asyncio loop (loadgen.py: why, and what it keeps of the blocking client): one slot per
    request in flight, each with its connection opened before the level begins (a timed request
    pays no TCP set-up), taking requests from a shared counter. The client's CPU time over the
    level (this thread's: the loop does all the reading) per output token is in the result
    (client_cpu_ms_per_token): a client near a core's worth of it would be measuring itself.

    The level ends by its deadline (level_timeout_s once the connections are open; default
    level_deadline): a request in flight then is cut off with it, one not yet sent is not sent; both
    are failures that say so. Each request also has its own deadline, the client's --timeout.
    """
    return asyncio.run(
        _level(client, concurrency, num_requests, api, prompt, max_tokens, stream, extra, unique_prompts, level_timeout_s)
    )


async def _level(
    client: OpenAIClient,
    concurrency: int,
    num_requests: int,
    api: str,
    prompt: str,
    max_tokens: int,
    stream: bool,
    extra: Mapping[str, Any] | None,
    unique_prompts: bool,
    level_timeout_s: float | None,
) -> LevelMetrics:
    target = Target(client.base_url)
    slots = [Slot(target) for _ in range(max(1, min(concurrency, num_requests)))]
    bodies = []
    for text in request_prompts(prompt, num_requests, unique_prompts):
        body = client.request_body(api, text, max_tokens, TEMPERATURE, extra)
        if stream:
            body["stream"] = True
            body.setdefault("stream_options", {"include_usage": True})
        bodies.append(body)

    async def open_one(slot: Slot) -> None:
        try:
            await asyncio.wait_for(slot.open(), min(PROBE_TIMEOUT_S, client.timeout_s))
        except (OSError, asyncio.TimeoutError):
            slot.drop()  # left to the timed request, which opens its own and reports what failed

    await asyncio.gather(*(open_one(s) for s in slots))
    seconds = level_timeout_s if level_timeout_s is not None else level_deadline(num_requests, concurrency, client.timeout_s)
    why = f"the deadline of level c={concurrency}, {seconds:g} s (--level-timeout)"
    ends = time.perf_counter() + seconds
    taken = itertools.count()
    records: list[RequestRecord] = [_not_run(f"no result by {why}")] * num_requests

    async def work(slot: Slot) -> None:
        while (i := next(taken)) < num_requests:
            left = ends - time.perf_counter()
            if left <= 0:
                records[i] = _not_run(f"not sent: {why} had passed")
                continue
            own = client.timeout_s
            records[i] = await timed_request(
                client,
                slot,
                api,
                bodies[i],
                stream,
                max_tokens,
                label=f"c={concurrency} request {i + 1}",
                seconds=min(own, left),
                why=why if left < own else None,
            )

    cpu = time.thread_time()
    try:
        await asyncio.gather(*(work(s) for s in slots))
    finally:
        for slot in slots:
            slot.drop()
    cpu = time.thread_time() - cpu
    sent = [r for r in records if r.end > r.start] or records
    # Wall time from the first request sent to the last reply done: connection set-up is not the server's time.
    duration = max(r.end for r in sent) - min(r.start for r in sent)
    level = aggregate(concurrency, records, duration, stream)
    tokens = level.output_tokens or sum(r.chunk_tokens for r in records if r.ok)
    return level._replace(client_cpu_ms_per_token=cpu * 1000 / tokens if tokens else None)


def _not_run(error: str) -> RequestRecord:
    now = time.perf_counter()
    return RequestRecord(
        ok=False, error=error, streamed=True, start=now, end=now, chunk_times=(), usage_tokens=None, content="", reasoning=""
    )


def warm_up(client: OpenAIClient, api: str, prompt: str, n: int, extra: Mapping[str, Any] | None = None) -> None:
    """Untimed requests first: the first one pays for lazy loading and caches. NetworkError when the
    server answered none of them, nor anything before (client.require_answer)."""
    for k in range(n):
        client.timed_request(api, prompt, 8, stream=True, temperature=TEMPERATURE, extra=extra, label=f"warm-up {k + 1}")
        client.require_answer()
