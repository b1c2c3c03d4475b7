"""A real registry that asks for a login (htpasswd) on plain HTTP: patchctl sends credentials over
HTTPS only, so it is exit 3 saying so, whatever the auth file holds."""

from __future__ import annotations

import base64
import json

import pytest
from support.invoke import run_json

from tests.image.conftest import REGISTRY, SGLANG, need, start_registry

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture
def locked_registry(tmp_path):
    need(REGISTRY)
    crypt = pytest.importorskip("crypt", reason="the crypt module makes the htpasswd entry")
    (tmp_path / "htpasswd").write_text(f"ci:{crypt.crypt('right', crypt.mksalt(crypt.METHOD_BLOWFISH))}\n")
    auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {tmp_path / 'htpasswd'}\n"
    host, proc = start_registry(tmp_path, auth)
    yield host
    proc.terminate()
    proc.wait(10)


def auth_file(path, host, password):
    token = base64.b64encode(f"ci:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return path


def test_a_login_over_plain_http_is_refused(locked_registry, tmp_path, monkeypatch):
    host = locked_registry
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.docker/config.json of the machine's
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth_file(tmp_path / "auth.json", host, "right")))
    doc = run_json("status", "sglang", "--image", f"{host}/test/sglang:{SGLANG}", expect=3)
    assert doc["error"]["kind"] == "registry" and "credentials over HTTPS only" in doc["error"]["message"]
