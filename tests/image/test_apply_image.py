"""`apply --image` / `status --image` against a real registry and an image built here, checked with
tools that are not patchctl: skopeo sees the new layer and history, umoci's unpack of the pushed
image holds files byte-identical to `apply --target` on the same release, and `status --target`
on that unpacked root says intact."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.invoke import run_json

from patchctl.store.layered import default_store_dir
from tests.image.conftest import SGLANG, SITE, need, run, unpack

pytestmark = [pytest.mark.network, pytest.mark.slow]


@pytest.fixture(scope="module")
def store() -> str:
    return str(default_store_dir())


def inspect(ref: str, *flags: str) -> dict:
    return json.loads(run(need("skopeo"), "inspect", "--tls-verify=false", *flags, f"docker://{ref}"))


def files_under(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def patched(registry, sglang_image, store):
    to = f"{registry}/test/sglang:{SGLANG}-patched"
    doc = run_json("apply", "sglang", "--image", sglang_image, "--to", to, "--store", store, expect=0)
    return to, doc


def test_apply_pushes_one_layer_and_a_history_entry(sglang_image, patched):
    to, doc = patched
    before, after = inspect(sglang_image), inspect(to)
    assert after["Layers"][:-1] == before["Layers"] and len(after["Layers"]) == len(before["Layers"]) + 1
    (platform,) = doc["image"]["platforms"]
    assert after["Layers"][-1] == platform["layer"] and after["Digest"] == doc["image"]["digest"]
    config = inspect(to, "--config")
    entry = config["history"][-1]
    fingerprint = config["config"]["Labels"]["dev.patchctl.patch-set"]
    assert entry["author"] == "patchctl" and fingerprint in entry["created_by"]
    applied = [p["name"] for p in doc["patches"] if p["outcome"] in ("clean", "offset")]
    assert applied and all(name in entry["comment"] for name in applied)
    assert len(config["rootfs"]["diff_ids"]) == len(after["Layers"])


def test_unpacked_image_matches_apply_on_a_tree_and_is_intact(patched, release_tree, store, tmp_path):
    to, doc = patched
    run_json("apply", "sglang", "--target", str(release_tree), "--store", store, expect=0)
    rootfs = unpack(to, tmp_path / "bundle")
    site = rootfs / SITE
    ours, theirs = files_under(site / "sglang"), files_under(release_tree / "sglang")
    assert ours.keys() == theirs.keys()
    differing = [p for p in ours if ours[p] != theirs[p]]
    assert differing == [], differing
    written = [p for p in doc["written"] if p.startswith("sglang/")]
    assert written and all((site / p).read_bytes() == (release_tree / p).read_bytes() for p in written)
    assert not (site / ".patchctl" / "sglang" / "lock").exists()  # patchctl's lock is no part of the layer
    status = run_json("status", "sglang", "--target", str(site), expect=0)
    assert status["state"] == "intact"


def test_status_image_reads_the_record_and_the_patch_set(patched, sglang_image, store):
    to, doc = patched
    status = run_json("status", "sglang", "--image", to, expect=0)
    (platform,) = status["image"]["platforms"]
    assert status["state"] == "intact" and platform["state"] == "intact"
    assert platform["patch_set"] == inspect(to, "--config")["config"]["Labels"]["dev.patchctl.patch-set"]
    assert platform["layers_read"] == 1  # only patchctl's own layer, not the release's
    plain = run_json("status", "sglang", "--image", sglang_image, expect=0)
    assert plain["state"] == "not-applied" and plain["image"]["platforms"][0]["layers_read"] == 0


def test_apply_on_the_patched_image_writes_no_second_layer(patched, registry, store):
    to, _ = patched
    again = f"{registry}/test/sglang:{SGLANG}-again"
    doc = run_json("apply", "sglang", "--image", to, "--to", again, "--store", store, expect=0)
    assert doc["image"]["platforms"][0]["layer"] is None
    assert inspect(again)["Layers"] == inspect(to)["Layers"]


def test_a_conflict_pushes_nothing(registry, sglang_layout, store, tmp_path):
    """All or nothing: an image whose server_args.py was changed so the series conflicts is not pushed."""
    umoci, skopeo = need("umoci"), need("skopeo")
    layout = tmp_path / "L"
    run("cp", "-a", str(sglang_layout), str(layout))
    bundle = tmp_path / "bundle"
    run(umoci, "unpack", "--image", f"{layout}:base", str(bundle))
    target = bundle / "rootfs" / SITE / "sglang" / "srt" / "server_args.py"
    target.write_text("# replaced by the test\n")
    run(umoci, "repack", "--image", f"{layout}:base", str(bundle))
    ref = f"{registry}/test/sglang:conflict"
    run(skopeo, "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:base", f"docker://{ref}")
    to = f"{registry}/test/sglang:conflict-patched"
    doc = run_json("apply", "sglang", "--image", ref, "--to", to, "--store", store, expect=1)
    assert doc["image"]["pushed"] is False and doc["image"]["digest"] is None
    gone = subprocess.run([skopeo, "inspect", "--tls-verify=false", f"docker://{to}"], capture_output=True)
    assert gone.returncode != 0


def test_an_oci_layout_in_and_out(sglang_layout, store, tmp_path, release_tree):
    out = tmp_path / "out"
    doc = run_json(
        "apply", "sglang", "--image", f"oci:{sglang_layout}:base", "--to", f"oci:{out}:patched", "--store", store, expect=0
    )
    bundle = tmp_path / "bundle"
    run(need("umoci"), "unpack", "--image", f"{out}:patched", str(bundle))
    site = bundle / "rootfs" / SITE
    for path in (p for p in doc["written"] if p.startswith("sglang/")):
        assert (site / path).read_bytes() != b""
    assert run_json("status", "sglang", "--target", str(site), expect=0)["state"] == "intact"
    assert run_json("status", "sglang", "--image", f"oci:{out}:patched", expect=0)["state"] == "intact"


def test_a_missing_tag_and_an_unreachable_registry_are_exit_3(registry, store):
    doc = run_json(
        "apply",
        "sglang",
        "--image",
        f"{registry}/test/sglang:no-such-tag",
        "--to",
        f"{registry}/test/x:y",
        "--store",
        store,
        expect=3,
    )
    assert doc["error"]["kind"] == "registry" and "no-such-tag" in doc["error"]["message"]
    from tests.image.conftest import free_port

    closed = f"127.0.0.1:{free_port()}"
    doc = run_json("status", "sglang", "--image", f"{closed}/test/sglang:1", expect=3)
    assert doc["error"]["kind"] == "registry" and "cannot reach http://" in doc["error"]["message"]


def test_an_image_without_the_engine_is_exit_3(tmp_path, store):
    umoci = need("umoci")
    layout = tmp_path / "E"
    run(umoci, "init", "--layout", str(layout))
    run(umoci, "new", "--image", f"{layout}:empty")
    doc = run_json(
        "apply", "sglang", "--image", f"oci:{layout}:empty", "--to", f"oci:{tmp_path / 'o'}:x", "--store", store, expect=3
    )
    assert doc["error"]["kind"] == "image" and "sglang" in doc["error"]["message"]


def test_check_reads_the_engine_in_an_image_as_its_release(sglang_image, store):
    """ENGINE@image:REF is an upstream kind: the same outcomes as the release it holds."""
    doc = run_json("check", f"sglang@image:{sglang_image}", "--store", store, expect=0)
    release = run_json("check", f"sglang@{SGLANG}", "--store", store, expect=0)
    assert doc["version"] == SGLANG and doc["source"]["kind"] == "image"
    assert [(p["name"], p["outcome"], p["files"]) for p in doc["patches"]] == [
        (p["name"], p["outcome"], p["files"]) for p in release["patches"]
    ]


def test_list_names_the_variants_the_engine_in_an_image_gets(sglang_image, store):
    """`list ENGINE@image:REF` (issue 26, item 1): the series with the variant each patch would get
    for the version found in the image, as for that release."""
    listed = run_json("list", f"sglang@image:{sglang_image}", "--store", store, expect=0)
    release = run_json("list", f"sglang@{SGLANG}", "--store", store, expect=0)
    assert listed["version"] == SGLANG
    assert [(r["name"], r["chosen_variant"]) for r in listed["series"]] == [
        (r["name"], r["chosen_variant"]) for r in release["series"]
    ]


def test_revert_pushes_the_image_it_was_made_from_byte_for_byte(patched, registry, sglang_image):
    to, _ = patched
    back = f"{registry}/test/sglang:{SGLANG}-reverted"
    doc = run_json("revert", "sglang", "--image", to, "--to", back, expect=0)
    assert doc["image"]["platforms"][0]["state"] == "reverted"
    assert inspect(back)["Digest"] == inspect(sglang_image)["Digest"]
    raw = run(need("skopeo"), "inspect", "--raw", "--tls-verify=false", f"docker://{back}")
    assert raw.encode() == run(need("skopeo"), "inspect", "--raw", "--tls-verify=false", f"docker://{sglang_image}").encode()


def test_stale_bytecode_of_patched_files_is_whited_out(sglang_wheel, store, tmp_path):
    """pip compiles by default: the layer removes the .pyc of each patched file (a whiteout), and
    umoci's unpack no longer has it, while the bytecode of untouched files stays."""
    umoci = need("umoci")
    layout, bundle = tmp_path / "L", tmp_path / "bundle"
    run(umoci, "init", "--layout", str(layout))
    run(umoci, "new", "--image", f"{layout}:base")
    run(umoci, "unpack", "--image", f"{layout}:base", str(bundle))
    run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(bundle / "rootfs" / SITE), str(sglang_wheel))
    run(umoci, "repack", "--image", f"{layout}:base", str(bundle))
    doc = run_json(
        "apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{tmp_path / 'out'}:p", "--store", store, expect=0
    )
    removed = doc["image"]["platforms"][0]["removed"]
    assert f"sglang/srt/__pycache__/server_args.cpython-{sys.version_info[0]}{sys.version_info[1]}.pyc" in removed
    run(umoci, "unpack", "--image", f"{tmp_path / 'out'}:p", str(tmp_path / "unpacked"))
    site = tmp_path / "unpacked" / "rootfs" / SITE
    assert not any((site / p).exists() for p in removed)
    assert any((site / "sglang" / "srt" / "__pycache__").glob("server_args_config_parser.*.pyc"))


def test_export_writes_the_patched_files_of_the_engine_in_an_image(sglang_image, store, tmp_path):
    doc = run_json("export", f"sglang@image:{sglang_image}", str(tmp_path / "a"), "--store", store, expect=0)
    release = run_json("export", f"sglang@{SGLANG}", str(tmp_path / "b"), "--store", store, expect=0)
    assert doc["written"] == release["written"] and doc["written"]
    assert all((tmp_path / "a" / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in doc["written"])
