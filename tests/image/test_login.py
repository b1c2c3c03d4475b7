"""A registry that asks for a login, on the one HTTP client (image/distribution.py): the Bearer
token flow of the distribution spec (the stored login goes to the token service only, as Basic
auth, and the registry gets the token), Basic auth, a refused login named without the password,
and nothing sent over plain HTTP. The registry is the test server on 127.0.0.1 with TLS from a
certificate made here (a loopback registry is plain HTTP to RegistryRepository, so these drive
distribution.Registry itself)."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from checklib.testserver import Reply, Request, TestServer, json_reply
from patchctl.core.errors import RegistryError
from patchctl.image.auth import Credentials
from patchctl.image.distribution import MANIFEST_TYPES, Registry
from patchctl.sources import connection, pip_config
from patchctl.sources.deadline import Deadline

MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}'
PASSWORD = "s3cret-Pa55"


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> Path:
    openssl = shutil.which("openssl") or pytest.skip("openssl makes the test certificate")
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(folder / "key.pem"),
            "-out",
            str(folder / "cert.pem"),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return folder


@pytest.fixture
def trusted(tls, monkeypatch) -> Path:
    """The test certificate is the trust store (pip's cert, as $PIP_CERT names one)."""
    monkeypatch.setenv("PIP_CERT", str(tls / "cert.pem"))
    monkeypatch.setattr(pip_config, "_settings", {})
    monkeypatch.setattr(connection, "_ssl_context", None)
    yield tls
    connection._ssl_context = None  # (monkeypatch puts back the one of before: made for this file's bundle)


class Fake:
    """A registry for team/app and its token service; `seen`: (path, Authorization) of each request."""

    def __init__(self, challenge: str):
        self.challenge = challenge
        self.seen: list[tuple[str, str | None]] = []
        self.token_query: dict[str, list[str]] = {}
        self.server = TestServer([self.answer])

    def answer(self, request: Request) -> Reply:
        auth = request.headers.get("Authorization")
        self.seen.append((request.path, auth))
        basic = "Basic " + base64.b64encode(f"ci:{PASSWORD}".encode()).decode()
        if request.path == "/token":
            self.token_query = urllib.parse.parse_qs(request.query)
            return json_reply({"token": "t0k3n"}) if auth == basic else json_reply({"details": "no"}, 401)
        if request.path == "/v2/team/app/manifests/1":
            if auth not in ("Bearer t0k3n", basic):
                return Reply(401, b"{}", {"WWW-Authenticate": self.challenge.format(port=self.server.port)})
            return Reply(200, MANIFEST, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        return None  # type: ignore[return-value]  (the server's 404)

    def serve(self, tls: Path | None) -> TestServer:
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls / "cert.pem", tls / "key.pem")
            self.server.httpd.socket = context.wrap_socket(self.server.httpd.socket, server_side=True)
        return self.server  # (started by `with`)


def registry(fake: Fake, password: str, plain: bool = False) -> Registry:
    creds = Credentials("ci", password, Path("/home/ci/auth.json"))
    return Registry(
        f"127.0.0.1:{fake.server.port}",
        "team/app",
        "reg/team/app",
        plain=plain,
        creds=creds,
        unauthorized=("refused the login of ci from /home/ci/auth.json", "log in again"),
    )


def manifest(api: Registry) -> bytes:
    answer = api.request("manifest 1", "GET", "manifests/1", Deadline("manifest", "", 10), headers={"Accept": MANIFEST_TYPES})
    return api.read("manifest 1", answer, 1 << 20)


BEARER = 'Bearer realm="https://127.0.0.1:{port}/token",service="test-registry",scope="repository:team/app:pull"'


def test_a_bearer_login_sends_the_password_to_the_token_service_only(trusted):
    fake = Fake(BEARER)
    with fake.serve(trusted):
        assert manifest(registry(fake, PASSWORD)) == MANIFEST
    assert fake.token_query == {"service": ["test-registry"], "scope": ["repository:team/app:pull,push"]}
    basic = "Basic " + base64.b64encode(f"ci:{PASSWORD}".encode()).decode()
    assert fake.seen == [("/v2/team/app/manifests/1", None), ("/token", basic), ("/v2/team/app/manifests/1", "Bearer t0k3n")]


def test_basic_auth_when_the_registry_asks_for_it(trusted):
    fake = Fake('Basic realm="test"')
    with fake.serve(trusted):
        assert manifest(registry(fake, PASSWORD)) == MANIFEST
    assert [auth is not None and auth.startswith("Basic ") for _, auth in fake.seen] == [False, True]


def test_a_refused_login_is_named_without_the_password(trusted):
    fake = Fake(BEARER)
    with fake.serve(trusted), pytest.raises(RegistryError) as info:
        manifest(registry(fake, "wrong-" + PASSWORD))
    error = info.value
    assert error.exit_code == 3 and "refused the login of ci" in error.message and error.hint == "log in again"
    assert PASSWORD not in f"{error.message} {error.hint}" and "t0k3n" not in error.message


def test_no_login_goes_over_plain_http():
    fake = Fake(BEARER)
    with fake.serve(None), pytest.raises(RegistryError, match="credentials over HTTPS only"):
        manifest(registry(fake, PASSWORD, plain=True))
    assert fake.seen == [("/v2/team/app/manifests/1", None)]
