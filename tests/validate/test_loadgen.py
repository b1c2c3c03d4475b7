"""validate's load generator (loadgen.py): HTTP/1.1 replies unframed however the bytes arrive, the
client's CPU per token reported per level, kept-alive connections, and a level sent as the blocking
client sends it: through the proxy the environment names (the absolute URL for plain http, a CONNECT
tunnel for https) and over TLS that trusts what pip trusts."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

import pytest
from support.invoke import run_json
from support.reasoner import MODEL, Reasoner

from checklib.testserver import Request, TestServer
from patchctl.core.errors import BadServerReply
from patchctl.sources import connection, pip_config
from patchctl.validate.client import CHAT, OpenAIClient
from patchctl.validate.loadgen import Exchange, Target
from patchctl.validate.throughput import run_level
from tests.image.test_login import tls  # noqa: F401  (the fixture: a certificate for 127.0.0.1)
from tests.sources.test_http_pip_settings import fresh  # noqa: F401  (no pip or environment setting)

EVENTS = [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n', b"data: [DONE]\n\n"]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
REPLY = HEAD + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n"


class Transport:
    def __init__(self) -> None:
        self.sent = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True


def exchange(pieces: list[bytes]) -> tuple[bytes, Exchange, BaseException | None]:
    """The body bytes an Exchange hands over for a reply arriving in `pieces`."""

    async def go() -> tuple[bytes, Exchange, BaseException | None]:
        proto = Exchange()
        proto.connection_made(Transport())  # type: ignore[arg-type]
        body = bytearray()
        done = proto.send(b"GET / HTTP/1.1\r\n\r\n", lambda status, headers: None, lambda piece, now: body.extend(piece) or False)
        for piece in pieces:
            proto.data_received(piece)
        await asyncio.sleep(0)
        return bytes(body), proto, done.exception() if done.done() else None

    return asyncio.run(go())


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(REPLY)])
def test_a_chunked_reply_is_unframed_however_it_is_split(size):
    body, proto, error = exchange([REPLY[i : i + size] for i in range(0, len(REPLY), size)])
    assert error is None and body == b"".join(EVENTS)
    assert proto.keep  # ended exactly at its terminating chunk: the connection is reused


def test_a_body_that_stops_at_done_is_drained_for_its_connection():
    """[DONE] ends the request at once; its terminating chunk, in a read of its own, still arrives on
    the connection, which is then reused (engines write the two apart)."""
    end = REPLY.index(b"0\r\n\r\n")

    async def go() -> tuple[bool, bool, bool]:
        proto = Exchange()
        proto.connection_made(Transport())  # type: ignore[arg-type]
        done = proto.send(b"GET / HTTP/1.1\r\n\r\n", lambda status, headers: None, lambda piece, now: b"[DONE]" in piece)
        proto.data_received(REPLY[:end])
        stopped, draining = done.done(), proto.drained is not None
        proto.data_received(REPLY[end:])
        return stopped, draining, proto.keep and proto.drained is None

    assert asyncio.run(go()) == (True, True, True)


@pytest.mark.parametrize(
    "reply, why",
    [
        (HEAD + b"zz\r\n", "not a chunk size"),
        (HEAD + b"0x10\r\n", "not a chunk size"),
        (HEAD + b"3\r\nabcXY", "not followed by CRLF"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 << 10), "status line and headers pass"),
        (b"SPDY/9 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
    ],
)
def test_a_reply_that_breaks_http_is_a_bad_reply(reply, why):
    _, proto, error = exchange([reply])
    assert isinstance(error, BadServerReply) and why in str(error), error
    assert proto.transport.closed  # type: ignore[union-attr]


def test_a_level_reports_the_clients_cpu_per_token(shape_server):
    shape_server.settings.update(reasoning=False, delay_s=0.005)
    level = run_level(OpenAIClient(shape_server.base_url), 4, 8, CHAT, "Say anything.", 16)
    assert level.failed == 0 and level.output_tokens == 8 * 16
    # what one level's reading costs: more than nothing, far less than the level's wall time per token
    assert 0 < level.client_cpu_ms_per_token < level.duration_s * 1000 / level.output_tokens


def test_the_report_carries_the_clients_cpu_per_token(shape_server, tmp_path):
    doc = run_json(
        *["validate", "vllm", "--url", shape_server.base_url, "--baseline-dir", str(tmp_path / "b")],
        *["--no-answers", "--concurrency", "1,2", "--requests", "4", "--max-tokens", "8"],
        expect=0,
    )
    levels = doc["report"]["throughput"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    assert all(lv["client_cpu_ms_per_token"] > 0 for lv in levels), levels


def test_a_slot_keeps_its_connection_across_requests(shape_server, monkeypatch):
    shape_server.settings.update(reasoning=False, delay_s=0.001)
    opened = []
    connect = Target.connect

    async def counted(self: Target) -> Exchange:
        opened.append(1)
        return await connect(self)

    monkeypatch.setattr(Target, "connect", counted)
    level = run_level(OpenAIClient(shape_server.base_url), 2, 10, CHAT, "Say anything.", 4)
    assert level.failed == 0, level.errors
    # 2 slots, 10 requests: one connection each, opened before the level, then kept alive
    assert len(opened) == 2
    assert sum(1 for r in shape_server.server.log if r.method == "POST") == 10


def test_a_level_goes_through_the_proxy_the_environment_names(monkeypatch):
    """Plain http through a proxy: the request line carries the absolute URL (as the blocking client's)."""
    model = Reasoner()
    model.settings.update(reasoning=False, delay_s=0.001)
    seen: list[str] = []

    def proxy(request: Request):
        seen.append(request.path)
        prefix = "http://upstream.invalid:9"
        if not request.path.startswith(prefix):
            return None
        return model(Request(request.method, request.path[len(prefix) :], request.query, request.headers, request.body))

    with TestServer([proxy]) as server:
        for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "PIP_PROXY"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", server.root)
        client = OpenAIClient("http://upstream.invalid:9", model="tiny-reasoner")
        level = run_level(client, 2, 4, CHAT, "Say anything.", 4)
    assert level.failed == 0, level.errors
    assert seen.count("http://upstream.invalid:9/v1/chat/completions") == 4, seen


def tls_reasoner(folder) -> tuple[TestServer, Reasoner]:
    model = Reasoner()
    model.settings.update(reasoning=False, delay_s=0.001)
    server = TestServer([model])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    return server, model


def trust(folder, monkeypatch) -> None:
    """pip's `cert` names the test certificate (read afresh, as a new process would)."""
    monkeypatch.setenv("PIP_CERT", str(folder / "cert.pem"))
    monkeypatch.setattr(connection, "_ssl_context", None)
    monkeypatch.setattr(pip_config, "_settings", {})


def test_a_level_over_tls_trusts_what_pip_trusts(fresh, tls, monkeypatch):  # noqa: F811
    server, _ = tls_reasoner(tls)
    with server:
        client = OpenAIClient(f"https://127.0.0.1:{server.port}", model=MODEL)
        untrusted = run_level(client, 2, 2, CHAT, "Say anything.", 4)
        trust(tls, monkeypatch)
        trusted = run_level(client, 2, 4, CHAT, "Say anything.", 4)
    assert untrusted.failed == 2 and "CERTIFICATE_VERIFY_FAILED" in " ".join(untrusted.errors), untrusted.errors
    assert trusted.failed == 0 and trusted.output_tokens == 16, trusted.errors


def connect_proxy() -> tuple[socket.socket, list[bytes]]:
    """A proxy that answers CONNECT with a tunnel (and keeps the request lines it was sent)."""
    listener = socket.create_server(("127.0.0.1", 0))
    asked: list[bytes] = []

    def pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def tunnel(conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(1)
        asked.append(head.split(b"\r\n", 1)[0])
        host, port = head.split()[1].decode().rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
        pipe(conn, upstream)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=tunnel, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return listener, asked


def test_a_level_over_tls_goes_through_a_proxys_connect_tunnel(fresh, tls, monkeypatch):  # noqa: F811
    server, model = tls_reasoner(tls)
    listener, asked = connect_proxy()
    trust(tls, monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{listener.getsockname()[1]}")
    with server, listener:
        level = run_level(OpenAIClient(f"https://127.0.0.1:{server.port}", model=MODEL), 2, 4, CHAT, "Say anything.", 4)
    assert level.failed == 0, level.errors
    assert asked == [f"CONNECT 127.0.0.1:{server.port} HTTP/1.1".encode()] * 2  # one tunnel a slot
    assert sum(1 for body in model.requests if body.get("stream")) == 4
