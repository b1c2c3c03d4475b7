"""The one client's request path (http.send) as the registries and validate use it: a login is for
the origin it was meant for, never for the host a redirect names (a registry's blob redirected to a
storage host), and a file body is streamed, sent again whole when a kept-alive connection had closed."""

from __future__ import annotations

import io
import socket
import threading
import time

from checklib.testserver import Reply, Request, TestServer, redirect
from patchctl.sources import http
from patchctl.sources.deadline import Deadline


def test_a_redirect_to_another_origin_drops_the_login():
    seen: dict[str, str | None] = {}

    def storage(request: Request) -> Reply:
        seen["storage"] = request.headers.get("Authorization")
        return Reply(200, b"blob")

    with TestServer([storage]) as other:

        def registry(request: Request) -> Reply:
            seen.setdefault(request.path, request.headers.get("Authorization"))
            if request.path == "/same":
                return redirect("/blob", 307)
            if request.path == "/blob":
                return Reply(200, b"here")
            # "localhost": the same machine, another origin (the host differs)
            return redirect(f"http://localhost:{other.port}/signed?x=1", 307)

        with TestServer([registry]) as server:
            headers = {"Authorization": "Bearer t0k3n"}
            answer = http.send("GET", f"{server.root}/v2/x/blobs/sha256:1", Deadline("blob", "", 10), headers=headers)
            assert answer.content == b"blob"
            assert seen == {"/v2/x/blobs/sha256:1": "Bearer t0k3n", "storage": None}
            answer = http.send("GET", f"{server.root}/same", Deadline("blob", "", 10), headers=headers)
            assert answer.content == b"here" and seen["/blob"] == "Bearer t0k3n"  # the same origin keeps it


def read_request(conn: socket.socket) -> bytes:
    """One request's body, as a server reads it (its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(65536)
    return body


def test_a_file_body_is_sent_whole_on_a_fresh_connection_after_a_stale_one():
    """The server closes the kept-alive connection after its first answer; the next request finds it
    closed and goes again on a new one, from the file's start (not from where the first try left it)."""
    bodies: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(2):  # the first request, then its retry (the stale connection accepts nothing)
            conn, _ = listener.accept()
            with conn:
                bodies.append(read_request(conn))
                conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
                time.sleep(0.2)  # (closed once the client has the answer: it pools the connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/upload"
    try:
        first = http.send("PUT", url, Deadline("put", "", 10), body=b"warm", headers={"Content-Length": "4"}, retries=0)
        assert first.content == b""  # read: the connection goes back to the pool
        time.sleep(0.5)  # the server has closed it
        data = io.BytesIO(b"x" * 100_000)
        data.seek(50)
        answer = http.send("PUT", url, Deadline("put", "", 10), body=data, headers={"Content-Length": "100000"}, retries=0)
        assert answer.status_code == 201
    finally:
        listener.close()
    assert bodies == [b"warm", b"x" * 100_000]
