"""Load generation: N requests at a fixed concurrency, measured per request."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from patchctl.serve.client import OpenAIClient
from patchctl.serve.metrics import LevelMetrics, RequestRecord, aggregate

DEFAULT_PROMPT = (
    "Write a detailed, multi-paragraph essay about the history of lighthouses, "
    "their keepers, and how their technology changed over two centuries."
)


def default_requests(concurrency: int) -> int:
    # Two waves per level, so the level is not just its first batch's ramp-up.
    return max(4, 2 * concurrency)


def run_level(
    client: OpenAIClient,
    concurrency: int,
    num_requests: int,
    api: str,
    prompt: str,
    max_tokens: int,
    stream: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> LevelMetrics:
    def one(_: int) -> RequestRecord:
        return client.timed_request(api, prompt, max_tokens, stream=stream, extra=extra)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        records: Sequence[RequestRecord] = list(pool.map(one, range(num_requests)))
    # Wall time from the first request sent to the last reply done: pool start-up
    # and teardown are not the server's time.
    duration = max(r.end for r in records) - min(r.start for r in records)
    return aggregate(concurrency, records, duration, stream)


def warm_up(client: OpenAIClient, api: str, prompt: str, n: int, extra: Mapping[str, Any] | None = None) -> None:
    """Untimed requests first: the first one pays for lazy loading and caches."""
    for _ in range(n):
        client.timed_request(api, prompt, 8, stream=True, extra=extra)
