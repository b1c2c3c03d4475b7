"""Load generation: N requests at a fixed concurrency, measured per request."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
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
) -> LevelMetrics:
    def one(_: int) -> RequestRecord:
        return client.timed_request(api, prompt, max_tokens, stream=stream, temperature=TEMPERATURE, extra=extra)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        records: Sequence[RequestRecord] = list(pool.map(one, range(num_requests)))
    # Wall time from the first request sent to the last reply done: pool start-up
    # and teardown are not the server's time.
    duration = max(r.end for r in records) - min(r.start for r in records)
    return aggregate(concurrency, records, duration, stream)


def warm_up(client: OpenAIClient, api: str, prompt: str, n: int, extra: Mapping[str, Any] | None = None) -> None:
    """Untimed requests first: the first one pays for lazy loading and caches."""
    for _ in range(n):
        client.timed_request(api, prompt, 8, stream=True, temperature=TEMPERATURE, extra=extra)
