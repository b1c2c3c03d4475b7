"""HTTP with retries, range reads and friendly errors; the only module that talks to the network."""
from __future__ import annotations

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from patchctl.errors import NetworkError

_session: requests.Session | None = None
TIMEOUT = (15, 120)


def session() -> requests.Session:
    global _session
    if _session is None:
        s = requests.Session()
        retry = Retry(total=3, backoff_factor=0.5, status_forcelist=(429, 500, 502, 503, 504))
        s.mount("http://", HTTPAdapter(max_retries=retry, pool_maxsize=8))
        s.mount("https://", HTTPAdapter(max_retries=retry, pool_maxsize=8))
        s.headers["User-Agent"] = "patchctl"
        _session = s
    return _session


def get(url: str, *, headers: dict | None = None, stream: bool = False, what: str = "") -> requests.Response:
    try:
        response = session().get(url, headers=headers or {}, stream=stream, timeout=TIMEOUT)
    except requests.RequestException as exc:
        raise NetworkError(f"cannot reach {what or url}: {_short(exc)}") from None
    return response


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "…"


class RangeNotSupported(Exception):
    pass


def get_range(url: str, start: int, end: int, *, what: str = "") -> bytes:
    """Bytes [start, end] inclusive; RangeNotSupported when the server ignores Range."""
    response = get(url, headers={"Range": f"bytes={start}-{end}"}, what=what)
    if response.status_code == 200:
        response.close()
        raise RangeNotSupported(url)
    if response.status_code != 206:
        raise NetworkError(f"{what or url}: HTTP {response.status_code} for a range request")
    data = response.content
    if len(data) != end - start + 1:
        raise NetworkError(f"{what or url}: short range read ({len(data)} of {end - start + 1} bytes)")
    return data
