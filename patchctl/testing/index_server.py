"""A real HTTP package index on 127.0.0.1 for tests: PEP 691 JSON pages and files with Range
support (http.server has none), pages with an ETag and Last-Modified answered 304 when they did not
change (as a real index's CDN does), with switches to simulate a server that ignores Range or
validators, or that is down."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class IndexServer:
    def __init__(self, files_dir: Path):
        self.files_dir = files_dir
        self.projects: dict[str, list[Path]] = {}
        self.honour_range = True
        self.json_api = True
        self.validators = True  # send ETag / Last-Modified, answer 304 to a matching conditional request
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header) of every GET
        self.heads: list[str] = []  # paths of HEAD requests (connections opened ahead of range reads)
        self.answers: list[tuple[str, int]] = []  # (path, HTTP status) of every request
        self.bytes_served = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/simple"

    def add(self, project: str, path: Path) -> None:
        self.projects.setdefault(project, []).append(path)

    def __enter__(self) -> IndexServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._serve(head=True)

            def do_GET(self):
                self._serve(head=False)

            def _serve(self, head: bool):
                if head:
                    server.heads.append(self.path)
                else:
                    server.requests.append((self.path, self.headers.get("Range")))
                m = re.match(r"^/simple/([^/]+)/$", self.path)
                if m:
                    return self._page(m.group(1))
                m = re.match(r"^/files/(.+)$", self.path)
                if m and (server.files_dir / m.group(1)).is_file():
                    return self._file(server.files_dir / m.group(1), head)
                self.send_error(404)

            def _page(self, project: str):
                files = server.projects.get(project)
                if files is None:
                    return self.send_error(404)
                entries = [{"filename": f.name, "url": f"/files/{f.name}", "size": f.stat().st_size,
                            "hashes": {"sha256": hashlib.sha256(f.read_bytes()).hexdigest()}} for f in files]
                if server.json_api:
                    body = json.dumps({"meta": {"api-version": "1.0"}, "name": project, "files": entries}).encode()
                    ctype = "application/vnd.pypi.simple.v1+json"
                else:
                    body = "".join(f'<a href="{e["url"]}#sha256={e["hashes"]["sha256"]}">{e["filename"]}</a>\n'
                                   for e in entries).encode()
                    ctype = "text/html"
                etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
                modified = formatdate(max((f.stat().st_mtime for f in files), default=0), usegmt=True)
                if server.validators and (self.headers.get("If-None-Match") == etag
                                          or (self.headers.get("If-Modified-Since") == modified
                                              and self.headers.get("If-None-Match") is None)):
                    server.answers.append((self.path, 304))
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return None
                server.answers.append((self.path, 200))
                self.send_response(200)
                if server.validators:
                    self.send_header("ETag", etag)
                    self.send_header("Last-Modified", modified)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, path: Path, head: bool):
                data = path.read_bytes()
                span = byte_range(self.headers.get("Range"), len(data)) if server.honour_range else None
                if span is not None:
                    start, end = span
                    body = data[start : end + 1]
                    server.answers.append((self.path, 206))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                else:
                    body = data
                    server.answers.append((self.path, 200))
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                    server.bytes_served += len(body)

        return Handler


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end) of a `Range: bytes=START-[END]` or `bytes=-LENGTH` (the last LENGTH bytes) header,
    clipped to the file; None without one. Shared by the test servers that answer range reads as a
    real index does."""
    suffix = re.match(r"bytes=-(\d+)$", header or "")
    if suffix:
        return max(0, size - int(suffix.group(1))), size - 1
    m = re.match(r"bytes=(\d+)-(\d+)?$", header or "")
    if not m:
        return None
    return int(m.group(1)), min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
