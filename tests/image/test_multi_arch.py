"""A multi-platform index: every platform whose image holds the engine is patched, one without it
is left out and named; the pushed index lists the patched platforms only."""

from __future__ import annotations

import hashlib
import json

import pytest
from support.invoke import run_json

from patchctl.store.layered import default_store_dir
from tests.image.conftest import need, run

pytestmark = [pytest.mark.network, pytest.mark.slow]
INDEX = "application/vnd.oci.image.index.v1+json"


def descriptor(layout, tag):
    index = json.loads((layout / "index.json").read_text())
    return next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)


def test_an_index_patches_the_platforms_holding_the_engine(sglang_layout, registry, tmp_path):
    umoci, skopeo = need("umoci"), need("skopeo")
    layout = tmp_path / "L"
    run("cp", "-a", str(sglang_layout), str(layout))
    run(umoci, "new", "--image", f"{layout}:bare")
    run(umoci, "config", "--image", f"{layout}:bare", "--architecture", "arm64")
    amd, arm = descriptor(layout, "base"), descriptor(layout, "bare")
    entries = [
        dict(amd, platform={"os": "linux", "architecture": "amd64"}),
        dict(arm, platform={"os": "linux", "architecture": "arm64"}),
    ]
    for e in entries:
        e.pop("annotations", None)
    data = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries}).encode()
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"].append(
        {
            "mediaType": INDEX,
            "digest": f"sha256:{digest}",
            "size": len(data),
            "annotations": {"org.opencontainers.image.ref.name": "multi"},
        }
    )
    (layout / "index.json").write_text(json.dumps(index))
    ref = f"{registry}/test/multi:1"
    run(skopeo, "copy", "--quiet", "--all", "--dest-tls-verify=false", f"oci:{layout}:multi", f"docker://{ref}")

    to = f"{registry}/test/multi:patched"
    doc = run_json("apply", "sglang", "--image", ref, "--to", to, "--store", str(default_store_dir()), expect=0)
    assert [p["platform"] for p in doc["image"]["platforms"]] == ["linux/amd64"]
    assert [x["platform"] for x in doc["image"]["left_out"]] == ["linux/arm64"]
    assert any("linux/arm64 left out" in w for w in doc["warnings"])
    pushed = json.loads(run(skopeo, "inspect", "--raw", "--tls-verify=false", f"docker://{to}"))
    assert pushed["mediaType"] == INDEX
    assert [(m["platform"]["architecture"], m["digest"]) for m in pushed["manifests"]] == [
        ("amd64", doc["image"]["platforms"][0]["manifest"])
    ]
    status = run_json("status", "sglang", "--image", to, expect=0)
    assert status["state"] == "intact"
