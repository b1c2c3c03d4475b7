"""Load generation: N requests at a fixed concurrency, measured per request."""
from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import Any

from patchctl.serve.client import OpenAIClient
from patchctl.serve.metrics import LevelMetrics, RequestRecord, aggregate

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
BARRIER_TIMEOUT_S = 60.0  # the slowest worker's connection set-up, at most


def default_requests(concurrency: int) -> int:
    return max(MIN_REQUESTS, 2 * concurrency)


def resolve_prompt(spec: str) -> tuple[str, str]:
    """--prompt: `counting`, `essay`, or a text file whose content is the prompt -> (name, text); the
    name of a file is its path as given. UsageError for a file that cannot be a prompt."""
    from pathlib import Path

    from patchctl.errors import UsageError

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
) -> LevelMetrics:
    """`num_requests` requests, never more than `concurrency` in flight, the first `concurrency` of
    them sent at once; each with a prompt of its own unless unique_prompts is off (request_prompts).

    One worker thread per slot, each started and its connection opened before the level begins;
    they wait at one barrier and then take requests from a shared counter. Without that (a pool's
    workers created as work is submitted, each opening its connection in its first timed request)
    the first wave left over some tens of ms, and one wave of 32 requests is a large part of a
    level's wall time: output throughput read 15% under SGLang's bench_serving, whose asyncio loop
    sends a wave at once.
    """
    workers = max(1, min(concurrency, num_requests))
    barrier = threading.Barrier(workers)
    taken = itertools.count()
    records: list[RequestRecord | None] = [None] * num_requests
    prompts = request_prompts(prompt, num_requests, unique_prompts)

    def work() -> None:
        client.connect()
        try:
            barrier.wait(timeout=BARRIER_TIMEOUT_S)
        except threading.BrokenBarrierError:
            pass  # a worker that never arrived: the others go on rather than hang
        while (i := next(taken)) < num_requests:
            records[i] = client.timed_request(
                api, prompts[i], max_tokens, stream=stream, temperature=TEMPERATURE, extra=extra
            )

    threads = [threading.Thread(target=work, name=f"validate-{k}", daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in records if r is not None]
    # Wall time from the first request sent to the last reply done: thread start-up and teardown
    # are not the server's time.
    duration = max(r.end for r in done) - min(r.start for r in done)
    return aggregate(concurrency, done, duration, stream)


def warm_up(client: OpenAIClient, api: str, prompt: str, n: int, extra: Mapping[str, Any] | None = None) -> None:
    """Untimed requests first: the first one pays for lazy loading and caches."""
    for _ in range(n):
        client.timed_request(api, prompt, 8, stream=True, temperature=TEMPERATURE, extra=extra)
