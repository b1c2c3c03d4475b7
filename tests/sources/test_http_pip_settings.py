"""The one client reaches the index as pip does: through pip's `proxy` and with pip's `cert` ($PIP_PROXY,
$PIP_CERT, or pip's configuration files), not only through the environment's proxies and requests'
CA bundle variables."""

from __future__ import annotations

import ssl

import pytest

from checklib.testserver import Reply, Request, TestServer
from patchctl.core.errors import NetworkError
from patchctl.sources import connection, http, pip_config
from tests.image.test_login import tls  # noqa: F401  (the fixture: a certificate for 127.0.0.1)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No setting of this machine's pip or environment, and none read yet."""
    for name in (
        "PIP_CERT",
        "PIP_PROXY",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
    ):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "pip.conf"
    empty.write_text("")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(empty))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "none"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(pip_config, "_settings", {})
    monkeypatch.setattr(connection, "_ssl_context", None)
    monkeypatch.setattr(http, "_idle", {})
    yield tmp_path
    connection._ssl_context = None


def tls_server(folder) -> TestServer:
    server = TestServer([lambda request: Reply(200, b"index page")])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    return server


def test_pip_s_cert_is_the_trust_store(fresh, tls, monkeypatch):  # noqa: F811
    with tls_server(tls) as server:
        url = f"https://127.0.0.1:{server.port}/simple/"
        with pytest.raises(NetworkError, match="certificate|CERTIFICATE"):
            http.get(url)  # certifi's store does not know the test certificate
        monkeypatch.setattr(connection, "_ssl_context", None)
        monkeypatch.setattr(pip_config, "_settings", {})  # (a new process: read again)
        (fresh / "pip.conf").write_text(f"[global]\ncert = {tls / 'cert.pem'}\n")
        assert http.get(url).content == b"index page"


def test_pip_s_proxy_carries_plain_http(fresh, monkeypatch):
    asked: list[str] = []

    def proxy(request: Request) -> Reply:
        asked.append(request.path)
        return Reply(200, b"through the proxy")

    with TestServer([proxy]) as server:
        monkeypatch.setenv("PIP_PROXY", f"127.0.0.1:{server.port}")  # (pip takes one without a scheme)
        assert http.get("http://index.invalid/simple/vllm/").content == b"through the proxy"
    assert asked == ["http://index.invalid/simple/vllm/"]
