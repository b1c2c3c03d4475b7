"""The OCI distribution API (manifests, blobs streamed both ways, uploads, mounts) over patchctl's one
HTTP client (sources/http.py): a registry's requests have the index reads' deadline, proxies and trust
store, and every body read here a cap. Logins as the distribution spec has them: a 401's
WWW-Authenticate names a token service (Bearer: a token for repository:REPO:pull,push, fetched with
the stored login as Basic auth if there is one) or asks for Basic auth; credentials go over HTTPS
only. Every failure is a RegistryError (exit 3) naming the repository, the step and what the
registry answered, never a credential."""

from __future__ import annotations

import base64
import json
import re
import urllib.parse
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from patchctl.core.errors import AnswerTooLarge, NetworkError, RegistryError, plain_network_reason
from patchctl.sources import http

if TYPE_CHECKING:
    from patchctl.image.auth import Credentials
    from patchctl.sources.deadline import Deadline

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    )
)
ERROR_TEXT = 300  # bytes of an error answer's body quoted in the message
TOKEN_MAX = 1 << 20  # a token service's JSON answer
# Connections kept open to a registry: a blob pull and the manifest reads around it reuse them.
KEEP = 4
_PARAM = re.compile(r'([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,"]*))')


def challenge(header: str) -> tuple[str, dict[str, str]]:
    """A WWW-Authenticate header's scheme (lower case) and its parameters; ("", {}) for none."""
    scheme, _, rest = header.strip().partition(" ")
    params = {}
    for m in _PARAM.finditer(rest):
        params[m[1].lower()] = re.sub(r"\\(.)", r"\1", m[2]) if m[2] is not None else m[3]
    return scheme.lower(), params


class Registry:
    """One repository's API at host: `https://HOST/v2/REPO/` (http for a loopback or --insecure one)."""

    def __init__(
        self, host: str, repository: str, name: str, *, plain: bool, creds: Credentials | None, unauthorized: tuple[str, str]
    ):
        self.scheme = "http" if plain else "https"
        self.host, self.repository, self.name = host, repository, name
        self.base = f"{self.scheme}://{host}/v2/{repository}/"
        self._creds = creds
        self._unauthorized = unauthorized  # what a refused login says, and the hint (registry.py words both)
        self._authorization: str | None = None

    def request(
        self,
        what: str,
        method: str,
        path: str,
        deadline: Deadline,
        *,
        headers: dict | None = None,
        body: bytes | IO[bytes] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> http.Response:
        """One request of the API, logging in once when it is answered 401; a status outside `ok` is
        a RegistryError quoting the start of the answer."""
        url = path if "://" in path else self.base + path
        for attempt in (0, 1):
            sent = dict(headers or {})
            if self._authorization is not None:
                sent["Authorization"] = self._authorization
            answer = self._send(what, method, url, deadline, sent, body)
            if answer.status_code == 401 and attempt == 0:
                found = answer.headers.get("WWW-Authenticate") or ""
                answer.close()
                self._log_in(what, found, deadline)
                continue
            if answer.status_code == 401:
                answer.close()
                raise self._refused(what)
            if answer.status_code not in ok:
                text = _start_of(answer)
                if answer.status_code == 404:
                    raise RegistryError(f"{self.name}: {what}: not found (HTTP 404) {text}".rstrip())
                raise RegistryError(f"{self.name}: {what}: HTTP {answer.status_code} {text}".rstrip())
            return answer
        raise AssertionError("unreachable: the second 401 raised")

    def read(self, what: str, answer: http.Response, limit: int) -> bytes:
        """The whole body, at most `limit` bytes (RegistryError past it)."""
        answer.max_bytes, answer.limit_why = limit, f"the limit of {what}"
        try:
            return answer.content
        except AnswerTooLarge:
            raise RegistryError(f"{self.name}: {what} is more than {limit} bytes") from None
        except NetworkError as exc:
            raise self._unreachable(what, exc) from None

    def chunks(self, what: str, answer: http.Response, limit: int, size: int) -> Iterator[bytes]:
        """The body in pieces of at most `size` bytes as they arrive, at most `limit` in all."""
        answer.max_bytes, answer.limit_why = limit, f"the size the manifest gives {what}"
        try:
            yield from answer.iter_content(size)
        except AnswerTooLarge:
            raise RegistryError(f"{self.name}: {what} is longer than the {limit} bytes the manifest says") from None
        except NetworkError as exc:
            raise self._unreachable(what, exc) from None

    def _send(
        self, what: str, method: str, url: str, deadline: Deadline, headers: dict, body: bytes | IO[bytes] | None
    ) -> http.Response:
        try:
            # No retries of 429/5xx (a registry's answer is reported as it came), and of an upload
            # none at all: only a refused kept-alive connection is tried again.
            return http.send(method, url, deadline, body=body, headers=headers, retries=0, keep=KEEP)
        except NetworkError as exc:
            raise self._unreachable(what, exc) from None

    def _refused(self, what: str) -> RegistryError:
        why, hint = self._unauthorized
        return RegistryError(f"{self.name}: {what}: the registry {why}", hint=hint)

    def _unreachable(self, what: str, exc: NetworkError) -> RegistryError:
        text = exc.message
        if "SSL" in text or "CERTIFICATE" in text:
            return RegistryError(
                f"{self.name}: {what}: {plain_network_reason(text)}",
                hint="--insecure talks plain HTTP to a registry that has no TLS",
            )
        return RegistryError(f"{self.name}: {what}: cannot reach {self.scheme}://{self.host}: {plain_network_reason(text)}")

    def _log_in(self, what: str, header: str, deadline: Deadline) -> None:
        if self.scheme != "https":
            raise RegistryError(
                f"{self.name}: {what}: the registry asks for a login over plain HTTP, and patchctl sends "
                f"credentials over HTTPS only",
                hint="serve the registry with TLS (a loopback registry too, when it needs a login)",
            )
        scheme, params = challenge(header)
        basic = None
        if self._creds is not None:
            pair = f"{self._creds.username}:{self._creds.password}".encode()
            basic = "Basic " + base64.b64encode(pair).decode("ascii")
        if scheme == "basic":
            if basic is None:
                raise self._refused(what)
            self._authorization = basic
            return
        realm = params.get("realm", "")
        if scheme != "bearer" or urllib.parse.urlsplit(realm).scheme != "https":
            raise RegistryError(
                f"{self.name}: {what}: the registry asks for a login patchctl cannot give "
                f"({header[:100]!r}: a Bearer token service over HTTPS, or Basic auth)"
            )
        query = [("scope", f"repository:{self.repository}:pull,push")]
        if "service" in params:
            query.insert(0, ("service", params["service"]))
        url = realm + ("&" if urllib.parse.urlsplit(realm).query else "?") + urllib.parse.urlencode(query)
        answer = self._send(what, "GET", url, deadline, {"Authorization": basic} if basic else {}, None)
        if answer.status_code in (401, 403):
            answer.close()
            raise self._refused(what)
        if answer.status_code != 200:
            raise RegistryError(
                f"{self.name}: {what}: its token service answered HTTP {answer.status_code} {_start_of(answer)}".rstrip()
            )
        try:
            doc = json.loads(self.read("a token", answer, TOKEN_MAX))
        except (ValueError, UnicodeDecodeError):
            doc = None
        token = (doc.get("access_token") or doc.get("token")) if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{self.name}: {what}: its token service answered no token")
        self._authorization = f"Bearer {token}"


def _start_of(answer: http.Response) -> str:
    """The start of an error answer's body (only that much is read), as text."""
    got = bytearray()
    try:
        for piece in answer.iter_content(ERROR_TEXT):
            got += piece
            if len(got) >= ERROR_TEXT:
                break
    except NetworkError:
        pass
    finally:
        answer.close()
    return bytes(got[:ERROR_TEXT]).decode("utf-8", errors="replace").strip()
