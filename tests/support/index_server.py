"""A package index on 127.0.0.1 for tests, as responders on the one test server: PEP 691 JSON (or
PEP 503 HTML) project pages, files with Range support, pages with an ETag and Last-Modified
answered 304 when they did not change (as a real index's CDN does), with switches to simulate a
server that ignores Range or validators, or that is down."""

from __future__ import annotations

import hashlib
import re
from email.utils import formatdate
from pathlib import Path
from types import TracebackType

from checklib.testserver import (
    Reply,
    Request,
    TestServer,
    byte_range,
    file_reply,
    pep503_page,
    pep691_page,
    with_validators,
)

__all__ = ["IndexServer", "byte_range"]


class IndexServer:
    def __init__(self, files_dir: Path):
        self.files_dir = files_dir
        self.projects: dict[str, list[Path]] = {}
        self.honour_range = True
        self.json_api = True
        self.validators = True  # send ETag / Last-Modified, answer 304 to a matching conditional request
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header) of every GET
        self.heads: list[str] = []  # paths of HEAD requests (connections opened ahead of range reads)
        self.answers: list[tuple[str, int]] = []  # (path, HTTP status) of every page or file answered
        self.bytes_served = 0
        # HTTP/1.0, as before: one connection per request.
        self.server = TestServer([self._respond], protocol="HTTP/1.0")

    @property
    def url(self) -> str:
        return f"{self.server.root}/simple"

    def add(self, project: str, path: Path) -> None:
        self.projects.setdefault(project, []).append(path)

    def __enter__(self) -> IndexServer:
        self.server.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.stop()

    def _respond(self, request: Request) -> Reply | None:
        if request.method == "HEAD":
            self.heads.append(request.path)
        else:
            self.requests.append((request.path, request.headers.get("Range")))
        m = re.fullmatch(r"/simple/([^/]+)/", request.path)
        if m:
            reply = self._page(m.group(1), request)
        else:
            m = re.fullmatch(r"/files/(.+)", request.path)
            if not (m and (self.files_dir / m.group(1)).is_file()):
                return None
            reply = file_reply((self.files_dir / m.group(1)).read_bytes(), request, honour_range=self.honour_range)
            if request.method != "HEAD":
                self.bytes_served += len(reply.body)
        if reply is not None:
            self.answers.append((request.path, reply.status))
        return reply

    def _page(self, project: str, request: Request) -> Reply | None:
        files = self.projects.get(project)
        if files is None:
            return None
        digests = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
        if self.json_api:
            reply = pep691_page(
                project,
                [
                    {
                        "filename": f.name,
                        "url": f"/files/{f.name}",
                        "size": f.stat().st_size,
                        "hashes": {"sha256": digests[f.name]},
                    }
                    for f in files
                ],
            )
        else:
            reply = pep503_page(project, ((f"/files/{f.name}#sha256={digests[f.name]}", f.name) for f in files))
        if not self.validators:
            return reply
        modified = formatdate(max((f.stat().st_mtime for f in files), default=0), usegmt=True)
        return with_validators(reply, request, modified)
