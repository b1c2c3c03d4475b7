"""`matrix --image REF`: an image is checked beside the releases, for the engine whose tree it holds,
against a real registry and an image built here. The outcomes are the ones of the release the image
holds, and the digest and patch-set fingerprint are what skopeo (not patchctl) reads from the registry."""

from __future__ import annotations

import json

import pytest
from support.invoke import run_json

from patchctl.matrix.build import load
from patchctl.store.layered import default_store_dir
from tests.image.conftest import SGLANG, need, run

pytestmark = [pytest.mark.network, pytest.mark.slow]

LABEL = "dev.patchctl.patch-set"


def inspect(ref: str, *flags: str) -> dict:
    return json.loads(run(need("skopeo"), "inspect", "--tls-verify=false", *flags, f"docker://{ref}"))


def test_images_are_checked_beside_the_releases(registry, sglang_image, tmp_path):
    store = str(default_store_dir())
    patched = f"{registry}/test/sglang:{SGLANG}-matrix"
    run_json("apply", "sglang", "--image", sglang_image, "--to", patched, "--store", store, expect=0)
    out = tmp_path / "m.yaml"
    md = tmp_path / "m.md"
    doc = run_json(
        "matrix",
        "--engine",
        "sglang",
        "--version",
        SGLANG,
        "--no-nightly",
        "--store",
        store,
        "--image",
        sglang_image,
        "--image",
        patched,
        "-o",
        str(out),
        "--markdown",
        str(md),
        expect=0,
    )
    assert "images_failed" not in doc
    matrix = load(out)  # the written document passes the schema
    data = matrix["engines"]["sglang"]
    release = data["versions"][SGLANG]["patches"]
    base, ours = data["images"][sglang_image], data["images"][patched]

    # The unpatched image is the release it holds: the same outcome and variant in every cell.
    assert base["version"] == SGLANG
    assert {n: (c["outcome"], c["variant"]) for n, c in base["patches"].items()} == {
        n: (c["outcome"], c["variant"]) for n, c in release.items()
    }
    assert base["digest"] == inspect(sglang_image)["Digest"]
    assert [p["patch_set"] for p in base["platforms"]] == [None]
    assert [p["state"] for p in base["platforms"]] == ["not-applied"]

    # The patched image: the cells `check sglang@image:REF` gives (the patched text is there, and
    # check reads no record: "upstreamed"), the label skopeo reads, and status says intact.
    check = run_json("check", f"sglang@image:{patched}", "--store", store, expect=0)
    assert {n: c["outcome"] for n, c in ours["patches"].items()} == {p["name"]: p["outcome"] for p in check["patches"]}
    assert {c["outcome"] for c in ours["patches"].values()} == {"upstreamed"}
    assert ours["digest"] == inspect(patched)["Digest"]
    label = inspect(patched, "--config")["config"]["Labels"][LABEL]
    assert [p["patch_set"] for p in ours["platforms"]] == [label]
    assert [p["state"] for p in ours["platforms"]] == ["intact"]

    table = md.read_text()
    assert f"image `{sglang_image}` ({SGLANG})" in table and f"image `{patched}` ({SGLANG})" in table


def test_an_image_that_cannot_be_read_is_a_failed_column(registry, tmp_path):
    store = str(default_store_dir())
    missing = f"{registry}/test/nothing:here"
    out = tmp_path / "m.yaml"
    doc = run_json(
        "matrix",
        "--engine",
        "sglang",
        "--version",
        SGLANG,
        "--no-nightly",
        "--store",
        store,
        "--image",
        missing,
        "-o",
        str(out),
        expect=1,
    )
    assert doc["images_failed"] == [f"sglang {missing}"]
    column = load(out)["engines"]["sglang"]["images"][missing]
    assert column["error"] and column["patches"] == {}


def test_a_malformed_image_reference_is_exit_2(tmp_path):
    doc = run_json(
        "matrix", "--engine", "sglang", "--no-nightly", "--image", "Bad Ref!", "-o", str(tmp_path / "m.yaml"), expect=2
    )
    assert doc["error"]["kind"] == "image-reference"
    assert not (tmp_path / "m.yaml").exists()
