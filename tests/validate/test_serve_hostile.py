"""`patchctl validate` against hostile servers on 127.0.0.1: usage figures that make no sense, malformed
events, a stream that never ends, keep-alive comments only, a server that never answers, a line with no
newline, a reply past its cap. Each case asserts the exit code, the message, the wall time against the
deadline (+ a margin for a loaded 2-core machine) and, where validate runs in a fresh interpreter, its
peak memory. Before these limits: -6016.9 tok/s "OK", exit 4 tracebacks, runs past 100 s, 1.27 GB.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.hostile_openai import (
    BadEvent,
    BadUsage,
    content_event,
    endless,
    no_newline,
    probe,
    raw_posts,
    silent,
)
from support.invoke import run_json
from support.reasoner import MODEL, Reasoner

from checklib.testserver import TestServer
from patchctl.core.errors import BadServerReply
from patchctl.validate.golden import GoldenEntry, GoldenRecord
from patchctl.validate.sse import LINE_MAX_BYTES, delta_from_object, iter_sse_data, parse_event, usage_problem

RSS_LIMIT_MB = 200
MARGIN_S = 8.0  # the interpreter's start-up and a loaded machine, over the deadlines a case adds up
T = 1.0  # --timeout of the deadline cases
QUICK = ["--no-answers", "--long-context", "off", "--concurrency", "1", "--requests", "2", "--max-tokens", "16"]


def validate_args(url: str, tmp_path, *extra: str) -> list[str]:
    return ["validate", "vllm", "--url", url, "--baseline-dir", str(tmp_path / "b"), *extra]


def in_process(server: TestServer, tmp_path, *extra: str, expect: int) -> dict:
    return run_json(*validate_args(server.root, tmp_path, *extra), expect=expect)


def in_fresh_interpreter(url: str, tmp_path, *extra: str, wait: float) -> dict:
    result = probe([*validate_args(url, tmp_path, *extra), "--json"], wait)
    assert result["outcome"] == "done", {k: v for k, v in result.items() if k != "doc"}
    assert result["rss_mb"] < RSS_LIMIT_MB, result["rss_mb"]
    return result


# --- 1. usage figures that make no sense: a warning, and the tokens counted from chunks -----------

BAD_USAGE = [-1000, -1, 10**12, 17, 12.7, 0.5, float("nan"), "12", True]  # 17 > --max-tokens 16


@pytest.mark.parametrize("value", BAD_USAGE, ids=[repr(v) for v in BAD_USAGE])
def test_usage_that_makes_no_sense_is_a_warning_and_not_used(value, tmp_path):
    with TestServer([BadUsage(value)]) as server:
        doc = in_process(server, tmp_path, *QUICK, expect=0)
    level = doc["report"]["throughput"]["levels"][0]
    assert level["token_count_method"] == "chunks"
    assert level["usage_rejected"] == 2
    assert level["output_tok_s"] > 0 and 0 < level["output_tokens"] <= 2 * 16
    warning = next(w for w in doc["warnings"] if "usage made no sense" in w)
    assert f"usage.completion_tokens {json.dumps(value)}" in warning, warning


def test_usage_within_max_tokens_is_used(tmp_path):
    with TestServer([BadUsage(16)]) as server:
        doc = in_process(server, tmp_path, *QUICK, expect=0)
    level = doc["report"]["throughput"]["levels"][0]
    assert level["token_count_method"] == "usage" and level["output_tokens"] == 32 and level["usage_rejected"] == 0


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=129, max_value=10**30),
        st.floats(allow_nan=True),
        st.text(max_size=5),
        st.booleans(),
        st.lists(st.integers(), max_size=2),
    )
)
def test_no_nonsense_usage_is_taken(value):
    """Generated: every completion_tokens outside 0..max_tokens, or not a JSON integer, is refused."""
    delta = delta_from_object({"choices": [], "usage": {"completion_tokens": value}})
    taken = delta.completion_tokens
    assert taken is None or usage_problem(taken, 128) is not None


# --- 2. malformed events: a named error (which request, which event, why), exit 3 ------------------

MALFORMED = [
    ("5", "a JSON int, not an object"),
    ('"x"', "a JSON str, not an object"),
    ("[1, 2]", "a JSON list, not an object"),
    ("null", "a JSON null, not an object"),
    ('{"choices": "x"}', "`choices` is str, not a list"),
    ('{"choices": [5]}', "choices[0] is int, not an object"),
    ('{"choices": [{"delta": "str"}]}', "choices[0].delta is str, not an object"),
    ('{"choices": [{"delta": {"content": 5}}]}', "choices[0].delta.content is int"),
    ('{"choices": [{"delta": {"reasoning_content": []}}]}', "choices[0].delta.reasoning_content is list"),
    ('{"choices": [{"delta": {}, "finish_reason": 7}]}', "choices[0].finish_reason is int"),
    ('{"choices": [{"text": {}}]}', "choices[0].text is dict"),
    ('{"choices": [], "usage": 5}', "`usage` is int, not an object"),
    ("{not json", "not JSON"),
    ("[" * 100_000, "not JSON"),
]


@pytest.mark.parametrize("payload,why", MALFORMED, ids=[m[0][:30] for m in MALFORMED])
def test_a_malformed_event_is_named_and_exit_3(payload, why, tmp_path):
    with TestServer([BadEvent(payload, at=2)]) as server:
        doc = in_process(server, tmp_path, *QUICK, expect=3)
    bad = doc["report"]["bad_replies"]
    # The warm-up request meets it first, then each of the level's: each named with the event.
    assert bad[0].startswith("warm-up 1: event 3: ") and why in bad[0], bad
    assert any(b.startswith("c=1 request 2: event 3: ") for b in bad), bad
    assert doc["report"]["bad_reply_count"] == 3
    assert any("broke the protocol" in f and why in f for f in doc["report"]["failures"])


@pytest.mark.parametrize("payload,why", MALFORMED[:7], ids=[m[0][:30] for m in MALFORMED[:7]])
def test_a_malformed_whole_reply_is_named_and_exit_3(payload, why, tmp_path):
    with TestServer([BadEvent(payload, whole=True)]) as server:
        doc = in_process(server, tmp_path, "--no-throughput", expect=3)
    bad = doc["report"]["bad_replies"]
    assert [b.split(":")[0] for b in bad] == ["answers/fact", "answers/arithmetic", "answers/counting", "answers/code"]
    assert why in bad[0]


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "choices",
                        "delta",
                        "message",
                        "content",
                        "text",
                        "reasoning_content",
                        "reasoning",
                        "finish_reason",
                        "usage",
                        "completion_tokens",
                        "error",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_any_json_event_is_a_delta_or_a_named_refusal(obj):
    """Generated: whatever JSON a server sends as an event, parsing gives a Delta or a BadServerReply
    (or the ServerError of an error object), never another exception (exit 4 before)."""
    from patchctl.core.errors import ServerError

    try:
        delta = parse_event(json.dumps(obj))
    except (BadServerReply, ServerError):
        return
    assert delta is not None and isinstance(delta.content, str) and isinstance(delta.reasoning, str)


# --- 3. deadlines: an endless stream, keep-alives only, a server that never answers ---------------

FAST = ["--model", MODEL, "--engine-version", "1", *QUICK, "--timeout", str(T)]


def _serve(*responders):
    return TestServer([*responders, Reasoner()])


ENDLESS = [
    ("chunked content", True, content_event("x"), 0.02),
    ("close-delimited content", False, content_event("x"), 0.02),
    ("a finish_reason in every event", True, content_event("x", "length"), 0.05),
    ("reasoning only", True, b'data: {"choices": [{"delta": {"reasoning_content": "hm"}}]}\n\n', 0.03),
    ("one byte at a time", True, b"d", 0.01),
    ("role chunks", False, b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n', 0.05),
]


@pytest.mark.parametrize("name,chunked,data,every", ENDLESS, ids=[e[0] for e in ENDLESS])
def test_an_endless_stream_fails_at_the_deadline(name, chunked, data, every, tmp_path):
    with _serve(raw_posts(lambda: endless(data, every, chunked=chunked), chunked=chunked)) as server:
        # the warm-up's deadline, then the level's two requests one after the other
        r = in_fresh_interpreter(server.root, tmp_path, *FAST, wait=3 * T + 30)
    assert r["exit"] == 1, r["stderr"]
    assert r["seconds"] < 3 * T + MARGIN_S, r["seconds"]
    failure = next(f for f in r["doc"]["report"]["failures"] if f.startswith("throughput c=1"))
    assert "2/2 requests failed" in failure and f"not complete within {T:g} s (--timeout {T:g} s)" in failure


def test_a_level_ends_at_its_own_deadline(tmp_path):
    with _serve(raw_posts(lambda: endless(content_event("x"), 0.02, chunked=True))) as server:
        r = in_fresh_interpreter(server.root, tmp_path, *FAST, "--requests", "6", "--level-timeout", "1.5", wait=T + 1.5 + 30)
    assert r["exit"] == 1 and r["seconds"] < T + 1.5 + MARGIN_S, r
    level = r["doc"]["report"]["throughput"]["levels"][0]
    assert level["failed"] == 6
    assert any("(the deadline of level c=1, 1.5 s (--level-timeout))" in e for e in level["errors"]), level["errors"]
    assert any(e.startswith("not sent: the deadline of level c=1, 1.5 s") for e in level["errors"]), level["errors"]


KEEPALIVES = [b": ping\n\n", b":\n", b"\n", b"event: ping\n\n", b"retry: 100\n", b": keep-alive\r\n\r\n"]


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "close"])
@pytest.mark.parametrize("comment", KEEPALIVES, ids=[repr(k) for k in KEEPALIVES])
def test_keep_alives_alone_fail_at_the_deadline(comment, chunked, tmp_path):
    with _serve(raw_posts(lambda: endless(comment, 0.05, chunked=chunked), chunked=chunked)) as server:
        r = in_fresh_interpreter(server.root, tmp_path, *FAST, wait=3 * T + 30)
    assert r["exit"] == 1 and r["seconds"] < 3 * T + MARGIN_S, r
    assert f"not complete within {T:g} s" in " ".join(r["doc"]["report"]["failures"])


NEVER = [
    ("silent, model from /v1/models", b"", []),
    ("silent, --model", b"", ["--model", MODEL]),
    ("silent, --model --engine-version", b"", ["--model", MODEL, "--engine-version", "1"]),
    ("silent, throughput only", b"", ["--model", MODEL, "--engine-version", "1", "--no-answers"]),
    ("a status line dripping", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n", ["--model", MODEL]),
    (
        "silent, golden only",
        b"",
        ["--model", MODEL, "--engine-version", "1", "--no-answers", "--no-throughput", "--golden", "GOLDEN"],
    ),
]


@pytest.mark.parametrize("name,drip,extra", NEVER, ids=[n[0] for n in NEVER])
def test_a_server_that_never_answers_is_exit_3_at_the_first_deadline(name, drip, extra, tmp_path):
    golden = tmp_path / "g.json"
    GoldenRecord(MODEL, "1", "completions", 4, (GoldenEntry("p", "x", None),)).save(golden)
    extra = [str(golden) if a == "GOLDEN" else a for a in extra]
    with TestServer([silent(drip)]) as server:
        r = in_fresh_interpreter(server.root, tmp_path, "--timeout", str(T), *extra, wait=T + 30)
    assert r["exit"] == 3 and r["seconds"] < T + MARGIN_S, r
    error = r["doc"]["error"]
    assert error["kind"] == "network" and server.root in error["message"], error
    assert f"within {T:g} s" in error["message"] or f"--timeout {T:g} s" in error["message"], error


def test_no_server_at_all_is_exit_3(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    doc = run_json(*validate_args(url, tmp_path, "--model", MODEL, "--engine-version", "1"), expect=3)
    assert doc["error"]["kind"] == "network" and "no answer from" in doc["error"]["message"]


# --- 4. caps: a line with no newline, a reply past its cap -----------------------------------------

NO_NEWLINE = [
    ("data line", b"data: ", True),
    ("data line, close-delimited", b"data: ", False),
    ("a comment", b": ", True),
    ("no field", b"", False),
    ("inside a JSON string", b'data: {"choices": [{"delta": {"content": "', True),
    ("after a good event", content_event("x") + b"data: ", True),
]


@pytest.mark.parametrize("name,prefix,chunked", NO_NEWLINE, ids=[n[0] for n in NO_NEWLINE])
def test_a_line_without_newline_is_refused_at_its_cap(name, prefix, chunked, tmp_path):
    with _serve(raw_posts(lambda: no_newline(prefix, chunked=chunked, cap=512 << 20), chunked=chunked)) as server:
        r = in_fresh_interpreter(server.root, tmp_path, *FAST, "--timeout", "20", wait=60)
    assert r["exit"] == 3 and r["seconds"] < 20, r
    bad = r["doc"]["report"]["bad_replies"]
    assert bad[0].startswith("warm-up 1: ") and f"an SSE line longer than {LINE_MAX_BYTES} bytes" in bad[0], bad


OVER_CAP = [
    ("endless fast content, chunked", lambda: endless(content_event("x" * 100), 0.0, chunked=True), True),
    ("endless fast content, close", lambda: endless(content_event("x" * 100), 0.0, chunked=False), False),
    ("endless data lines in one event", lambda: endless(b"data: {}\n", 0.0, chunked=True), True),
    ("keep-alives in a flood", lambda: endless(b": " + b"k" * 1000 + b"\n", 0.0, chunked=True), True),
    ("one big event", lambda: iter([(0.0, b"data: " + b" " * (LINE_MAX_BYTES + 10) + b"{}\n\n")]), False),
]


@pytest.mark.parametrize("name,events,chunked", OVER_CAP, ids=[o[0] for o in OVER_CAP])
def test_a_reply_past_its_cap_is_refused(name, events, chunked, tmp_path):
    with _serve(raw_posts(events, chunked=chunked)) as server:
        r = in_fresh_interpreter(server.root, tmp_path, *FAST, "--timeout", "20", wait=60)
    assert r["exit"] == 3 and r["seconds"] < 20, r
    bad = r["doc"]["report"]["bad_replies"][0]
    assert bad.startswith("warm-up 1: ") and ("bytes" in bad), bad


def test_sse_lines_are_capped_and_read_in_linear_time():
    """A line dripped a byte at a time is refused at the cap, scanning each byte once."""
    pieces = (b"x" for _ in range(LINE_MAX_BYTES + 1))
    with pytest.raises(BadServerReply, match="longer than"):
        list(iter_sse_data(pieces))
    events = list(iter_sse_data([b"data: a\n", b"\ndata: b\r\n\r", b"\n"]))
    assert events == ["a", "b"]
