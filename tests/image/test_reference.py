"""Image references and the plain-HTTP rule: no registry, no network."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.invoke import run_json

from patchctl.core.errors import EXIT_USAGE, ImageRefError
from patchctl.image.reference import ImageRef, is_loopback, parse_reference


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ubuntu", ImageRef("docker.io", "library/ubuntu")),
        ("lmsysorg/sglang:v0.5.9", ImageRef("docker.io", "lmsysorg/sglang", "v0.5.9")),
        ("localhost:5000/a/b:c", ImageRef("localhost:5000", "a/b", "c")),
        ("reg.example/team/vllm@sha256:" + "a" * 64, ImageRef("reg.example", "team/vllm", None, "sha256:" + "a" * 64)),
        ("127.0.0.1:5000/x:1.0@sha256:" + "b" * 64, ImageRef("127.0.0.1:5000", "x", "1.0", "sha256:" + "b" * 64)),
        ("oci:/tmp/L:base", ImageRef(None, "/tmp/L", "base", None, Path("/tmp/L"))),
        ("oci:rel/dir", ImageRef(None, "rel/dir", None, None, Path("rel/dir"))),
    ],
)
def test_references(text, expected):
    assert parse_reference(text) == expected


@pytest.mark.parametrize(
    "text", ["", "UPPER/case", "a/b:", "a/b:-bad", "a@sha256:12", "reg.example/", "a b", "oci:", "x" * 2000, "reg.example/a//b"]
)
def test_malformed_references_are_usage_errors(text):
    with pytest.raises(ImageRefError) as info:
        parse_reference(text)
    assert info.value.exit_code == EXIT_USAGE


def test_a_malformed_reference_is_exit_2_on_the_command_line(tmp_path):
    doc = run_json("status", "sglang", "--image", "Not/A:Ref:", expect=2)
    assert doc["error"]["kind"] == "image-reference"


def test_to_is_required_and_insecure_needs_image(tmp_path):
    assert "--to" in run_json("apply", "sglang", "--image", "localhost:1/x:y", expect=2)["error"]["message"]
    assert "--image" in run_json("status", "sglang", "--insecure", expect=2)["error"]["message"]


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("localhost:5000", True),
        ("127.0.0.1:5000", True),
        ("127.8.9.10", True),
        ("[::1]:5000", True),
        ("10.0.0.1:5000", False),
        ("reg.example", False),
        ("localhost.example.com:80", False),
    ],
)
def test_only_loopback_is_plain_http_without_a_flag(host, loopback):
    assert is_loopback(host) is loopback


def test_a_remote_registry_is_https_unless_insecure():
    from patchctl.image.registry import RegistryRepository

    ref = parse_reference("10.1.2.3:5000/team/vllm:1")
    remote = RegistryRepository(ref, insecure=False, progress=None)
    assert remote.plain is False and remote._api.base == "https://10.1.2.3:5000/v2/team/vllm/"
    assert RegistryRepository(ref, insecure=True, progress=None).plain is True
    local = RegistryRepository(parse_reference("127.0.0.1:5000/x:1"), insecure=False, progress=None)
    assert local.plain is True and local._api.base.startswith("http://127.0.0.1:5000/")
