"""A package index's simple API (PEP 691 JSON, PEP 503 HTML as fallback), cached for offline use."""
from __future__ import annotations

import html.parser
import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import NamedTuple

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from patchctl.atomic import write_atomic
from patchctl.errors import EnvironmentProblem, NetworkError, UsageError
from patchctl.sources import http

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


class IndexFile(NamedTuple):
    filename: str
    url: str
    sha256: str | None
    size: int | None
    version: Version
    kind: str  # "wheel" or "sdist"
    tags: str  # wheel tags, e.g. "py3-none-any"
    yanked: bool


class IndexProject(NamedTuple):
    name: str
    index_url: str
    files: tuple[IndexFile, ...]
    from_cache: bool

    def versions(self, include_pre: bool = False) -> list[Version]:
        found = {f.version for f in self.files if not f.yanked}
        return sorted(v for v in found if include_pre or not v.is_prerelease)

    def files_for(self, version: Version) -> list[IndexFile]:
        return [f for f in self.files if f.version == version]


class PackageIndex:
    def __init__(self, url: str, cache_root: Path, *, offline: bool = False, origin: str = ""):
        self.url = url.rstrip("/")
        self.cache_root = cache_root
        self.offline = offline
        self.origin = origin
        self._projects: dict[str, IndexProject] = {}

    def _cache_file(self, name: str) -> Path:
        key = re.sub(r"[^A-Za-z0-9]+", "_", self.url)[-80:]
        return self.cache_root / "index" / key / f"{name}.json"

    def project(self, name: str) -> IndexProject:
        name = canonicalize_name(name)
        if name in self._projects:
            return self._projects[name]
        cache_file = self._cache_file(name)
        project = None
        error: Exception | None = None
        if not self.offline:
            try:
                project = self._fetch(name)
                write_atomic(cache_file, json.dumps(_to_json(project)).encode())
            except NetworkError as exc:
                error = exc
        if project is None:
            if cache_file.is_file():
                project = _from_json(json.loads(cache_file.read_text()), self.url)
            elif self.offline:
                raise EnvironmentProblem(
                    f"offline, and the cache has no index page for {name}",
                    hint="run once with the network to fill the cache",
                )
            else:
                raise NetworkError(
                    f"cannot read {name} from the package index {self.url} ({self.origin}) "
                    f"and nothing is cached: {getattr(error, 'message', error)}",
                    hint="check the network or pass --index-url / set PIP_INDEX_URL to a reachable mirror",
                )
        self._projects[name] = project
        return project

    def _fetch(self, name: str) -> IndexProject:
        page = f"{self.url}/{name}/"
        response = http.get(page, headers={"Accept": JSON_ACCEPT}, what=f"the package index ({self.url})")
        if response.status_code == 404:
            raise UsageError(f"the package index {self.url} has no project {name!r}")
        if response.status_code != 200:
            raise NetworkError(f"the package index {self.url} answered HTTP {response.status_code} for {name}")
        ctype = response.headers.get("Content-Type", "")
        base = response.url
        if "json" in ctype:
            raw = [
                (f["filename"], urllib.parse.urljoin(base, f["url"]), (f.get("hashes") or {}).get("sha256"),
                 f.get("size"), bool(f.get("yanked")))
                for f in response.json().get("files", [])
            ]
        else:
            raw = _parse_html(response.text, base)
        files = tuple(f for f in (_index_file(*r) for r in raw) if f is not None)
        return IndexProject(name, self.url, files, from_cache=False)


def _index_file(filename, url, sha256, size, yanked) -> IndexFile | None:
    try:
        if filename.endswith(".whl"):
            _, version, _, tags = parse_wheel_filename(filename)
            tag_text = ".".join(sorted(str(t) for t in tags))
            return IndexFile(filename, url, sha256, size, version, "wheel", tag_text, yanked)
        if filename.endswith((".tar.gz", ".zip")):
            _, version = parse_sdist_filename(filename)
            return IndexFile(filename, url, sha256, size, version, "sdist", "", yanked)
    except (InvalidVersion, ValueError):
        return None
    return None


class _Anchors(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append((dict(attrs).get("href") or "", dict(attrs)))


def _parse_html(text: str, base: str):
    parser = _Anchors()
    parser.feed(text)
    out = []
    for href, attrs in parser.links:
        url = urllib.parse.urljoin(base, href)
        parsed = urllib.parse.urlparse(url)
        filename = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        frag = dict(p.split("=", 1) for p in parsed.fragment.split("&") if "=" in p)
        out.append((filename, url.split("#", 1)[0], frag.get("sha256"), None, "data-yanked" in attrs))
    return out


def _to_json(project: IndexProject) -> dict:
    return {
        "name": project.name,
        "fetched_at": int(time.time()),
        "files": [[f.filename, f.url, f.sha256, f.size, f.yanked] for f in project.files],
    }


def _from_json(data: dict, index_url: str) -> IndexProject:
    files = tuple(f for f in (_index_file(*row) for row in data["files"]) if f is not None)
    return IndexProject(data["name"], index_url, files, from_cache=True)
