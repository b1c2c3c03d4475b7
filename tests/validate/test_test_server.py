"""The one test server's own mechanics: responders in turn, Range, validators, and the four ways a
body is framed (what the stream tests rely on)."""

import http.client
import time

import pytest

from checklib.testserver import (
    BUFFERED,
    CHUNKED,
    CLOSE,
    Request,
    TestServer,
    byte_range,
    file_reply,
    json_reply,
    route,
    sse_reply,
    with_validators,
)

DATA = bytes(range(256)) * 4


def test_byte_range():
    assert byte_range(None, 100) is None and byte_range("items=0-1", 100) is None
    assert byte_range("bytes=10-19", 100) == (10, 19)
    assert byte_range("bytes=90-", 100) == (90, 99)
    assert byte_range("bytes=90-500", 100) == (90, 99)  # clipped to the file
    assert byte_range("bytes=-30", 100) == (70, 99)
    assert byte_range("bytes=-300", 100) == (0, 99)


def get(server: TestServer, path: str, method: str = "GET", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request(method, path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def test_responders_are_asked_in_turn_and_files_honour_range():
    honour = {"range": True}
    file = route("GET", r"/f", lambda req, _m: file_reply(DATA, req, honour_range=honour["range"]))
    other = route("GET", r"/j/(\w+)", lambda _req, m: json_reply({"name": m.group(1)}))
    with TestServer([file, other]) as server:
        resp, body = get(server, "/f", headers={"Range": "bytes=-10"})
        assert resp.status == 206 and body == DATA[-10:]
        assert resp.headers["Content-Range"] == f"bytes {len(DATA) - 10}-{len(DATA) - 1}/{len(DATA)}"
        resp, body = get(server, "/f", method="HEAD")
        assert resp.status == 200 and body == b"" and resp.headers["Content-Length"] == str(len(DATA))
        honour["range"] = False
        resp, body = get(server, "/f", headers={"Range": "bytes=0-9"})
        assert resp.status == 200 and body == DATA  # a mirror that ignores Range
        assert get(server, "/j/abc")[1] == b'{"name": "abc"}'
        assert get(server, "/nothing")[0].status == 404
        assert [(e.method, e.path, e.range, e.status) for e in server.log][:2] == [
            ("GET", "/f", "bytes=-10", 206),
            ("HEAD", "/f", None, 200),
        ]


def test_validators_answer_304_when_nothing_changed():
    page = lambda req: with_validators(json_reply({"v": 1}), req, "Mon, 01 Dec 2025 00:00:00 GMT")  # noqa: E731
    with TestServer([page]) as server:
        resp, _ = get(server, "/p")
        etag = resp.headers["ETag"]
        assert resp.status == 200 and resp.headers["Last-Modified"]
        assert get(server, "/p", headers={"If-None-Match": etag})[0].status == 304
        assert get(server, "/p", headers={"If-None-Match": '"other"'})[0].status == 200


def events(n: int, delay: float):
    return [(delay, {"i": i}) for i in range(n)] + [(0.0, "[DONE]")]


@pytest.mark.parametrize("framing", [CHUNKED, CLOSE, BUFFERED])
def test_each_framing_sends_what_it_says_when_it_says(framing):
    with TestServer([lambda _req: sse_reply(events(5, 0.05), framing)]) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/s", body=b"{}")
        t0 = time.perf_counter()
        resp = conn.getresponse()
        first = resp.read1(65536)
        waited = time.perf_counter() - t0
        rest = resp.read()
        conn.close()
    body = first + rest
    assert body.count(b"data: ") == 6 and body.endswith(b"data: [DONE]\n\n")
    if framing == CHUNKED:
        assert resp.headers["Transfer-Encoding"] == "chunked" and first == b'data: {"i": 0}\n\n'
        assert waited < 0.2  # the first event came when it was due, not at the end
    elif framing == CLOSE:
        assert resp.headers["Content-Length"] is None and resp.headers["Connection"] == "close"
        assert first == b'data: {"i": 0}\n\n' and waited < 0.2
    else:
        assert resp.headers["Content-Length"] == str(len(body)) and first == body  # all at once...
        assert waited >= 0.25  # ...after every delay passed


def test_request_bodies_reach_the_responder():
    seen: list[Request] = []
    with TestServer([lambda req: seen.append(req) or json_reply({})]) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("POST", "/v1/x?a=1", body=b'{"k": 2}', headers={"Content-Type": "application/json"})
        conn.getresponse().read()
        conn.close()
    (req,) = seen
    assert (req.method, req.path, req.query, req.json()) == ("POST", "/v1/x", "a=1", {"k": 2})
