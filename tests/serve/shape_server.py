"""A real HTTP server on 127.0.0.1 that answers like a reasoning model.

Not a mock of the client: it speaks HTTP and SSE over a socket, in the exact
shapes vLLM's reasoning parsers produce (`reasoning_content` deltas with
`content: null`, a usage-only final chunk with `choices: []`), so the serve tier
is exercised end to end in milliseconds. Knobs on `ShapeServer.settings` let a
test switch usage reporting off, answer wrongly, shift a golden token, think for
longer than a small max_tokens allows (the answer then never reaches `content`),
or make requests unevenly fast.
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "tiny-reasoner"
THINKING = ["Let", " me", " think", "."]

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


class ShapeServer:
    def __init__(self, port: int = 0) -> None:
        self.settings: dict[str, Any] = {
            "usage": True,  # honour stream_options.include_usage / put usage in replies
            "wrong": False,  # answer the coherence prompts wrongly
            "reasoning": True,  # think (reasoning_content) before answering
            "think_tokens": 0,  # more thinking tokens: a small max_tokens ends before any content
            "reasoning_has_answer": False,  # the thinking states the right answer (even when `wrong`)
            "shift_at": None,  # golden: change the token at this index
            "delay_s": 0.002,  # between streamed chunks, so timings are not all zero
            "version": "0.0.0+shape",
            "fail": False,  # answer every POST with HTTP 500
            "truncate_after": None,  # end chat streams after this many chunks, no finish_reason/[DONE]
            "delay_cycle": None,  # per-chunk delays, one per POST in turn: requests of uneven speed
        }
        self.requests: list[dict[str, Any]] = []
        self.posts = itertools.count()
        handler = type("Handler", (_Handler,), {"owner": self})
        self.httpd = _Server(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> ShapeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Server(ThreadingHTTPServer):
    # Clients close streams right after [DONE], before reading the terminating
    # chunk; the kernel answers with RST. Not an error worth a traceback.
    request_queue_size = 64

    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    owner: ShapeServer
    protocol_version = "HTTP/1.1"
    delay = 0.0  # between streamed chunks, for this request (settings delay_s or delay_cycle)

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif self.path == "/version" and self.owner.settings["version"]:
            self._json(200, {"version": self.owner.settings["version"]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.owner.requests.append(body)
        s = self.owner.settings
        cycle = s["delay_cycle"]
        self.delay = cycle[next(self.owner.posts) % len(cycle)] if cycle else s["delay_s"]
        if s["fail"]:
            self._json(500, {"error": {"message": "engine core died (pretend)"}})
            return
        max_tokens = int(body.get("max_tokens", 16))
        if self.path == "/v1/chat/completions":
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
                self._stream_chat(pieces, body, finish)
            else:
                reasoning = "".join(t for k, t in pieces if k == "reasoning")
                content = "".join(t for k, t in pieces if k == "content")
                msg = {"role": "assistant", "content": content or None, "reasoning_content": reasoning or None}
                reply: dict[str, Any] = {
                    "id": "x", "object": "chat.completion", "model": MODEL,
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                }
                if s["usage"]:
                    n = len(pieces)
                    reply["usage"] = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
                self._json(200, reply)
        elif self.path == "/v1/completions":
            toks = completion_tokens(body["prompt"], max_tokens, s["shift_at"])
            if body.get("stream"):
                self._stream_completion(toks, body)
                return
            choice: dict[str, Any] = {"index": 0, "text": "".join(toks), "finish_reason": "length"}
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": toks, "token_logprobs": [-0.1] * len(toks)}
            reply = {"id": "x", "object": "text_completion", "model": MODEL, "choices": [choice]}
            if s["usage"]:
                reply["usage"] = {"prompt_tokens": 5, "completion_tokens": len(toks), "total_tokens": 5 + len(toks)}
            self._json(200, reply)
        else:
            self._json(404, {"error": "not found"})

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _send(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_sse(self, n_tokens: int, body: dict[str, Any], obj: str) -> None:
        s = self.owner.settings
        if s["usage"] and (body.get("stream_options") or {}).get("include_usage"):
            self._send(json.dumps({"object": obj, "choices": [], "usage": {
                "prompt_tokens": 5, "completion_tokens": n_tokens, "total_tokens": 5 + n_tokens}}))
        self._send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream_chat(self, pieces: list[tuple[str, str]], body: dict[str, Any], finish: str) -> None:
        delay = self.delay
        self._start_sse()
        # vLLM's first chunk: the role, no output yet.
        self._send(json.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}))
        for i, (kind, text) in enumerate(pieces):
            if self.owner.settings["truncate_after"] == i:
                # As llama-cpp-python ends a stream it interrupts: [DONE], never a finish_reason.
                self._send("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            time.sleep(delay)
            delta = {"content": None, "reasoning_content": text} if kind == "reasoning" else {"content": text}
            self._send(json.dumps({"object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": delta, "finish_reason": None}]}))
        self._send(json.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": None}, "finish_reason": finish}]}))
        self._end_sse(len(pieces), body, "chat.completion.chunk")

    def _stream_completion(self, toks: list[str], body: dict[str, Any]) -> None:
        delay = self.delay
        self._start_sse()
        for i, t in enumerate(toks):
            time.sleep(delay)
            self._send(json.dumps({"object": "text_completion", "choices": [
                {"index": 0, "text": t, "finish_reason": "length" if i == len(toks) - 1 else None}]}))
        self._end_sse(len(toks), body, "text_completion")


if __name__ == "__main__":
    # Standalone, for tests of `--start`: python shape_server.py --port PORT
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    server = ShapeServer(parser.parse_args().port)
    server.httpd.serve_forever()
