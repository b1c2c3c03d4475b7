"""A package index's simple API (PEP 691 JSON, PEP 503 HTML as fallback), cached for offline use.

A cached page is revalidated, not read again: the request carries the page's ETag / Last-Modified,
and a 304 answer (no body) keeps the cached page. Within the freshness window (`index_max_age`
seconds in the config file, or $PATCHCTL_INDEX_MAX_AGE; 0 by default: always revalidate) a cached
page is used without asking at all, which CI sets so that a matrix of many runs asks once. Both only
for a page this user (or root) wrote from the same URL (`_distrust`): any other is read whole."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any, NamedTuple

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from patchctl.core.errors import EnvironmentProblem, NetworkError, UsageError
from patchctl.core.yamlio import load_json
from patchctl.sources import http
from patchctl.sources.cache import ArtifactCache, Damaged

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
MAX_AGE_ENV = "PATCHCTL_INDEX_MAX_AGE"


def max_age() -> float:
    """Seconds a cached index page is used without asking the index: $PATCHCTL_INDEX_MAX_AGE, else
    `index_max_age` in the config file, else 0."""
    raw = os.environ.get(MAX_AGE_ENV)
    origin = MAX_AGE_ENV
    if raw is None or raw == "":
        from patchctl.core import config

        raw = config.load_config().get("index_max_age")
        origin = f"index_max_age in {config.config_file()}"
        if raw is None:
            return 0.0
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not value >= 0:  # also NaN
        raise UsageError(f"{origin} must be a number of seconds >= 0, not {raw!r}")
    return value


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
    # The validators the index sent with the page, for the next conditional request.
    etag: str | None = None
    last_modified: str | None = None

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
        self._cache = ArtifactCache(cache_root)
        self._projects: dict[str, IndexProject] = {}

    def _cache_file(self, name: str) -> Path:
        return self._cache.index_page(self.url, name)

    def project(self, name: str) -> IndexProject:
        name = canonicalize_name(name)
        if name in self._projects:
            return self._projects[name]
        cache_file = self._cache_file(name)
        project = None
        error: Exception | None = None
        cached: IndexProject | None = None
        fetched_at: float | None = None
        if not self.offline:
            cached, fetched_at = self._read_cache_dated(cache_file, name)
            if cached is not None and fetched_at is not None and time.time() - fetched_at < max_age():
                project = cached  # fresh enough: no request at all
            else:
                try:
                    project = self._fetch(name, cached)  # after a 304, the cached page: fresh again
                    self._cache.write(cache_file, json.dumps(_to_json(project)).encode())  # schema-checked on read
                except NetworkError as exc:
                    error = exc
        if project is None:
            cached = cached or self._read_cache(cache_file, name)
            if cached is not None:
                project = cached
            elif self.offline:
                # Each index is cached apart (the release index, a nightly wheel index): say which one.
                raise EnvironmentProblem(
                    f"offline, and the cache has no page for {name} from {self.url}"
                    + (f" ({self.origin})" if self.origin else "")
                    + " (each index is cached apart: a cached release index does not serve this one)",
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

    def _read_cache(self, cache_file: Path, name: str) -> IndexProject | None:
        return self._read_cache_dated(cache_file, name)[0]

    def _read_cache_dated(self, cache_file: Path, name: str) -> tuple[IndexProject | None, float | None]:
        """The cached page and when it was fetched (or revalidated), or None when there is none. A
        damaged one (truncated by a full disk, edited) is deleted when the network can refill it;
        offline, it is an error that says how to refresh."""
        from patchctl.core.schemas import problem

        try:
            raw, ours = self._cache.read_owned(cache_file)
            if raw is None:
                return None, None
            data = strict_json(raw)
        except Damaged as exc:
            wrong: str | None = exc.why
        except (ValueError, RecursionError) as exc:
            wrong = f"not JSON: {exc}"
        else:
            wrong = problem("index-cache", data)
            if wrong is None and data["name"] != name:
                wrong = f"it holds the page of {data['name']!r}, not of {name!r}"
        if wrong is None:
            distrust = _distrust(data, ours, f"{self.url}/{name}/")
            if distrust is None:
                return _from_json(data, self.url), data.get("fetched_at")
            if self.offline:
                raise EnvironmentProblem(
                    f"cache file {cache_file} {distrust}: offline, patchctl cannot tell whether its hashes are the index's",
                    hint="run once online to read it again",
                )
            return None, None  # read again whole: its validators, age and hashes are not trusted
        if self.offline:
            raise EnvironmentProblem(f"cache file {cache_file} is damaged; run once without --offline to refresh it ({wrong})")
        self._cache.remove(cache_file)
        return None, None

    def _fetch(self, name: str, cached: IndexProject | None = None) -> IndexProject:
        """The page from the index; `cached` (when it came with validators) is returned as it is when
        the index answers 304 Not Modified."""
        page = f"{self.url}/{name}/"
        headers = {"Accept": JSON_ACCEPT}
        if cached is not None and cached.etag:
            headers["If-None-Match"] = cached.etag
        if cached is not None and cached.last_modified:
            headers["If-Modified-Since"] = cached.last_modified
        response = http.get(page, headers=headers, what=f"the package index ({self.url})")
        if response.status_code == 304 and cached is not None and len(headers) > 1:
            return cached
        if response.status_code == 404:
            raise UsageError(f"the package index {self.url} has no project {name!r}")
        if response.status_code != 200:
            raise NetworkError(f"the package index {self.url} answered HTTP {response.status_code} for {name}")
        ctype = response.headers.get("Content-Type", "")
        base = response.url
        raw: list[_Row]
        if "json" in ctype:
            raw = [
                (
                    f["filename"],
                    _join(base, f["url"]),
                    (f.get("hashes") or {}).get("sha256"),
                    f.get("size"),
                    bool(f.get("yanked")),
                )
                for f in self._pep691(response, page)["files"]
            ]
        else:
            try:
                raw = _parse_html(response.text, base)
            except AssertionError as exc:  # html.parser's way of refusing some markup
                raise NetworkError(f"the package index {self.url} sent {page} as HTML that does not parse: {exc}") from None
        files = tuple(f for f in (_index_file(*r) for r in raw) if f is not None)
        return IndexProject(
            name,
            self.url,
            files,
            from_cache=False,
            etag=response.headers.get("ETag"),
            last_modified=response.headers.get("Last-Modified"),
        )

    def _pep691(self, response: http.Response, page: str) -> dict:
        """A PEP 691 page, checked against the part of the format patchctl reads (schemas/pep691.json)."""
        from patchctl.core.schemas import problem

        try:
            data = strict_json(response.content)
        except (ValueError, RecursionError) as exc:  # (UnicodeDecodeError, JSONDecodeError are ValueErrors)
            raise NetworkError(f"the package index {self.url} sent {page} as JSON that does not parse: {exc}") from None
        wrong = problem("pep691", data)
        if wrong is not None:
            raise NetworkError(f"the package index {self.url} sent {page} in a shape that is not PEP 691: {wrong}")
        return data


def strict_json(raw: bytes) -> Any:
    """JSON as RFC 8259 has it: NaN and Infinity are refused (json.loads takes them), and an integer
    of over 4300 digits is a ValueError (Python's limit) like any other bad document. The numbers
    that remain are bounded by the schemas (a size at most http.MAX_SIZE)."""
    return load_json(raw.decode("utf-8"))  # yamlio's bounded loader: also nesting, NUL bytes, 64-bit integers


_SHA256 = re.compile(r"[0-9a-f]{64}")


_PLAIN_ABSOLUTE = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?/[A-Za-z0-9._~%+!$&'()*,=:@/-]*(#[A-Za-z0-9=&._-]+)?")


def _join(base: str, url: str) -> str | None:
    if _PLAIN_ABSOLUTE.fullmatch(url) and "/." not in url:
        return url  # absolute, as PEP 691 pages list them: urljoin would give it back as it is (~0.1 ms a file)
    try:
        return urllib.parse.urljoin(base, url)
    except ValueError:  # e.g. "http://[::1": a link no request could follow
        return None


def _index_file(filename: str, url: str | None, sha256: str | None, size: int | None, yanked: bool) -> IndexFile | None:
    if url is None:
        return None
    # The sha256 names the artifact's cache folder: anything but a sha256 is no hash at all.
    sha256 = sha256.lower() if isinstance(sha256, str) and _SHA256.fullmatch(sha256.lower()) else None
    size = int(size) if size is not None else None
    if size:
        http.declare_size(url, size)  # a whole download of it may be no longer than the index says
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


def _anchors(text: str) -> list[tuple[str, bool]]:
    """(href, whether it is yanked) of every <a> with an href on a PEP 503 page; nothing else of an
    anchor is kept (a page of bare `<a>`s costs no memory per anchor). html.parser (~10 ms to
    import) only here: indexes that speak PEP 691 (pip's, PyPI) never need it."""
    import html.parser

    class Anchors(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.links: list[tuple[str, bool]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "a":
                found = dict(attrs)
                if found.get("href"):
                    self.links.append((found["href"] or "", "data-yanked" in found))

    parser = Anchors()
    parser.feed(text)
    return parser.links


_Row = tuple[str, str | None, str | None, int | None, bool]  # filename, url, sha256, size, yanked


def _parse_html(text: str, base: str) -> list[_Row]:
    out: list[_Row] = []
    for href, yanked in _anchors(text):
        url = _join(base, href)
        if url is None:
            continue
        parsed = urllib.parse.urlparse(url)
        filename = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
        if not filename.endswith((".whl", ".tar.gz", ".zip")):
            continue  # not an artifact (_index_file would drop it): not kept
        frag = dict(p.split("=", 1) for p in parsed.fragment.split("&") if "=" in p)
        out.append((filename, url.split("#", 1)[0], frag.get("sha256"), None, yanked))
    return out


def _distrust(data: dict, ours: bool, page: str) -> str | None:
    """Why a cached page (schema-checked) is not trusted, None when it is (issue 33, 3b): its ETag or
    Last-Modified would make a conditional request keep its hashes on a 304, so only a page this user
    (or root) wrote, no one else may rewrite, and fetched from this very URL (another URL can share
    the file name) is revalidated, used while fresh, or read offline."""
    if not ours:
        return "was written by another user, or others may write it"
    if data.get("url") != page:
        return f"was fetched from {data.get('url') or 'an unrecorded URL'}, not {page}"
    return None


def _to_json(project: IndexProject) -> dict:
    out: dict = {
        "name": project.name,
        "url": f"{project.index_url}/{project.name}/",
        "fetched_at": time.time(),
        "files": [[f.filename, f.url, f.sha256, f.size, f.yanked] for f in project.files],
    }
    if project.etag:
        out["etag"] = project.etag
    if project.last_modified:
        out["last_modified"] = project.last_modified
    return out


def _from_json(data: dict, index_url: str) -> IndexProject:
    files = tuple(f for f in (_index_file(*row) for row in data["files"]) if f is not None)
    return IndexProject(
        data["name"], index_url, files, from_cache=True, etag=data.get("etag"), last_modified=data.get("last_modified")
    )
