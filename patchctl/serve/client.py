"""A minimal OpenAI-compatible HTTP client that times what it receives.

`requests` rather than the openai SDK: we need the arrival time of every SSE
chunk and tolerance for non-standard fields (reasoning_content, content: null),
and it is already a patchctl dependency.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import requests

from patchctl.errors import ServerError, TruncatedStream
from patchctl.serve.metrics import RequestRecord
from patchctl.serve.sse import delta_from_object, iter_sse_data, parse_event

CHAT = "chat"
COMPLETIONS = "completions"


class Completion(NamedTuple):
    """A non-streaming reply, with per-token strings when the server gave logprobs."""

    content: str
    reasoning: str
    tokens: tuple[str, ...] | None
    completion_tokens: int | None
    finish_reason: str | None


class OpenAIClient:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self.model = model
        self.timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json"}
        # One session per thread: its connection stays open between requests, so a timed request
        # pays no TCP set-up and no per-call session (environment, netrc) before it is sent.
        self._local = threading.local()
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def connect(self) -> None:
        """Open this thread's connection before it is timed (a GET of /v1/models on its session):
        the first timed request then pays no TCP set-up, as every later one on the connection.
        A failure here is left to the timed request to report."""
        try:
            # Read to the end, so the connection goes back to the session's pool open.
            _ = self._session().get(f"{self.base_url}/v1/models", headers=self._headers, timeout=30).content
        except requests.RequestException:
            pass

    # -- discovery ---------------------------------------------------------------

    def list_models(self) -> list[str]:
        resp = requests.get(f"{self.base_url}/v1/models", headers=self._headers, timeout=30)
        resp.raise_for_status()
        return [m["id"] for m in resp.json().get("data", [])]

    def resolve_model(self) -> str:
        if self.model is None:
            models = self.list_models()
            if not models:
                raise RuntimeError(f"{self.base_url}/v1/models lists no model")
            self.model = models[0]
        return self.model

    def engine_version(self) -> str | None:
        """vLLM and SGLang answer GET /version; others (llama.cpp) do not."""
        try:
            resp = requests.get(f"{self.base_url}/version", headers=self._headers, timeout=10)
            if resp.status_code == 200:
                version = resp.json().get("version")
                return str(version) if version else None
        except (requests.RequestException, ValueError):
            pass
        return None

    # -- requests ----------------------------------------------------------------

    def _body(
        self, api: str, prompt: str, max_tokens: int, temperature: float, extra: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.resolve_model(),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": 0,
        }
        if api == CHAT:
            body["messages"] = [{"role": "user", "content": prompt}]
        elif api == COMPLETIONS:
            body["prompt"] = prompt
        else:
            raise ValueError(f"unknown api {api!r}")
        body.update(extra or {})
        return body

    def _url(self, api: str) -> str:
        return f"{self.base_url}/v1/chat/completions" if api == CHAT else f"{self.base_url}/v1/completions"

    def complete(
        self,
        api: str,
        prompt: str,
        max_tokens: int,
        temperature: float = 0.0,
        logprobs: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> Completion:
        body = self._body(api, prompt, max_tokens, temperature, extra)
        if logprobs:
            if api == CHAT:
                body.update({"logprobs": True, "top_logprobs": 1})
            else:
                body["logprobs"] = 1
        resp = requests.post(self._url(api), json=body, headers=self._headers, timeout=self.timeout_s)
        if resp.status_code >= 400:
            raise requests.HTTPError(f"{resp.status_code} from {self._url(api)}: {resp.text[:300]}", response=resp)
        obj = resp.json()
        delta = delta_from_object(obj)
        return Completion(delta.content, delta.reasoning, _tokens_of(obj), delta.completion_tokens, delta.finish_reason)

    def timed_request(
        self,
        api: str,
        prompt: str,
        max_tokens: int,
        stream: bool = True,
        temperature: float = 0.0,
        extra: Mapping[str, Any] | None = None,
    ) -> RequestRecord:
        """Send one request and record when each piece of output arrived.

        Failures become a record with ok=False rather than an exception: under
        load, one failed request is a result to report, not a reason to stop.
        """
        body = self._body(api, prompt, max_tokens, temperature, extra)
        if stream:
            body["stream"] = True
            # Servers that know it put exact token counts in a final chunk.
            body.setdefault("stream_options", {"include_usage": True})
        start = time.perf_counter()
        chunk_times: list[float] = []
        content: list[str] = []
        reasoning: list[str] = []
        usage: int | None = None
        finish: str | None = None
        reasoning_chunks = content_chunks = 0
        last_kind = ""
        reads: set[int] = set()
        try:
            with self._session().post(
                self._url(api), json=body, headers=self._headers, timeout=self.timeout_s, stream=stream
            ) as resp:
                if resp.status_code >= 400:
                    raise requests.HTTPError(f"HTTP {resp.status_code}: {resp.text[:200]}")
                if stream:
                    arrivals = Arrivals(resp)
                    for payload in iter_sse_data(arrivals):
                        now = time.perf_counter()
                        delta = parse_event(payload)
                        if delta is None:
                            break
                        if delta.has_output:
                            chunk_times.append(now)
                            reads.add(arrivals.count)
                            content.append(delta.content)
                            reasoning.append(delta.reasoning)
                            reasoning_chunks += bool(delta.reasoning)
                            content_chunks += bool(delta.content)
                            last_kind = "content" if delta.content else "reasoning"
                        if delta.completion_tokens is not None:
                            usage = delta.completion_tokens
                        finish = delta.finish_reason or finish
                    if finish is None:
                        # Every complete OpenAI stream carries a finish_reason. A
                        # dropped one may still send [DONE]: llama-cpp-python,
                        # interrupting a stream for a newer request, sends the role
                        # chunk, [DONE], and nothing else. Counting that as a
                        # request would report short, fast "successes".
                        raise TruncatedStream(f"stream ended without a finish_reason after {len(chunk_times)} chunks")
                else:
                    delta = delta_from_object(resp.json())
                    content.append(delta.content)
                    reasoning.append(delta.reasoning)
                    usage = delta.completion_tokens
                    finish = delta.finish_reason
                    last_kind = "content" if delta.content else ("reasoning" if delta.reasoning else "")
            error = None
        except (requests.RequestException, ServerError, TruncatedStream, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        end = time.perf_counter()
        return RequestRecord(
            ok=error is None,
            error=error,
            streamed=stream,
            start=start,
            end=end,
            chunk_times=tuple(chunk_times),
            usage_tokens=usage,
            content="".join(content),
            reasoning="".join(reasoning),
            finish_reason=finish,
            reasoning_chunks=reasoning_chunks,
            content_chunks=content_chunks,
            reads=len(reads),
            # max_tokens ran out while the model was still thinking: no answer was reached.
            ended_in_reasoning=finish == "length" and last_kind == "reasoning",
        )


class Arrivals:
    """The bytes of a streamed body, handed over as they arrive; `count` is how many reads so far.

    A chunked body comes one HTTP chunk at a time (urllib3 decodes the framing). A body without
    chunks (close-delimited, or with a Content-Length) must not be read with a size: a sized read
    waits until that many bytes came, and iter_content(None) on such a body reads it to the end, so
    every token would seem to arrive at once. read1 returns whatever one read from the socket gave.
    """

    READ = 65536

    def __init__(self, resp: requests.Response) -> None:
        self.resp = resp
        self.count = 0

    def __iter__(self) -> Iterator[bytes]:
        raw = self.resp.raw
        read1 = getattr(raw, "read1", None)  # urllib3 >= 2
        if getattr(raw, "chunked", False) or read1 is None:
            pieces: Iterable[bytes] = self.resp.iter_content(chunk_size=None)
        else:
            pieces = iter(lambda: read1(self.READ, decode_content=True), b"")
        for piece in pieces:
            if piece:
                self.count += 1
                yield piece


def _tokens_of(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Per-token strings from a logprobs block, chat or completions shape."""
    choices = obj.get("choices") or []
    if not choices:
        return None
    lp = choices[0].get("logprobs")
    if not lp:
        return None
    if isinstance(lp.get("content"), list):  # chat shape
        return tuple(str(item.get("token", "")) for item in lp["content"])
    if isinstance(lp.get("tokens"), list):  # completions shape
        return tuple(str(t) for t in lp["tokens"])
    return None
