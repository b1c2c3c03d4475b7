"""Reading an image is bounded (issue 33, item 5): by time (one deadline for the read of the layers,
--timeout plus their compressed size at READ_RATE: a 4 MB layer of 4 GiB of zeros ends at it, not
85 s later), by the bytes a layer inflates to, by what is staged in total, and a full disk while
staging is exit 3 naming the path. Every case is exit 3 with the limit (or the cause) and the path
in the message, and nothing is pushed. Layers are generated here (support.oci)."""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

import pytest
from support import oci
from support.invoke import run_json
from support.mounts import small_tmpfs

from patchctl.image import stack, stream

SITE = oci.SITE
GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> tuple[Path, oci.BuiltLayer]:
    """A ~4 MB gzip layer holding one file of 4 GiB of zeros (made once: it takes a few seconds)."""
    root = tmp_path_factory.mktemp("bomb") / "L"
    layer = oci.write_layer(root, [oci.TarEntry("opt/zeros.bin", zeros=4 * GiB)])
    assert layer.size < 8 * MiB
    return root, layer


def image_with(tmp_path: Path, bomb: tuple[Path, oci.BuiltLayer], where: str) -> Path:
    source, layer = bomb
    layout = tmp_path / "L"
    engine = oci.write_layer(layout, oci.sglang_layer())
    oci.copy_layer(source, layout, layer)
    stacked = {"below": [layer, engine], "above": [engine, layer], "twice": [layer, engine, layer]}[where]
    oci.write_image(layout, stacked)
    return layout


DEADLINE_CASES = [
    ("apply", "below"),
    ("apply", "above"),
    ("apply", "twice"),
    ("apply --dry-run", "above"),
    ("check", "below"),
    ("check", "above"),
]


@pytest.mark.parametrize("command,where", DEADLINE_CASES)
def test_a_decompression_bomb_ends_at_the_deadline(tmp_path, monkeypatch, bomb, command, where):
    """The deadline alone ends it: the inflate cap is raised past the bomb, and each inflated chunk costs
    2 ms more (a slow machine). On a quiet one the 1 GiB cap ended the read first, within the deadline,
    and the test saw the cap's message instead (2026-12-05, the twice-stacked case)."""
    monkeypatch.setattr(stream, "INFLATE_FLOOR", 64 * GiB)
    readinto = stream.Inflated.readinto

    def slow_readinto(self, buffer):
        time.sleep(0.002)
        return readinto(self, buffer)

    monkeypatch.setattr(stream.Inflated, "readinto", slow_readinto)
    layout = image_with(tmp_path, bomb, where)
    store = str(oci.two_patch_store(tmp_path / "store"))
    if command.startswith("apply"):
        args = ["apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{tmp_path / 'o'}:p", *command.split()[1:]]
    else:
        args = ["check", f"sglang@image:oci:{layout}:base"]
    began = time.monotonic()
    doc = run_json(*args, "--store", store, "--timeout", "1", expect=3)
    elapsed = time.monotonic() - began
    assert "deadline" in doc["error"]["message"] and "/opt/zeros.bin" in doc["error"]["message"], doc["error"]
    # 1 s of --timeout + ~1 s for the compressed bytes; the machine may be loaded, not 4 GiB slow
    assert elapsed < 20, elapsed
    assert not oci.tagged(tmp_path / "o", "p")


INFLATE_CASES = [
    (32 * MiB, "below"),
    (64 * MiB, "above"),
    (256 * MiB, "below"),
    (48 * MiB, "in the package"),
    (2 * 12 * MiB, "two files"),
]


@pytest.mark.parametrize("size,where", INFLATE_CASES)
def test_a_layer_inflating_past_the_cap_is_exit_3(tmp_path, monkeypatch, size, where):
    """The cap is lowered to 16 MiB (the real one is 1 GiB, or 200x the layer) so that the case is
    quick; --timeout is long, so the cap and not the deadline ends it."""
    monkeypatch.setattr(stream, "INFLATE_FLOOR", 16 * MiB)
    layout = tmp_path / "L"
    if where == "two files":
        zeros = [oci.TarEntry("opt/one.bin", zeros=size // 2), oci.TarEntry("opt/two.bin", zeros=size // 2)]
        named = "/opt/two.bin"
    elif where == "in the package":
        zeros = [oci.TarEntry(SITE + "sglang/data/big.bin", zeros=size)]
        named = f"/{SITE}sglang/data/big.bin"
    else:
        zeros = [oci.TarEntry("opt/zeros.bin", zeros=size)]
        named = "/opt/zeros.bin"
    layers = [zeros, oci.sglang_layer()] if where == "below" else [oci.sglang_layer(), zeros]
    built = oci.image(layout, layers)
    limit = stream.inflate_limit(built[0 if where == "below" else 1].size)
    assert limit < size  # the generated layer is past the cap
    doc = run_json(
        "apply",
        "sglang",
        "--image",
        f"oci:{layout}:base",
        "--to",
        f"oci:{tmp_path / 'o'}:p",
        "--store",
        str(oci.two_patch_store(tmp_path / "store")),
        "--timeout",
        "600",
        expect=3,
    )
    message = doc["error"]["message"]
    assert f"more than {limit} bytes" in message and named in message, message
    assert not oci.tagged(tmp_path / "o", "p")


def test_the_inflate_cap_is_a_ratio_above_a_floor():
    assert stream.inflate_limit(1000) == stream.INFLATE_FLOOR
    assert stream.inflate_limit(100 * MiB) == 200 * 100 * MiB
    assert stream.inflate_limit(64 * GiB) == stream.MAX_INFLATED


def noise(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


STAGING_CASES = {
    "many records under opt/*/.patchctl": [oci.file(f"opt/{i}/.patchctl/sglang/blobs/b{i}", noise(MiB, i)) for i in range(6)],
    "a few large record files": [oci.file(f"srv/{i}/.patchctl/sglang/state.json", noise(2 * MiB, i)) for i in range(3)],
    "large bytecode of a patched file": [oci.file(SITE + "sglang/srt/__pycache__/a.cpython-311.pyc", noise(5 * MiB, 7))],
    "bytecode of both patched files": [
        oci.file(SITE + f"sglang/srt/__pycache__/{n}.cpython-311.pyc", noise(3 * MiB, i)) for i, n in enumerate("ab")
    ],
    "records beside the engine": [oci.file(SITE + f".patchctl/sglang/blobs/{i:064x}", noise(MiB + 1, i)) for i in range(5)],
}


@pytest.mark.parametrize("case", sorted(STAGING_CASES))
def test_staging_past_its_total_is_exit_3(tmp_path, monkeypatch, case):
    """The total is lowered to 4 MiB (the real one is 1 GiB) so that the case is quick."""
    monkeypatch.setattr(stack, "MAX_STAGED", 4 * MiB)
    layout = tmp_path / "L"
    oci.image(layout, [oci.sglang_layer(), STAGING_CASES[case]])
    doc = run_json(
        "apply",
        "sglang",
        "--image",
        f"oci:{layout}:base",
        "--to",
        f"oci:{tmp_path / 'o'}:p",
        "--store",
        str(oci.two_patch_store(tmp_path / "store")),
        expect=3,
    )
    message = doc["error"]["message"]
    assert str(4 * MiB) in message and "layer 2 of 2" in message, message
    assert any(f"/{e.name}" in message for e in STAGING_CASES[case]), message


ENOSPC_CASES = {
    "a record blob": oci.file(SITE + ".patchctl/sglang/blobs/" + "0" * 64, noise(2 * MiB, 1)),
    "a larger record blob": oci.file(SITE + ".patchctl/sglang/blobs/" + "1" * 64, noise(4 * MiB, 2)),
    "bytecode": oci.file(SITE + "sglang/srt/__pycache__/b.cpython-311.pyc", noise(2 * MiB, 3)),
    "the patched file itself": oci.file(SITE + "sglang/srt/a.py", oci.A_PY + "#" * (3 * MiB) + "\n"),
    "the dist-info": oci.file(
        SITE + "sglang-0.5.9.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n\n" + "x" * (2 * MiB)
    ),
}


@pytest.mark.parametrize("case", sorted(ENOSPC_CASES))
def test_a_full_disk_while_staging_is_exit_3_naming_the_path(tmp_path, monkeypatch, case):
    """The staging folder on a real 1 MiB tmpfs: ENOSPC as it happens, named with the image path."""
    big = ENOSPC_CASES[case]
    layout = tmp_path / "L"
    oci.image(layout, [oci.sglang_layer(), [big]])
    store = str(oci.two_patch_store(tmp_path / "store"))
    with small_tmpfs(tmp_path / "tmpfs", MiB) as mnt:
        monkeypatch.setattr(tempfile, "tempdir", str(mnt))
        doc = run_json(
            "apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{tmp_path / 'o'}:p", "--store", store, expect=3
        )
        left = list(mnt.iterdir())
    message = doc["error"]["message"]
    assert "No space left on device" in message and f"/{big.name}" in message and str(mnt) in message, message
    assert left == [], left  # the staging folder is gone with the error
    assert not oci.tagged(tmp_path / "o", "p")
    assert os.path.isdir(tmp_path)
