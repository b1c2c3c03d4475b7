"""Every download and page bounded (issue 33, items 6a, 6b and 8a), against the hostile index of
test_http_limits.py (patches/checklib/testserver.py's raw replies), each case the real `patchctl check`
in a fresh interpreter:

- a download's size: the index listing 10^12 bytes for a wheel let `check --verify --timeout 5` run
  36 s and write 2.4 GB into the cache. Now any one download is capped by --max-download, a listed
  size over it is refused before a byte is fetched, and the deadline's allowance is fixed from the
  size an answer may carry, never from what arrived;
- an answer cut short (fewer bytes than its Content-Length, a chunked body that breaks off): a PEP
  503 page cut after one release was read as the whole page;
- numbers out of range in an index answer (a PEP 691 size of 10**400: exit 4, OverflowError).

Each case is tallied with its class in $NETLIMITS_TALLY when set (test_http_limits.run_case)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_http_limits import MB, WHEEL, Hostile, _honest, assert_clean, check_args, run_case

from checklib import testserver
from checklib.testserver import RAW, Reply, Request, raw_head

PEP691 = "application/vnd.pypi.simple.v1+json"
TIMEOUT = 5.0
MARGIN = 8.0  # seconds past the allowance: the interpreter's start, the command's own work, a loaded machine (2 cores, shared)


def page_json(wheel: bytes, size: str | None = None, extra: str = "") -> bytes:
    """A PEP 691 page written as text, so that a number can be anything JSON's grammar (or Python's
    reader) takes: `size` and `extra` (more members of the file's entry) go in as given."""
    sha = hashlib.sha256(wheel).hexdigest()
    entry = f'"filename": "{WHEEL}", "url": "/files/{WHEEL}", "hashes": {{"sha256": "{sha}"}}'
    if size is not None:
        entry += f', "size": {size}'
    return ('{"meta": {"api-version": "1.0"}, "name": "vllm", "files": [{' + entry + extra + "}]}").encode()


def page_html(wheel: bytes) -> bytes:
    sha = hashlib.sha256(wheel).hexdigest()
    return (
        f'<!DOCTYPE html>\n<html><body>\n<a href="/files/{WHEEL}#sha256={sha}">{WHEEL}</a><br/>\n'
        + "".join(f'<a href="/files/vllm-1.{n}-py3-none-any.whl">vllm-1.{n}</a><br/>\n' for n in range(1, 40))
        + "</body></html>\n"
    ).encode()


def serve_page(server: Hostile, body: bytes, ctype: str = PEP691) -> None:
    server.routes["/simple/vllm/"] = lambda r: server.write(
        raw_head("200 OK", {"Content-Type": ctype, "Content-Length": str(len(body))}) + body
    )


def endless(server: Hostile, headers: dict[str, str], cap: int = 64 * MB, rate: int | None = None) -> Reply:
    """A 200 answer of zeros without end (until `cap`), at `rate` bytes/s (None: as fast as it goes)."""
    events = testserver.zero_stream(None, cap=cap, piece=64 << 10 if rate else MB, on_sent=server._count)
    if rate:
        events = ((len(data) / rate, data) for _, data in events)
    return Reply(body=raw_head("200 OK", headers), framing=RAW, events=events)


def largest_artifact(cache: Path) -> int:
    """The largest file under the cache's download folders (a part file included), 0 when none."""
    sizes = [0]
    for folder in ("artifacts", "verified"):
        for p in (cache / folder).rglob("*"):
            try:
                sizes.append(p.lstat().st_size if p.is_file() else 0)
            except OSError:  # (a part file renamed or removed between the listing and the lstat)
                pass
    return max(sizes)


class CachePeak:
    """The largest download file the cache held while the block ran (polled every 20 ms): what
    patchctl wrote, which the server's count of bytes sent (socket buffers included) overstates."""

    def __init__(self, cache: Path):
        self.cache, self.peak = cache, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, largest_artifact(self.cache))

    def __enter__(self) -> CachePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, largest_artifact(self.cache))


# --- 1. a listed size over --max-download: refused before a byte is fetched, in time -------------

OVER_CAP = {
    # name: (the size the index lists, --max-download or None for the default 1 GiB)
    "1e12-default": (10**12, None),  # the sweep's case
    "default+1": ((1 << 30) + 1, None),
    "2^53-1-default": ((1 << 53) - 1, None),
    "1TiB-default": (1 << 40, None),
    "5MiB-over-4MiB": (5 * MB, "4MiB"),
    "2MiB+1-over-2M": (2 * MB + 1, "2M"),
    "honest-wheel-over-1K": (None, "1K"),  # (None: the wheel's true size)
}


@pytest.mark.parametrize("name", list(OVER_CAP))
def test_a_listed_size_over_the_download_cap_is_refused_before_fetching(name, store, fresh_cache):
    listed, cap = OVER_CAP[name]
    wheel = _honest()
    with Hostile(wheel) as server:
        serve_page(server, page_json(wheel, str(listed if listed is not None else len(wheel))))
        # What the sweep's server did: no Content-Length, zeros as fast as they go.
        server.routes[f"/files/{WHEEL}"] = lambda r: endless(server, {"Content-Type": "application/octet-stream"})
        extra = ["--verify", "--timeout", f"{TIMEOUT:g}"] + (["--max-download", cap] if cap else [])
        with CachePeak(fresh_cache) as written:
            result = run_case("download cap", name, check_args(server, store, *extra), wait=60)
        sent = server.sent
    message = assert_clean(result, f"/files/{WHEEL}", "--max-download", "nothing was fetched")
    assert ("1 GiB" if cap is None else "") in message
    assert result["seconds"] < TIMEOUT + MARGIN, result["seconds"]
    assert sent == 0
    assert written.peak == 0


# --- 2. a download with no stated size: cut off at --max-download, its deadline fixed up front ---

CAPPED = [("256K", 0.3), ("1M", None), ("2M", None), ("3M", 1 << 20), ("4MiB", None), ("6M", None)]


@pytest.mark.parametrize("cap,rate", CAPPED, ids=[f"{c}-{'fast' if r is None else f'{r}Bps'}" for c, r in CAPPED])
@pytest.mark.parametrize("listed", [False, True], ids=["unlisted", "listed-1e12-over-a-larger-cap"])
def test_an_endless_download_stops_at_the_cap_with_nothing_left(cap, rate, listed, store, fresh_cache):
    """No Content-Length; the index lists no size, or the cap itself. The server sends zeros as fast
    as it can (stopped by the cap), or at `rate` (< 1: a fraction of MIN_RATE, a drip stopped by the
    deadline, whose allowance is the cap's at MIN_RATE and does not follow the bytes; else bytes/s)."""
    from patchctl.cli.options import parse_size
    from patchctl.sources.deadline import MIN_RATE

    limit = parse_size(cap)
    assert limit is not None
    wheel = _honest()
    bps = None if rate is None else int(rate * MIN_RATE) if rate < 1 else int(rate)
    with Hostile(wheel, list_size=False) as server:
        # Listed: the index states the cap exactly, the server sends on without end.
        serve_page(server, page_json(wheel, str(limit) if listed else None))
        server.routes[f"/files/{WHEEL}"] = lambda r: endless(server, {"Content-Type": "application/octet-stream"}, rate=bps)
        with CachePeak(fresh_cache) as written:
            result = run_case(
                "download cap",
                f"{cap}-{rate}-{listed}",
                check_args(server, store, "--verify", "--timeout", "2", "--max-download", cap),
                wait=90,
            )
        sent = server.sent
    message = assert_clean(result, f"/files/{WHEEL}")
    allowance = 2 + limit / MIN_RATE
    assert result["seconds"] < allowance + MARGIN, (result["seconds"], allowance)
    if bps is None:  # fast: stopped by the cap, not the deadline
        assert "larger than" in message and ("--max-download" in message or listed), message
    assert sent <= limit + 16 * MB  # (pieces in flight and the loopback sockets' buffers)
    assert written.peak <= limit  # never past the cap (a fast run may end between two polls)
    assert largest_artifact(fresh_cache) == 0
    assert not list(fresh_cache.rglob("*.part"))


# --- 3. answers cut short: pages and downloads ----------------------------------------------------


def _cut_cases() -> dict[str, tuple[str, bytes, str]]:
    """name: (what is cut: page-json / page-html / download, the whole body, how it is cut)."""
    wheel = _honest()
    cases = {}
    for kind, body in (("page-json", page_json(wheel, str(len(wheel)))), ("page-html", page_html(wheel)), ("download", wheel)):
        for how in ("length-1", "length-half", "length-after-first", "chunked-no-end", "chunked-bad-size", "chunked-mid-chunk"):
            cases[f"{kind}-{how}"] = (kind, body, how)
    return cases


def _cut_reply(body: bytes, how: str, ctype: str) -> bytes:
    if how.startswith("length"):
        keep = {
            "length-1": len(body) - 1,
            "length-half": len(body) // 2,
            "length-after-first": body.find(b"<br/>") + 5 if b"<br/>" in body else 40,
        }[how]
        return raw_head("200 OK", {"Content-Type": ctype, "Content-Length": str(len(body))}) + body[:keep]
    head = raw_head("200 OK", {"Content-Type": ctype, "Transfer-Encoding": "chunked"})
    half = len(body) // 2
    first = b"%x\r\n%s\r\n" % (half, body[:half])
    if how == "chunked-no-end":  # every byte sent, in two chunks; the last chunk (0) never comes
        return head + first + b"%x\r\n%s\r\n" % (len(body) - half, body[half:])
    if how == "chunked-bad-size":
        return head + first + b"zz\r\n" + body[half:]
    return head + first + b"%x\r\n%s" % (len(body) - half, body[half:-3])  # mid-chunk


CUTS = _cut_cases()


@pytest.mark.parametrize("name", list(CUTS))
def test_an_answer_cut_short_is_an_error_naming_the_url(name, store, fresh_cache):
    kind, body, how = CUTS[name]
    with Hostile(_honest()) as server:
        if kind == "download":
            path, ctype, extra = f"/files/{WHEEL}", "application/octet-stream", ["--verify"]
        else:
            path, ctype, extra = "/simple/vllm/", PEP691 if kind == "page-json" else "text/html", []
        server.routes[path] = lambda r: server.write(_cut_reply(body, how, ctype))
        result = run_case("cut short", name, check_args(server, store, *extra), wait=60)
    message = assert_clean(result, path, "cut short")
    assert not list(fresh_cache.rglob("*.part"))
    if kind != "download":  # a page cut short is not cached as if it were the page
        assert not list(fresh_cache.rglob("vllm.json")), message


def test_a_whole_page_then_a_close_is_read(store, fresh_cache):
    """The other side of the cut: a page that carries every byte its Content-Length states, the
    connection closed after it, checks clean (the test that the refusals above are not of all pages)."""
    wheel = _honest()
    with Hostile(wheel) as server:
        serve_page(server, page_html(wheel), "text/html")
        result = run_case("cut short", "whole-page-control", check_args(server, store), ok_exit=0)
    assert result["outcome"] == "clean", result.get("stderr")
    assert result["doc"]["patches"][0]["outcome"] == "clean"


# --- 4. numbers out of range in an index answer ----------------------------------------------------

BIG = "9" * 5000  # past Python's 4300 digits: json.loads raises a plain ValueError, not a JSONDecodeError

NUMBERS = {
    # name: (the PEP 691 entry's size as JSON text, more members of the entry)
    "size-10^400": (str(10**400), ""),
    "size-2^53": (str(1 << 53), ""),
    "size-negative": ("-1", ""),
    "size-5000-digits": (BIG, ""),
    "size-1e400-float": ("1e400", ""),
    "size-1e300-float": ("1e300", ""),
    "size-NaN": ("NaN", ""),
    "size-Infinity": ("Infinity", ""),
    "upload-time-5000-digits": (None, f', "upload-time": {BIG}'),  # (None: the wheel's true size)
    "upload-time-NaN": (None, ', "upload-time": NaN'),
    "upload-time-Infinity": (None, ', "upload-time": -Infinity'),
    "yanked-5000-digits": (None, f', "yanked": {BIG}'),
}


@pytest.mark.parametrize("name", list(NUMBERS))
def test_a_number_out_of_range_in_an_index_page_is_a_bad_answer(name, store, fresh_cache):
    size, extra = NUMBERS[name]
    wheel = _honest()
    with Hostile(wheel) as server:
        serve_page(server, page_json(wheel, str(len(wheel)) if size is None else size, extra))
        result = run_case("index numbers", name, check_args(server, store), wait=60)
    assert_clean(result, "/simple/vllm/")


HEADER_NUMBERS = {
    # name: (the header, its value), on the answer to a wheel's suffix read (no size listed)
    "content-range-superscript": ("Content-Range", "bytes 0-9/\u00b2"),
    "content-range-5000-digits": ("Content-Range", f"bytes 0-9/{BIG}"),
    "content-range-10^400": ("Content-Range", f"bytes 0-9/{10**400}"),
    "content-range-negative": ("Content-Range", "bytes 0-9/-5"),
    "content-range-float": ("Content-Range", "bytes 0-9/1e9"),
    "content-length-superscript": ("Content-Length", "\u00b2"),
    "content-length-word": ("Content-Length", "ten"),
}


@pytest.mark.parametrize("name", list(HEADER_NUMBERS))
def test_a_byte_count_out_of_range_in_a_header_is_a_bad_answer(name, store, fresh_cache):
    header, value = HEADER_NUMBERS[name]
    wheel = _honest()
    with Hostile(wheel, list_size=False) as server:

        def respond(r: Request) -> Reply:
            headers = {
                "Content-Type": "application/octet-stream",
                "Content-Range": f"bytes 0-9/{len(wheel)}",
                "Content-Length": "10",
                header: value,
            }
            return Reply(
                body=raw_head("206 Partial Content", headers).replace(value.encode("utf-8"), value.encode("latin-1"))
                + wheel[:10],
                framing=RAW,
            )

        server.routes[f"/files/{WHEEL}"] = respond
        result = run_case("header numbers", name, check_args(server, store), wait=60)
    assert_clean(result, f"/files/{WHEEL}")


# --- 5. the option --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,size",
    [
        ("1073741824", 1 << 30),
        ("512M", 512 << 20),
        ("512MiB", 512 << 20),
        ("2g", 2 << 30),
        ("64K", 64 << 10),
        (" 3 GiB ", 3 << 30),
        ("1T", 1 << 40),
    ],
)
def test_max_download_reads_sizes(text, size):
    from patchctl.cli.options import parse_size

    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["0", "-1", "1.5G", "1e9", "lots", "9" * 30, "\u00b2", "1PB", ""])
def test_a_bad_max_download_is_a_usage_error(bad, tmp_path):
    from support.invoke import run_json

    doc = run_json("check", "vllm@1.0", "--index-url", "http://127.0.0.1:9/simple", "--max-download", bad)
    assert doc["exit_code"] == 2, doc
    assert "--max-download" in json.dumps(doc)


def test_the_max_download_option_is_the_commands_not_the_processes(tmp_path):
    from support.invoke import run_json

    from patchctl.sources import http

    run_json("check", "sglang@file:" + str(tmp_path / "none.whl"), "--max-download", "5M")
    assert http.DOWNLOAD_MAX_BYTES == 5 * MB
    run_json("check", "sglang@file:" + str(tmp_path / "none.whl"))
    assert http.DOWNLOAD_MAX_BYTES == http.DEFAULT_DOWNLOAD_MAX_BYTES == 1 << 30


def test_the_default_cap_holds_twice_the_largest_engine_wheel():
    """vllm 0.15.1's x86_64 wheel, 509,219,874 bytes, the largest engine wheel on the index when the
    default was chosen: the default holds two of it (a larger release must not need the option)."""
    from patchctl.sources import http

    assert http.DEFAULT_DOWNLOAD_MAX_BYTES >= 2 * 509_219_874
    assert "--max-download" in (Path(__file__).parents[2] / "docs/limits.md").read_text()


# --- 6. the deadline's allowance, in process: fixed once, whatever arrives -----------------------


@pytest.mark.parametrize(
    "framing,listed",
    [("close", None), ("chunked", None), ("close", 3 * MB // 2), ("chunked", 3 * MB // 2), ("close", 10**12), ("length", None)],
)
def test_the_deadline_does_not_follow_the_bytes_received(framing, listed, monkeypatch):
    """The allowance is the --timeout plus what the answer may carry (its Content-Length, else the
    size the index lists, within the download cap) at MIN_RATE, fixed when the headers are in: the
    old deadline grew by every byte received, so an answer of no stated size ran as long as it
    flowed (the sweep: 36 s and 2.4 GB under --timeout 5)."""
    from patchctl.core.errors import NetworkError
    from patchctl.sources import http

    MIN_RATE = http.MIN_RATE  # noqa: N806
    cap = 2 * MB
    monkeypatch.setattr(http, "DOWNLOAD_MAX_BYTES", cap)
    monkeypatch.setattr(http, "TIMEOUT", 30.0)
    monkeypatch.setattr(http, "_declared", {})
    body_pieces = [(0.0, bytes(256 << 10)) for _ in range(4)]  # 1 MiB in all, under every limit
    framing_of = {"close": testserver.CLOSE, "chunked": testserver.CHUNKED, "length": testserver.LENGTH}[framing]
    with testserver.TestServer([lambda r: Reply(200, b"", {}, events=iter(body_pieces), framing=framing_of)]) as srv:
        url = f"{srv.root}/files/x.whl"
        if listed is not None:
            http.declare_size(url, listed)
        if listed is not None and listed > cap:
            with pytest.raises(NetworkError, match="--max-download"):
                http.get(url, stream=True)
            return
        response = http.get(url, stream=True)
        deadline = response._deadline
        assert deadline is not None
        fixed = deadline.at()
        stated = MB if framing == "length" else (listed or cap)
        assert fixed == pytest.approx(deadline.start + 30.0 + stated / MIN_RATE)
        seen = [deadline.at() for _ in response.iter_content(64 << 10)]
    assert len(seen) >= 4 and set(seen) == {fixed}


# --- 7. numbers out of range in the cached copy of an index page ----------------------------------

CACHED_NUMBERS = {
    # name: the cached document's fetched_at and size (as JSON text)
    "fetched_at-10^400": (str(10**400), "1000"),
    "fetched_at-1e308": ("1e308", "1000"),
    "fetched_at-negative": ("-1e300", "1000"),
    "fetched_at-5000-digits": (BIG, "1000"),
    "size-10^400": ("1", str(10**400)),
    "size-NaN": ("1", "NaN"),
}


@pytest.mark.parametrize("offline", [False, True], ids=["online", "offline"])
@pytest.mark.parametrize("name", list(CACHED_NUMBERS))
def test_a_number_out_of_range_in_a_cached_page_is_a_damaged_entry(name, offline, store, fresh_cache, monkeypatch):
    """The download cache is shared (docs/threat-model.md): a planted page whose fetched_at is
    10**400 made `time.time() - fetched_at` an OverflowError (exit 4). Online it is fetched again
    (and the check is clean), offline it is named as damaged (exit 3)."""
    from patchctl.sources.cache import ArtifactCache

    fetched_at, size = CACHED_NUMBERS[name]
    monkeypatch.setenv("PATCHCTL_INDEX_MAX_AGE", "3600")  # (a fresh page would be used without asking)
    wheel = _honest()
    with Hostile(wheel) as server:
        page = ArtifactCache(fresh_cache).index_page(server.url, "vllm")
        page.parent.mkdir(parents=True)
        sha = hashlib.sha256(wheel).hexdigest()
        page.write_text(
            f'{{"name": "vllm", "fetched_at": {fetched_at}, "files": '
            f'[["{WHEEL}", "{server.url.rsplit("/", 1)[0]}/files/{WHEEL}", "{sha}", {size}, false]]}}'
        )
        argv = check_args(server, store) + (["--offline"] if offline else [])
        result = run_case(
            "cached index numbers", f"{name}-{'offline' if offline else 'online'}", argv, wait=60, ok_exit=3 if offline else 0
        )
    assert result["outcome"] == "clean", {k: v for k, v in result.items() if k != "doc"}
    if offline:
        assert str(page) in result["doc"]["error"]["message"]
    else:
        assert result["doc"]["patches"][0]["outcome"] == "clean"


# --- 8. any header text: a byte count in range or a NetworkError, nothing else --------------------


@given(
    st.one_of(
        st.text(max_size=60),
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.from_regex(r"\s*[0-9\u00b2\u0660-\u0669]{1,40}\s*", fullmatch=True),
    )
)
@settings(max_examples=300, deadline=None)
def test_byte_count_takes_only_ascii_counts_in_range(text):
    from patchctl.core.errors import NetworkError
    from patchctl.sources import http

    try:
        n = http.byte_count(text, "http://127.0.0.1/x", "Content-Length")
    except NetworkError as exc:
        assert "http://127.0.0.1/x" in exc.message
    else:
        assert 0 <= n <= http.MAX_SIZE and str(n) == text.strip().lstrip("0").rjust(1, "0")
