"""`apply --image` and `status --image` name the tree by the image's reference and its path inside the
image (issue 36, item 6): the title read "directory /tmp/patchctl-image-…/rootfs/…", a staging folder
that is gone once the command returns."""

from __future__ import annotations

import json
import tempfile

from click.testing import CliRunner
from support import oci
from support.invoke import run_json

STAGING = tempfile.gettempdir().rstrip("/") + "/patchctl-image-"
ROOT = "/" + oci.SITE.rstrip("/")


def test_apply_and_status_name_the_image_not_the_staging_folder(tmp_path):
    from patchctl.cli.main import main

    layout, out = tmp_path / "L", tmp_path / "out"
    oci.image(layout, [oci.sglang_layer()])
    store = oci.two_patch_store(tmp_path / "store")
    args = ["apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{out}:p", "--store", str(store)]

    text = CliRunner().invoke(main, [*args, "--dry-run"])
    assert text.exit_code == 0, text.output
    assert f"sglang 0.5.9 — image oci:{layout}:base (linux/amd64): {ROOT}" in text.stdout
    assert STAGING not in text.output

    doc = run_json(*args, expect=0)
    assert doc["source"]["description"] == f"image oci:{layout}:base (linux/amd64): {ROOT}"
    assert STAGING not in json.dumps(doc)

    status = run_json("status", "sglang", "--image", f"oci:{out}:p", expect=0)
    assert status["state"] == "intact"
    (platform,) = status["image"]["platforms"]
    assert platform["target"] == ROOT
    assert STAGING not in json.dumps(status)
