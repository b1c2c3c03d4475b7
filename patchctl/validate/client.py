"""A minimal OpenAI-compatible HTTP client that times what it receives.

patchctl's one HTTP client (sources/http.py) rather than the openai SDK: we need the arrival time of
every SSE chunk and tolerance for non-standard fields (reasoning_content, content: null).

Nothing a server sends may cost more than it should (docs/validate.md): every
request has one deadline, connect to last byte (`--timeout`; a level's own deadline may cut it
shorter), that a server dripping bytes or keep-alive comments cannot extend: the watchdog of
sources/deadline.py shuts the socket down at it. Every reply has a cap in bytes (reply_cap: it grows
with max_tokens), every SSE line one (sse.LINE_MAX_BYTES); what is past a cap, or not of OpenAI's
shape, is a BadServerReply: the request fails naming it, and the client keeps the sentence
(`bad_replies`) for the report.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from patchctl.core.errors import (
    BadServerReply,
    HTTPError,
    NetworkError,
    RequestDeadline,
    RequestFailed,
    ServerError,
    TruncatedStream,
    plain_network_reason,
)
from patchctl.sources import http
from patchctl.sources.deadline import Deadline
from patchctl.validate.metrics import RequestRecord
from patchctl.validate.reading import SMALL_REPLY_BYTES, Reading, error_text, read_capped, reply_cap, sane_usage
from patchctl.validate.sse import delta_from_object, excerpt, load_json

CHAT = "chat"
COMPLETIONS = "completions"

DEFAULT_TIMEOUT_S = 300.0  # one request's deadline (--timeout): 128 tokens at 1 tok/s, and a queue
BAD_REPLIES_KEPT = 20  # sentences kept for the report; the rest are counted
PROBE_TIMEOUT_S = 30.0  # /v1/models and /version, at most (and never more than --timeout)
# Idle connections kept open to the server: every worker thread's connection stays open between its
# requests, so a timed request pays no TCP set-up (a level runs --concurrency requests at once).
CONNECTIONS_KEPT = 4096


class Completion(NamedTuple):
    """A non-streaming reply, with per-token strings when the server gave logprobs."""

    content: str
    reasoning: str
    tokens: tuple[str, ...] | None
    completion_tokens: int | None
    finish_reason: str | None
    # The top-1 logprob of each token (numerics.py compares them) and usage.prompt_tokens (haystack.py
    # sizes documents by them): None where the server gave none.
    logprobs: tuple[float, ...] | None = None
    prompt_tokens: int | None = None


class OpenAIClient:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]
        self.model = model
        self.timeout_s = timeout_s
        # identity: a compressed reply could not be capped as it is read (BadServerReply if sent anyway)
        self.headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        self._lock = threading.Lock()
        self.answered = 0  # requests the server answered (a status line came)
        self.unanswered = 0  # requests that ended with no answer (refused, reset, the deadline passed)
        self.last_unanswered = ""  # why the last of them got none
        self.bad_replies: list[str] = []  # "LABEL: why", one per request whose reply broke the protocol or a cap
        self.bad_reply_count = 0
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    # -- bounded exchanges ---------------------------------------------------------

    def count_answer(self, answered: bool, why: str = "") -> None:
        """One request answered (a status line came) or not (why): never_answered() reads these."""
        with self._lock:
            if answered:
                self.answered += 1
            else:
                self.unanswered += 1
                self.last_unanswered = why

    def note_bad_reply(self, label: str, exc: BadServerReply) -> str:
        """Keep "LABEL: why" for the report (the first BAD_REPLIES_KEPT; bad_reply_count counts all)."""
        text = f"{label}: {exc}"[:300]
        with self._lock:
            self.bad_reply_count += 1
            if len(self.bad_replies) < BAD_REPLIES_KEPT:
                self.bad_replies.append(text)
        return text

    def never_answered(self) -> bool:
        """Requests were made and none of them got an answer: the server never answers at all."""
        return self.answered == 0 and self.unanswered > 0

    def require_answer(self) -> None:
        """NetworkError (exit 3) when the server never answered any request so far."""
        if self.never_answered():
            raise NetworkError(
                f"no answer from {self.base_url}: {self.unanswered} request(s) sent, none answered (the last: "
                f"{self.last_unanswered})",
                hint="is the server up and serving on that port? pass a larger --timeout SECONDS for a slow one",
            )

    def _exchange(
        self, method: str, url: str, seconds: float, consume: Any, body: Any = None, why: str | None = None, sending: Any = None
    ) -> Any:
        """One request under one deadline of `seconds`, connect to last byte: consume(response) reads
        it (the response still open, its body not read). RequestDeadline when the deadline passed,
        BadServerReply for a compressed reply; a status of 400 or more is consume's to judge. sending()
        is called once the watchdog runs, right before the request goes out (a timed request's start)."""
        why = why or f"--timeout {self.timeout_s:g} s"
        answered = False
        deadline = Deadline(url, "", seconds)
        data = None if body is None else json.dumps(body).encode()
        try:
            if sending is not None:
                sending()
            # No retries: a timed request is sent once (a kept-alive connection the server had closed
            # is the one exception: the request had not reached it).
            with http.send(method, url, deadline, body=data, headers=self.headers, retries=0, keep=CONNECTIONS_KEPT) as resp:
                answered = True
                self.count_answer(True)
                resp.max_bytes = http.MAX_SIZE  # the reply's caps are reading.py's (BadServerReply)
                encoding = (resp.headers.get("Content-Encoding") or "").strip().lower()
                if encoding not in ("", "identity"):
                    raise BadServerReply(
                        f"the reply is compressed (Content-Encoding {encoding[:40]}) though "
                        "identity was asked: its size could not be capped as it is read"
                    )
                result = consume(resp)
        except Exception as exc:
            # a read that waited out the time left is the deadline too, as is the watchdog's shutdown
            expired = deadline.expired or isinstance(exc, NetworkError) and deadline.remaining() <= 0
            error = (
                self._deadline(url, seconds, why, answered)
                if expired
                else RequestFailed(exc.message)
                if isinstance(exc, NetworkError)
                else exc
            )
            if not answered:
                self.count_answer(False, str(error) if expired else plain_network_reason(str(exc)))
            raise error from None
        if deadline.expired:  # the watchdog cut it short: what was read is not the whole reply
            raise self._deadline(url, seconds, why, answered)
        return result

    @staticmethod
    def _deadline(url: str, seconds: float, why: str, answered: bool) -> RequestDeadline:
        what = "the reply was not complete" if answered else "no answer"
        return RequestDeadline(f"{what} within {seconds:.3g} s ({why}) from {url}", answered)

    def _get_small(self, path: str) -> tuple[int, bytes]:
        url = f"{self.base_url}{path}"

        def consume(resp: http.Response) -> tuple[int, bytes]:
            return resp.status_code, read_capped(resp, SMALL_REPLY_BYTES)

        result: tuple[int, bytes] = self._exchange("GET", url, min(PROBE_TIMEOUT_S, self.timeout_s), consume)
        return result

    def connect(self) -> None:
        """Open this thread's connection before it is timed (a GET of /v1/models on its session):
        the first timed request then pays no TCP set-up, as every later one on the connection.
        A failure here is left to the timed request to report."""
        try:
            # Read to the end, so the connection goes back to the session's pool open.
            self._get_small("/v1/models")
        except (RequestFailed, BadServerReply):
            pass

    # -- discovery ---------------------------------------------------------------

    def list_models(self) -> list[str]:
        status, data = self._get_small("/v1/models")
        if status >= 400:
            raise HTTPError(f"HTTP {status} from {self.base_url}/v1/models: {excerpt(data)}")
        obj = load_json(data)
        models = obj.get("data") if isinstance(obj, dict) else None
        if not isinstance(models, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in models):
            raise BadServerReply(f"/v1/models is not OpenAI's list of models: {excerpt(data)}")
        return [m["id"] for m in models]

    def resolve_model(self) -> str:
        if self.model is None:
            models = self.list_models()
            if not models:
                raise RuntimeError(f"{self.base_url}/v1/models lists no model")
            self.model = models[0]
        return self.model

    def engine_version(self) -> str | None:
        """Where each engine states its version: vLLM answers GET /version; SGLang's HTTP server
        (python/sglang/srt/entrypoints/http_server.py, read at 0025436) has no /version route, and
        GET /get_server_info carries `version` (sglang.__version__) beside its server args; llama.cpp
        states neither (None). NetworkError when this is the first request and the server does not
        answer it (require_answer)."""
        try:
            status, data = self._get_small("/version")
            obj = load_json(data) if status == 200 else None
            version = obj.get("version") if isinstance(obj, dict) else None
            if isinstance(version, (str, int, float)) and version != "":
                return str(version)[:200]
        except (RequestFailed, BadServerReply):
            self.require_answer()
            return None
        try:
            status, info = self.side_request("GET", "/get_server_info")
        except (RequestFailed, BadServerReply):
            return None
        version = info.get("version") if status == 200 and isinstance(info, dict) else None
        return version[:200] if isinstance(version, str) and version else None

    # -- requests ----------------------------------------------------------------

    def request_body(
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

    def url(self, api: str) -> str:
        return f"{self.base_url}/v1/chat/completions" if api == CHAT else f"{self.base_url}/v1/completions"

    def complete(
        self,
        api: str,
        prompt: str,
        max_tokens: int,
        temperature: float = 0.0,
        logprobs: bool = False,
        extra: Mapping[str, Any] | None = None,
        label: str = "request",
    ) -> Completion:
        """One non-streaming request. NetworkError when the server has never answered (this request
        included); a BadServerReply is noted (bad_replies) and raised."""
        body = self.request_body(api, prompt, max_tokens, temperature, extra)
        if logprobs:
            if api == CHAT:
                body.update({"logprobs": True, "top_logprobs": 1})
            else:
                body["logprobs"] = 1
        url = self.url(api)

        def consume(resp: http.Response) -> Any:
            if resp.status_code >= 400:
                raise HTTPError(f"{resp.status_code} from {url}: {error_text(resp)}")
            return load_json(read_capped(resp, reply_cap(max_tokens)))

        try:
            obj = self._exchange("POST", url, self.timeout_s, consume, body)
            delta = delta_from_object(obj)
            tokens = _tokens_of(obj)
            values = _logprobs_of(obj, tokens)
        except BadServerReply as exc:
            raise BadServerReply(self.note_bad_reply(label, exc)) from None
        except RequestFailed:
            self.require_answer()
            raise
        usage = sane_usage(delta, max_tokens)[0]
        return Completion(delta.content, delta.reasoning, tokens, usage, delta.finish_reason, values, _prompt_tokens(obj))

    def side_request(self, method: str, path: str, body: Any = None, cap: int = SMALL_REPLY_BYTES) -> tuple[int, Any]:
        """One exchange with an endpoint beside OpenAI's (/props, /tokenize): (status, its JSON, None
        when the body is not JSON), under the probes' deadline and a cap of `cap` bytes."""
        url = f"{self.base_url}{path}"

        def consume(resp: http.Response) -> tuple[int, Any]:
            data = read_capped(resp, cap) if resp.status_code < 400 else error_text(resp).encode()
            try:
                return resp.status_code, json.loads(data)
            except ValueError:
                return resp.status_code, None

        result: tuple[int, Any] = self._exchange(method, url, min(PROBE_TIMEOUT_S, self.timeout_s), consume, body)
        return result

    def timed_request(
        self,
        api: str,
        prompt: str,
        max_tokens: int,
        stream: bool = True,
        temperature: float = 0.0,
        extra: Mapping[str, Any] | None = None,
        *,
        label: str = "request",
        seconds: float | None = None,
        why: str | None = None,
    ) -> RequestRecord:
        """Send one request and record when each piece of output arrived.

        Failures become a record with ok=False rather than an exception: under load, one failed
        request is a result to report, not a reason to stop. `seconds`: its deadline (default
        --timeout), `why` the words that name it in the error; `label` names the request in a
        BadServerReply's sentence ("c=8 request 5: event 3: ...").
        """
        body = self.request_body(api, prompt, max_tokens, temperature, extra)
        if stream:
            body["stream"] = True
            # Servers that know it put exact token counts in a final chunk.
            body.setdefault("stream_options", {"include_usage": True})
        got = Reading(max_tokens)
        started = [time.perf_counter()]

        def sending() -> None:  # the watchdog's start-up is not the server's time
            started[0] = time.perf_counter()

        try:
            self._exchange(
                "POST",
                self.url(api),
                self.timeout_s if seconds is None else seconds,
                lambda resp: got.read(resp, stream),
                body,
                why,
                sending,
            )
            error = None
        except BadServerReply as exc:
            self.note_bad_reply(label, exc)
            error = f"BadServerReply: {exc}"[:300]  # without the label: a level's errors are its distinct ones
        except (RequestFailed, ServerError, TruncatedStream, ValueError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        return got.record(ok=error is None, error=error, streamed=stream, start=started[0], end=time.perf_counter())


def _prompt_tokens(obj: Mapping[str, Any]) -> int | None:
    usage = obj.get("usage")
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return n if type(n) is int and n >= 0 else None


def _logprobs_of(obj: Mapping[str, Any], tokens: tuple[str, ...] | None) -> tuple[float, ...] | None:
    """Each token's logprob, one per token of _tokens_of (chat: content[i].logprob, completions:
    token_logprobs); None when the server gave none, or not one number per token."""
    if tokens is None:
        return None
    lp = obj["choices"][0].get("logprobs") or {}
    values = [item.get("logprob") for item in lp["content"]] if isinstance(lp.get("content"), list) else lp.get("token_logprobs")
    if not isinstance(values, list) or len(values) != len(tokens):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None  # a null (a token the server could not score) makes the whole run's numerics unknown
    return tuple(float(v) for v in values)


def _tokens_of(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Per-token strings from a logprobs block, chat or completions shape (obj passed
    delta_from_object: its choices are a list of objects); BadServerReply for another shape."""
    choices = obj.get("choices") or []
    if not choices:
        return None
    lp = choices[0].get("logprobs")
    if not lp:
        return None
    if not isinstance(lp, dict):
        raise BadServerReply(f"choices[0].logprobs is {type(lp).__name__}, not an object")
    if isinstance(lp.get("content"), list):  # chat shape
        if not all(isinstance(item, dict) for item in lp["content"]):
            raise BadServerReply("choices[0].logprobs.content holds an entry that is not an object")
        return tuple(str(item.get("token", ""))[:1000] for item in lp["content"])
    if isinstance(lp.get("tokens"), list):  # completions shape
        return tuple(str(t)[:1000] for t in lp["tokens"])
    return None
