"""`patchctl validate --demo`: a tiny OpenAI-compatible server, in-process, to try validate without a GPU.

It answers as a small reasoning model served by vLLM or SGLang would, so every part of validate runs
for real over a socket: `/v1/models`, `/version`, chat and text completions, streamed as SSE (chunked,
`reasoning_content` deltas before the answer, a usage-only final chunk when `stream_options` asks
for it) or whole. Its answers are deterministic and right: Paris, 391, 1 to 50 one per line, a
Python `add`, the word a long-context needle states; anything else gets a fixed run of tokens. Only
the standard library: it ships in the package, and `--demo` must work on a machine with nothing else installed.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

MODEL = "patchctl-demo"
VERSION = "0.0.0+demo"
THINKING = ["Let", " me", " think", "."]
PROMPT_TOKENS = 5
TOKEN_DELAY_S = 0.001  # between streamed tokens: timings are not all zero, and a run stays short
MAX_BODY = 1 << 20  # a request body larger than this is refused (the demo listens on loopback only)

# A substring of validate's answers prompts → the reply, token by token.
ANSWERS = {
    "capital of France": ["Paris", "."],
    "17 * 23": ["391"],
    "Count from 1 to 50": [f"{i}\n" for i in range(1, 51)],
    "add(a, b)": ["```python\n", "def add(a, b):\n", "    return a + b\n", "```"],
}


MAX_MODEL_LEN = 8192  # said in /v1/models, as vLLM says it: validate's long-context needles stay inside it
_NEEDLE = re.compile(r"The secret word of the (.+?) is$")


def _needle(prompt: str) -> list[str] | None:
    """A long-context needle's answer: the word its prompt states, as a right model reads it."""
    asked = _NEEDLE.search(prompt)
    stated = asked and re.search(rf"The secret word of the {re.escape(asked.group(1))} is (\w+)\.", prompt)
    return [" " + stated.group(1), "."] if stated else None


def _answer(prompt: str, max_tokens: int) -> list[str]:
    found = next((v for k, v in ANSWERS.items() if k in prompt), None)
    return found if found is not None else [f" tok{i % 50}" for i in range(max_tokens)]


def _usage(n: int) -> dict[str, int]:
    return {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n, "total_tokens": PROMPT_TOKENS + n}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked streams, as the engines' servers speak

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass  # validate's own progress is the output; a line per request would bury it

    # --- plumbing ----------------------------------------------------------------------------

    def _send_json(self, doc: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_events(self, events: Iterator[dict[str, Any] | str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            text = event if isinstance(event, str) else json.dumps(event)
            data = f"data: {text}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _body(self) -> dict[str, Any] | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._send_json({"error": {"message": "bad Content-Length"}}, 400)
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._send_json({"error": {"message": "the body is not a JSON object"}}, 400)
            return None
        return body

    # --- the API -----------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/v1/models":
            self._send_json(
                {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "owned_by": "patchctl", "max_model_len": MAX_MODEL_LEN}],
                }
            )
        elif self.path == "/version":
            self._send_json({"version": VERSION})
        elif self.path == "/health":
            self._send_json({})
        else:
            self._send_json({"error": {"message": f"no route {self.path}"}}, 404)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self._body()
        if body is None:
            return
        # OpenAI's newer name first, as vLLM and SGLang accept both.
        try:
            max_tokens = max(1, int(body.get("max_completion_tokens") or body.get("max_tokens") or 16))
        except (TypeError, ValueError):
            self._send_json({"error": {"message": "max_tokens is not a number"}}, 400)
            return
        if self.path == "/v1/chat/completions":
            messages = body.get("messages") or [{}]
            prompt = str((messages[-1] or {}).get("content") or "")
            self._chat(body, prompt, max_tokens)
        elif self.path == "/v1/completions":
            self._completion(body, str(body.get("prompt") or ""), max_tokens)
        else:
            self._send_json({"error": {"message": f"no route {self.path}"}}, 404)

    def _chat(self, body: dict[str, Any], prompt: str, max_tokens: int) -> None:
        # A reasoning model: it thinks (reasoning_content) first, then answers (content).
        pieces = [("reasoning", t) for t in THINKING] + [("content", t) for t in _answer(prompt, max_tokens)]
        finish = "length" if len(pieces) > max_tokens else "stop"
        pieces = pieces[:max_tokens]
        if not body.get("stream"):
            message = {
                "role": "assistant",
                "content": "".join(t for k, t in pieces if k == "content") or None,
                "reasoning_content": "".join(t for k, t in pieces if k == "reasoning") or None,
            }
            self._send_json(
                {
                    "id": "demo",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": _usage(len(pieces)),
                }
            )
            return

        def events() -> Iterator[dict[str, Any] | str]:
            chunk = {"id": "demo", "object": "chat.completion.chunk", "model": MODEL}
            yield {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            for kind, text in pieces:
                time.sleep(TOKEN_DELAY_S)
                delta = {"content": None, "reasoning_content": text} if kind == "reasoning" else {"content": text}
                yield {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            yield {**chunk, "choices": [{"index": 0, "delta": {"content": None}, "finish_reason": finish}]}
            if (body.get("stream_options") or {}).get("include_usage"):
                yield {**chunk, "choices": [], "usage": _usage(len(pieces))}
            yield "[DONE]"

        self._send_events(events())

    def _completion(self, body: dict[str, Any], prompt: str, max_tokens: int) -> None:
        # Greedy and deterministic: the same prompt always gets the same tokens (what --golden compares).
        toks = _needle(prompt) or [f" w{(len(prompt) * 7 + i * 3) % 50}" for i in range(max_tokens)]
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "text": "".join(toks), "finish_reason": "length"}
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": toks, "token_logprobs": [-0.1] * len(toks)}
            self._send_json(
                {"id": "demo", "object": "text_completion", "model": MODEL, "choices": [choice], "usage": _usage(len(toks))}
            )
            return

        def events() -> Iterator[dict[str, Any] | str]:
            for i, t in enumerate(toks):
                time.sleep(TOKEN_DELAY_S)
                yield {
                    "id": "demo",
                    "object": "text_completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "text": t, "finish_reason": "length" if i == len(toks) - 1 else None}],
                }
            if (body.get("stream_options") or {}).get("include_usage"):
                yield {"id": "demo", "object": "text_completion", "model": MODEL, "choices": [], "usage": _usage(len(toks))}
            yield "[DONE]"

        self._send_events(events())


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stream cut off by the end of the run does not hold the exit
    request_queue_size = 256  # validate opens 32 connections at once; socketserver's 5 resets some

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that closes its kept-alive connection is the normal end of a run, not worth a
        # traceback on the user's terminal; anything else is the demo's bug, shown as one line.
        import sys

        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            print(f"patchctl demo server: {type(exc).__name__}: {exc}", file=sys.stderr)


class DemoServer:
    """`with DemoServer() as server:` listening on 127.0.0.1 (a free port) at `server.base_url`."""

    def __init__(self, port: int = 0) -> None:
        self._httpd = _Server(("127.0.0.1", port), _Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="patchctl-demo-server", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> DemoServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
