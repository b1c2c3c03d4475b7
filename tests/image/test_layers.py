"""Reading layers as a runtime stacks them, on hand-made tar layers in an OCI layout (no tools):
a later file replaces an earlier one, `.wh.NAME` removes NAME, `.wh..wh..opq` empties a folder of
what lower layers had, an entry leaving the root is never written; a manifest type patchctl does
not read is exit 3."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest
from support.invoke import run_json

from patchctl.core.engines import get_engine
from patchctl.core.errors import ImageContentError, RegistryError
from patchctl.image import layers as L
from patchctl.image.layout import LayoutRepository
from patchctl.image.manifest import Layer, Manifest, media_type_of

SITE = "usr/lib/python3/site-packages/"


def layer(repo_root, files: dict[str, bytes | None], compress=True) -> Layer:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data or b"")
            tar.addfile(info, io.BytesIO(data or b""))
    raw = gzip.compress(buf.getvalue()) if compress else buf.getvalue()
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    (repo_root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (repo_root / "blobs" / "sha256" / digest[7:]).write_bytes(raw)
    return Layer(digest, len(raw), "application/vnd.oci.image.layer.v1.tar+gzip")


def test_whiteouts_opaque_folders_and_replacement(tmp_path):
    repo = LayoutRepository(tmp_path / "L", create=True)
    meta = b"Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n"
    one = layer(
        repo.root,
        {
            SITE + "sglang-0.5.9.dist-info/METADATA": meta,
            SITE + "sglang/__init__.py": b"v1",
            SITE + "sglang/a.py": b"a",
            SITE + "sglang/srt/b.py": b"b",
            SITE + "sglang/srt/c.py": b"c",
            "../escape.py": b"x",
        },
    )
    two = layer(
        repo.root,
        {
            SITE + "sglang/.wh.a.py": b"",
            SITE + "sglang/srt/.wh..wh..opq": b"",
            SITE + "sglang/srt/c.py": b"c2",
            SITE + "sglang/__init__.py": b"v2",
        },
        compress=False,
    )
    engine = get_engine("sglang")
    staged = L.read_layers(repo, [one, two], L.engine_filter(engine, lambda rel: True), tmp_path / "s")
    found = L.find_engine(staged, engine)
    assert found.root == SITE and str(found.version) == "0.5.9"
    got = {p.relative_to(found.local).as_posix(): p.read_bytes() for p in found.local.rglob("*.py")}
    assert got == {"sglang/__init__.py": b"v2", "sglang/srt/c.py": b"c2"}
    assert not (tmp_path / "escape.py").exists()


def test_an_image_without_the_engine_and_one_with_two(tmp_path):
    repo = LayoutRepository(tmp_path / "L", create=True)
    meta = b"Name: sglang\nVersion: 0.5.9\n"
    two = layer(
        repo.root,
        {SITE + "sglang-0.5.9.dist-info/METADATA": meta, "opt/venv/lib/site-packages/sglang-0.5.9.dist-info/METADATA": meta},
    )
    engine = get_engine("sglang")
    with pytest.raises(ImageContentError, match="2 places"):
        L.find_engine(L.read_layers(repo, [two], L.engine_filter(engine, lambda r: True), tmp_path / "a"), engine)
    none = layer(repo.root, {"etc/os-release": b"x"})
    with pytest.raises(ImageContentError, match="no sglang"):
        L.find_engine(L.read_layers(repo, [none], L.engine_filter(engine, lambda r: True), tmp_path / "b"), engine)


def test_unknown_manifest_types_are_exit_3(tmp_path):
    schema1 = json.dumps({"schemaVersion": 1, "mediaType": "application/vnd.docker.distribution.manifest.v1+json"})
    with pytest.raises(RegistryError) as info:
        media_type_of(Manifest(schema1.encode(), "", "sha256:" + "0" * 64))
    assert info.value.exit_code == 3
    root = tmp_path / "L"
    repo = LayoutRepository(root, create=True)
    data = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.example.artifact+json"}).encode()
    digest = hashlib.sha256(data).hexdigest()
    repo.put_bytes(data, "sha256:" + digest)
    repo.put_manifest("x", Manifest(data, "application/vnd.example.artifact+json", "sha256:" + digest))
    doc = run_json("status", "sglang", "--image", f"oci:{root}:x", expect=3)
    assert doc["error"]["kind"] == "registry" and "vnd.example.artifact" in doc["error"]["message"]
