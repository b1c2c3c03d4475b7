"""An OpenAI-compatible model on the one test server that answers like a reasoning model, with
known timings.

Not a mock of the client: it speaks HTTP and SSE over a socket, in the shapes vLLM's reasoning
parsers produce (`reasoning_content` deltas with `content: null`, a usage-only final chunk with
`choices: []`), so the serve tier is exercised end to end in milliseconds. Knobs on
`Reasoner.settings` switch usage reporting off, answer wrongly, shift a golden token, think for
longer than a small max_tokens allows (the answer then never reaches `content`), make requests
unevenly fast, wait before the first token (a known TTFT), and frame the stream chunked,
close-delimited or buffered (as a buffering proxy delivers it).

`python -m support.reasoner --port PORT` runs it as a process, for tests of `--start` and
of the process manager (`--delay`, `--exit`, `--child`, `--ignore-term` make it slow, broken or
stubborn on demand).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from checklib.testserver import CHUNKED, Reply, Request, TestServer, json_reply, sse_reply

MODEL = "tiny-reasoner"
THINKING = ["Let", " me", " think", "."]
PROMPT_TOKENS = 5

ANSWERS = {
    "capital of France": ["Paris", "."],
    "17 * 23": ["391"],
    "Count from 1 to 50": [f"{i}\n" for i in range(1, 51)],
    "add(a, b)": ["```python\n", "def add(a, b):\n", "    return a + b\n", "```"],
}
WRONG = {
    "capital of France": ["Lyon"],
    "17 * 23": ["392"],
    "Count from 1 to 50": [f"{i}\n" for i in range(1, 30)],
    "add(a, b)": ["def add(a, b):\n", "    return a - b\n"],
}


def completion_tokens(prompt: str, n: int, shift_at: int | None) -> list[str]:
    """Deterministic 'greedy' continuation; shift_at changes one token, like a numerics drift."""
    toks = [f" w{(len(prompt) * 7 + i * 3) % 50}" for i in range(n)]
    if shift_at is not None and shift_at < n:
        toks[shift_at] = " DRIFT"
    return toks


def prompt_tokens(prompt: str) -> int:
    """This model's tokenizer: 4 characters a token (what /tokenize and a completion's usage say)."""
    return max(1, len(prompt) // 4)


def default_settings() -> dict[str, Any]:
    return {
        "usage": True,  # honour stream_options.include_usage / put usage in replies
        "wrong": False,  # answer the coherence prompts wrongly
        "reasoning": True,  # think (reasoning_content) before answering
        "think_tokens": 0,  # more thinking tokens: a small max_tokens ends before any content
        "reasoning_has_answer": False,  # the thinking states the right answer (even when `wrong`)
        "shift_at": None,  # golden: change the token at this index
        "delay_s": 0.002,  # before each streamed output chunk, so timings are not all zero
        "ttft_s": 0.0,  # more before the first output chunk: the prefill of a known TTFT
        "role_at_first_token": False,  # the role chunk waits for prefill (as vLLM and SGLang send it)
        "framing": CHUNKED,  # of streams: chunked, close (close-delimited) or buffered
        "version": "0.0.0+shape",
        "fail": False,  # answer every POST with HTTP 500
        "truncate_after": None,  # end chat streams after this many chunks, no finish_reason/[DONE]
        "delay_cycle": None,  # per-chunk delays, one per POST in turn: requests of uneven speed
        "max_model_len": 8192,  # the context limit (None: none), said in /v1/models as vLLM says it
        "say_max_model_len": True,  # False: /v1/models does not say it (llama-cpp-python's does not)
        "prefill_s_per_1k": 0.0,  # a completion waits this long per 1,000 prompt tokens: a known prefill
        "tokenize": True,  # answer POST /tokenize as vLLM does ({count}), at 4 characters a token
        "needle_lost_past": None,  # tokens: a needle in a longer prompt is not found (a long-context fault)
        "logprob": -0.1,  # every completion token's logprob (a numerics drift: another value)
        "context_error": False,  # refuse prompts over max_model_len in vLLM's words, instead of answering
    }


NEEDLE_QUESTION = re.compile(r"The secret word of the (.+?) is$")


class Reasoner:
    """The model as a responder: `Reasoner()(request)`. `requests` holds every POST's JSON body."""

    def __init__(self) -> None:
        self.settings = default_settings()
        self.requests: list[dict[str, Any]] = []
        self._posts = itertools.count()
        self._lock = threading.Lock()

    def __call__(self, request: Request) -> Reply | None:
        if request.method in ("GET", "HEAD"):
            if request.path == "/v1/models":
                card: dict[str, Any] = {"id": MODEL, "object": "model"}
                if self.settings["max_model_len"] is not None and self.settings["say_max_model_len"]:
                    card["max_model_len"] = self.settings["max_model_len"]
                return json_reply({"object": "list", "data": [card]})
            if request.path == "/version" and self.settings["version"]:
                return json_reply({"version": self.settings["version"]})
            return None
        if request.method != "POST":
            return None
        body = request.json()
        if request.path == "/tokenize":
            if not self.settings["tokenize"]:
                return None
            return json_reply({"count": prompt_tokens(body.get("prompt", "")), "max_model_len": self.settings["max_model_len"]})
        s = self.settings
        with self._lock:
            self.requests.append(body)
            post = next(self._posts)
        cycle = s["delay_cycle"]
        delay = cycle[post % len(cycle)] if cycle else s["delay_s"]
        if s["fail"]:
            return json_reply({"error": {"message": "engine core died (pretend)"}}, 500)
        # OpenAI's newer name first (SGLang's bench_serving sends it), as vLLM and SGLang accept both.
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens", 16))
        if request.path == "/v1/chat/completions":
            return self._chat(body, max_tokens, delay)
        if request.path == "/v1/completions":
            return self._completion(body, max_tokens, delay)
        return None

    def _usage(self, n: int) -> dict[str, int]:
        return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": PROMPT_TOKENS + n}

    def _chat(self, body: dict[str, Any], max_tokens: int, delay: float) -> Reply:
        s = self.settings
        prompt = body["messages"][-1]["content"]
        table = WRONG if s["wrong"] else ANSWERS
        answer = next((v for k, v in table.items() if k in prompt), None)
        if answer is None:
            answer = [f" tok{i}" for i in range(max_tokens)]
        # A thinking model can get it right while thinking and still reply wrongly.
        right = next((v for k, v in ANSWERS.items() if k in prompt), answer)
        thinking = THINKING + (["\n", *right] if s["reasoning_has_answer"] else []) + [" hmm"] * s["think_tokens"]
        pieces = [("reasoning", t) for t in thinking if s["reasoning"]] + [("content", t) for t in answer]
        # As engines say it: "length" when max_tokens cut the reply short.
        finish = "length" if len(pieces) > max_tokens else "stop"
        pieces = pieces[:max_tokens]
        if body.get("stream"):
            return sse_reply(self._chat_events(pieces, body, finish, delay), s["framing"])
        reasoning = "".join(t for k, t in pieces if k == "reasoning")
        content = "".join(t for k, t in pieces if k == "content")
        msg = {"role": "assistant", "content": content or None, "reasoning_content": reasoning or None}
        reply: dict[str, Any] = {
            "id": "x",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
        }
        if s["usage"]:
            reply["usage"] = self._usage(len(pieces))
        return json_reply(reply)

    def _chat_events(
        self, pieces: list[tuple[str, str]], body: dict[str, Any], finish: str, delay: float
    ) -> Iterator[tuple[float, str | dict[str, Any]]]:
        chunk = "chat.completion.chunk"
        # vLLM's first chunk: the role, no output yet. Sent at once, or (role_at_first_token) when
        # prefill is done, right before the first token, as vLLM's and SGLang's servers send it: a
        # client that starts TTFT at the first chunk of any kind (vLLM's `bench serve`) then agrees.
        late = bool(self.settings["role_at_first_token"]) and bool(pieces)
        yield (
            (self._delay(0, delay) if late else 0.0),
            {"object": chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        )
        for i, (kind, text) in enumerate(pieces):
            if self.settings["truncate_after"] == i:
                # As llama-cpp-python ends a stream it interrupts: [DONE], never a finish_reason.
                yield 0.0, "[DONE]"
                return
            delta = {"content": None, "reasoning_content": text} if kind == "reasoning" else {"content": text}
            yield (
                (0.0 if late and i == 0 else self._delay(i, delay)),
                {"object": chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            )
        yield 0.0, {"object": chunk, "choices": [{"index": 0, "delta": {"content": None}, "finish_reason": finish}]}
        yield from self._end(len(pieces), body, chunk)

    def _delay(self, i: int, delay: float) -> float:
        return delay + (float(self.settings["ttft_s"]) if i == 0 else 0.0)

    def _end(self, n_tokens: int, body: dict[str, Any], obj: str) -> Iterator[tuple[float, str | dict[str, Any]]]:
        if self.settings["usage"] and (body.get("stream_options") or {}).get("include_usage"):
            yield 0.0, {"object": obj, "choices": [], "usage": self._usage(n_tokens)}
        yield 0.0, "[DONE]"

    def _needle(self, prompt: str) -> list[str] | None:
        """A needle's answer: the word the prompt's needle states, unless the prompt is longer than
        `needle_lost_past` tokens (then a filler word, as a model that lost it)."""
        m = NEEDLE_QUESTION.search(prompt)
        if not m:
            return None
        lost = self.settings["needle_lost_past"]
        stated = re.search(rf"The secret word of the {re.escape(m.group(1))} is (\w+)\.", prompt)
        if stated is None or (lost is not None and prompt_tokens(prompt) > lost):
            return [" the", " river", "."]
        return [" " + stated.group(1), "."]

    def _completion(self, body: dict[str, Any], max_tokens: int, delay: float) -> Reply:
        s = self.settings
        limit = s["max_model_len"]
        if s["context_error"] and limit is not None and prompt_tokens(body["prompt"]) + max_tokens > limit:
            n = prompt_tokens(body["prompt"])
            message = f"This model's maximum context length is {limit} tokens. However, your request has {n} input tokens."
            return json_reply({"object": "error", "message": message, "type": "BadRequestError", "code": 400}, 400)
        if s["prefill_s_per_1k"]:
            time.sleep(s["prefill_s_per_1k"] * prompt_tokens(body["prompt"]) / 1000)
        toks = self._needle(body["prompt"]) or completion_tokens(body["prompt"], max_tokens, s["shift_at"])
        if body.get("stream"):
            return sse_reply(self._completion_events(toks, body, delay), s["framing"])
        choice: dict[str, Any] = {"index": 0, "text": "".join(toks), "finish_reason": "length"}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": toks, "token_logprobs": [s["logprob"]] * len(toks)}
        reply: dict[str, Any] = {"id": "x", "object": "text_completion", "model": MODEL, "choices": [choice]}
        if s["usage"]:
            reply["usage"] = {**self._usage(len(toks)), "prompt_tokens": prompt_tokens(body["prompt"])}
        return json_reply(reply)

    def _completion_events(
        self, toks: list[str], body: dict[str, Any], delay: float
    ) -> Iterator[tuple[float, str | dict[str, Any]]]:
        for i, t in enumerate(toks):
            yield (
                self._delay(i, delay),
                {
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": t, "finish_reason": "length" if i == len(toks) - 1 else None}],
                },
            )
        yield from self._end(len(toks), body, "text_completion")


class ReasonerServer:
    """`with ReasonerServer() as server:` the model on its own test server at `server.base_url`;
    `settings` and `requests` are the model's."""

    def __init__(self, port: int = 0) -> None:
        self.model = Reasoner()
        self.server = TestServer([self.model], port=port)

    @property
    def settings(self) -> dict[str, Any]:
        return self.model.settings

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.model.requests

    @property
    def base_url(self) -> str:
        return self.server.root

    def __enter__(self) -> ReasonerServer:
        self.server.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.stop()


def main(argv: list[str] | None = None) -> None:
    import argparse
    import signal
    import subprocess
    import sys
    import time

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.0, help="seconds before listening")
    p.add_argument("--exit", type=int, default=None, help="die at start-up with this code")
    p.add_argument("--child", default=None, help="fork a worker that ignores SIGTERM; write its pid here")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--ttft", type=float, default=0.0, help="seconds before the first token (settings ttft_s)")
    p.add_argument("--itl", type=float, default=None, help="seconds between tokens (settings delay_s)")
    p.add_argument("--no-reasoning", action="store_true", help="answer without thinking first")
    p.add_argument(
        "--role-at-first-token",
        action="store_true",
        help="send the role chunk when prefill is done, not at once (settings role_at_first_token)",
    )
    args = p.parse_args(argv)
    print("starting", flush=True)
    if args.exit is not None:
        print("fatal: out of memory (pretend)", flush=True)
        sys.exit(args.exit)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child:
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
        )
        with open(args.child, "w") as f:
            f.write(str(child.pid))
    time.sleep(args.delay)
    model = Reasoner()
    model.settings.update(ttft_s=args.ttft, reasoning=not args.no_reasoning, role_at_first_token=args.role_at_first_token)
    if args.itl is not None:
        model.settings["delay_s"] = args.itl
    TestServer([model], port=args.port).serve_forever()


if __name__ == "__main__":
    main()
