"""Range reads (HTTP Range requests, for sparse.py): a part of a file in one request of its own
deadline, no longer than the range asked for, whose Content-Range must name that range."""

from __future__ import annotations

import http.client as client

from patchctl.core.errors import NetworkError
from patchctl.sources import http


def _get_partial(url: str, byte_range: str, what: str, length: int) -> http.Response:
    """The 206 answer to a Range request, which may carry at most `length` bytes (the range asked);
    RangeNotSupported when the server sends the whole file."""
    response = http.get(url, headers={"Range": byte_range}, stream=True, what=what, max_bytes=length, expected=length)
    if response.status_code == 200:
        response.close()
        raise http.RangeNotSupported(url)
    if response.status_code != 206:
        response.close()
        raise NetworkError(f"{what or url}: HTTP {response.status_code} for a range request")
    return response


def get_range(url: str, start: int, end: int, *, what: str = "") -> bytes:
    """Bytes [start, end] inclusive; RangeNotSupported when the server ignores Range."""
    length = end - start + 1
    response = _get_partial(url, f"bytes={start}-{end}", what, length)
    answered = (response.headers.get("Content-Range") or "").partition(" ")[2].partition("/")[0]
    if answered and answered != f"{start}-{end}":
        response.close()
        raise NetworkError(f"{what or url}: the server answered bytes {answered[:40]} to a request for {start}-{end}")
    data = _read(response, what or url)
    if len(data) != length:
        raise NetworkError(f"{what or url}: short range read ({len(data)} of {length} bytes)")
    return data


def get_suffix(url: str, length: int, *, what: str = "") -> tuple[int, bytes]:
    """The last `length` bytes and the file's size (from Content-Range), in one request: for a file
    whose size the index did not publish, instead of a HEAD first."""
    response = _get_partial(url, f"bytes=-{length}", what, length)
    total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
    try:
        if total in ("", "*"):
            raise NetworkError(f"{what or url}: a range answer without the file's size (Content-Range)")
        size = http.byte_count(total, url, "Content-Range size")
    except NetworkError:
        response.close()
        raise
    data = _read(response, what or url)
    if len(data) > size:
        raise NetworkError(f"{what or url}: a range answer longer than the file's size ({size} bytes)")
    return size, data


def _read(response: http.Response, what: str) -> bytes:
    try:
        return response.content
    except NetworkError as exc:
        if not exc.message.startswith(what):
            exc.message = f"{what}: {exc.message}"
            exc.args = (exc.message,)
        raise
    except (OSError, client.HTTPException) as exc:
        response.close()
        raise NetworkError(f"{what}: the answer broke off ({http.short(exc)})") from None
