"""An OCI layout's blobs are checked against their digests before anything read out of them is used
(issue 33, item 3c): a layer changed in place, at the same size, is exit 3 naming the blob, for
`apply --image` (nothing pushed) as for `check …@image:` (nothing read as the engine's files). A
layout's files are opened following no link and read only when regular: a FIFO where a blob or
index.json belongs is exit 3, never a hang. Layouts are built here (support.oci), no tool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import oci
from support.invoke import run_json

from patchctl.core.engines import get_engine
from patchctl.core.errors import RegistryError
from patchctl.image import layers as L
from patchctl.image.layout import LayoutRepository
from patchctl.image.manifest import Layer


def build(tmp_path: Path, *, compress: bool = True) -> tuple[Path, list[oci.BuiltLayer], Path]:
    layout = tmp_path / "L"
    layers = oci.image(layout, [oci.sglang_layer(), [oci.file("etc/motd", "hello\n")]], compress=compress)
    return layout, layers, oci.two_patch_store(tmp_path / "store")


def offsets(size: int) -> dict[str, int]:
    return {"first": 0, "gzip-mtime": 5, "middle": size // 2, "near-end": size - 9, "last": size - 1}


def damage(layout: Path, layers: list[oci.BuiltLayer], which: int, where: str) -> str:
    """Flip one byte of a layer blob in place; return its digest."""
    layer = layers[which]
    oci.flip_byte(oci.blob_path(layout, layer.digest), offsets(layer.size)[where])
    return layer.digest


# Every byte of either layer, compressed or not: flips that gzip does not notice (its header's
# mtime, the trailer a streamed tar never reaches, a stored file's bytes) were used on main.
CASES = [
    (compress, which, where)
    for compress in (True, False)
    for which in (0, 1)
    for where in ("first", "gzip-mtime", "middle", "near-end", "last")
]


@pytest.mark.parametrize("compress,which,where", CASES)
def test_a_layer_changed_in_place_is_refused_by_apply(tmp_path, compress, which, where):
    layout, layers, store = build(tmp_path, compress=compress)
    digest = damage(layout, layers, which, where)
    out = tmp_path / "out"
    # --dry-run pushes nothing, so no later check stands between the damaged bytes and their use.
    dry = run_json(
        "apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{out}:p", "--store", str(store), "--dry-run", expect=3
    )
    assert digest in dry["error"]["message"] or "damaged" in dry["error"]["message"], dry["error"]
    doc = run_json("apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{out}:p", "--store", str(store), expect=3)
    assert doc["error"]["kind"] == "registry", doc["error"]
    assert digest in doc["error"]["message"] or "damaged" in doc["error"]["message"], doc["error"]
    assert not oci.tagged(out, "p")


@pytest.mark.parametrize("compress,where", [(c, w) for c in (True, False) for w in ("gzip-mtime", "middle", "last")])
def test_a_layer_changed_in_place_is_refused_by_check(tmp_path, compress, where):
    layout, layers, store = build(tmp_path, compress=compress)
    digest = damage(layout, layers, 0, where)
    doc = run_json("check", f"sglang@image:oci:{layout}:base", "--store", str(store), expect=3)
    assert digest in doc["error"]["message"] or "damaged" in doc["error"]["message"], doc["error"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_flipped_byte_of_a_tar_layer_is_caught(tmp_path_factory, data):
    """Property: in an uncompressed layer every byte matters (a tar has no checksum over its file
    data), and read_layers refuses each flip before returning anything."""
    root = tmp_path_factory.mktemp("flip")
    repo = LayoutRepository(root / "L", create=True)
    built = oci.write_layer(repo.root, oci.sglang_layer(), compress=False)
    at = data.draw(st.integers(0, built.size - 1), label="offset")
    oci.flip_byte(oci.blob_path(repo.root, built.digest), at)
    engine = get_engine("sglang")
    with pytest.raises(RegistryError) as info:
        L.read_layers(
            repo, [Layer(built.digest, built.size, built.media_type)], L.engine_filter(engine, lambda rel: True), root / "staged"
        )
    assert info.value.exit_code == 3
    assert built.digest in info.value.message or "damaged" in info.value.message


@pytest.mark.parametrize("change", ["appended", "truncated", "replaced-same-size"])
def test_a_layer_of_another_size_or_content_is_refused(tmp_path, change):
    layout, layers, store = build(tmp_path)
    path = oci.blob_path(layout, layers[0].digest)
    raw = path.read_bytes()
    path.write_bytes(
        {
            "appended": raw + b"\0" * 10,
            "truncated": raw[:-10],
            "replaced-same-size": oci.blob_path(layout, layers[1].digest).read_bytes().ljust(len(raw), b"\0"),
        }[change]
    )
    doc = run_json(
        "apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{tmp_path / 'o'}:p", "--store", str(store), expect=3
    )
    assert layers[0].digest[:19] in doc["error"]["message"], doc["error"]


# --- files of a layout that are not regular files -------------------------------------------------


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The command in its own process: one that hangs is killed at `timeout` (the test then fails)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, "-c", "from patchctl.cli.main import main; main()", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _link_to_copy(path: Path) -> None:
    copy = path.parent.parent.parent.parent / f"outside-{path.name}"
    copy.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(copy)


HOSTILE = {
    "index.json is a FIFO": lambda layout, layers: _fifo(layout / "index.json"),
    "the engine layer is a FIFO": lambda layout, layers: _fifo(oci.blob_path(layout, layers[0].digest)),
    "the top layer is a FIFO": lambda layout, layers: _fifo(oci.blob_path(layout, layers[1].digest)),
    "the engine layer links to a copy outside": lambda layout, layers: _link_to_copy(oci.blob_path(layout, layers[0].digest)),
    "blobs/sha256 is a link to a copy": lambda layout, layers: (
        os.rename(layout / "blobs" / "sha256", layout.parent / "elsewhere"),
        (layout / "blobs" / "sha256").symlink_to(layout.parent / "elsewhere"),
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_layout_file_that_is_not_a_regular_file_is_exit_3_without_a_hang(tmp_path, case):
    import json

    layout, layers, store = build(tmp_path)
    HOSTILE[case](layout, layers)
    proc = _cli("apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{tmp_path / 'o'}:p", "--store", str(store))
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3, doc
    message = doc["error"]["message"]
    assert str(layout) in message and ("symlink" in message or "not a regular file" in message), message
    assert not oci.tagged(tmp_path / "o", "p")


# --- a registry's blob in the download cache -------------------------------------------------------


@pytest.mark.network
@pytest.mark.parametrize("where", ["first", "gzip-mtime", "middle", "near-end", "last"])
def test_a_damaged_cached_registry_blob_is_fetched_again(tmp_path, registry, where):
    """The cache is shared by a machine's users: a cached layer changed in place (same size) is
    caught by its digest as it is read, dropped, and fetched again; the command then succeeds."""
    import hashlib

    from patchctl.image.registry import cached_blob
    from tests.image.conftest import need, run

    layout, layers, store = build(tmp_path)
    ref = f"{registry}/test/cached-{where}:1"
    run(need("skopeo"), "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:base", f"docker://{ref}")
    first = run_json("check", f"sglang@image:{ref}", "--store", str(store), expect=0)
    cached = cached_blob(layers[0].digest)
    oci.flip_byte(cached, offsets(layers[0].size)[where])
    again = run_json("check", f"sglang@image:{ref}", "--store", str(store), expect=0)
    assert [p["outcome"] for p in again["patches"]] == [p["outcome"] for p in first["patches"]]
    assert "sha256:" + hashlib.sha256(cached.read_bytes()).hexdigest() == layers[0].digest
