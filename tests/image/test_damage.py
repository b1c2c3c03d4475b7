"""Images refuse damage (issue 33, item 5): where a patched file or the engine's package is expected,
a FIFO, a device, a link or a folder, or a whiteout (`.wh.NAME`, or an opaque `.wh..wh..opq` in a
later layer) deleting it, is exit 3 naming the path and the layer, never `obsolete`, and nothing is
pushed. What a runtime stacks the same way stays fine: a damaged path mended by a later layer, a
reinstall behind an opaque whiteout, whiteouts of other files, patchctl's own layer's whiteouts.
Images are OCI layouts built here (support.oci), no registry or tool needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import oci
from support.invoke import run_json

SITE = oci.SITE
PKG = SITE + "sglang"
A, B = SITE + oci.PATCHED[0], SITE + oci.PATCHED[1]


def entry(kind: str, name: str) -> list[oci.TarEntry]:
    """A non-regular entry of `kind` at name (a folder replacing a file: the folder and a file in it)."""
    if kind == "dir":
        return [oci.TarEntry(name, "dir"), oci.file(name + "/x.py", "x = 1\n")]
    if kind == "symlink":
        return [oci.TarEntry(name, "symlink", link="/etc/passwd")]
    if kind == "hardlink":  # to a file patchctl does not read out
        return [oci.file("etc/other.py", "x = 1\n"), oci.TarEntry(name, "hardlink", link="etc/other.py")]
    return [oci.TarEntry(name, kind)]


def apply(
    tmp_path: Path,
    upper: list[list[oci.TarEntry]],
    *,
    store: Path | None = None,
    expect: int,
    base: list[list[oci.TarEntry]] | None = None,
) -> dict:
    layout = tmp_path / "L"
    oci.image(layout, (base or [oci.sglang_layer()]) + upper)
    out = tmp_path / "out"
    doc = run_json(
        "apply",
        "sglang",
        "--image",
        f"oci:{layout}:base",
        "--to",
        f"oci:{out}:p",
        "--store",
        str(store or oci.two_patch_store(tmp_path / "store")),
        expect=expect,
    )
    assert oci.tagged(out, "p") == (expect == 0), doc
    return doc


KINDS = ["fifo", "chr", "blk", "symlink", "hardlink", "dir"]


@pytest.mark.parametrize("target", [A, B])
@pytest.mark.parametrize("kind", KINDS)
def test_a_non_regular_file_where_a_patched_file_is_is_exit_3(tmp_path, kind, target):
    doc = apply(tmp_path, [entry(kind, target)], expect=3)
    message = doc["error"]["message"]
    assert doc["error"]["kind"] == "image" and f"/{target}" in message and "layer 2 of 2" in message, message


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dir"])
def test_check_refuses_the_same_damage(tmp_path, kind):
    layout = tmp_path / "L"
    oci.image(layout, [oci.sglang_layer(), entry(kind, A)])
    doc = run_json("check", f"sglang@image:oci:{layout}:base", "--store", str(oci.two_patch_store(tmp_path / "s")), expect=3)
    assert f"/{A}" in doc["error"]["message"], doc["error"]


WHITEOUTS = {
    "the patched file": [oci.whiteout(A)],
    "its folder": [oci.whiteout(SITE + "sglang/srt")],
    "the package": [oci.whiteout(PKG)],
    "an opaque package folder": [oci.opaque(PKG), oci.file(PKG + "/__init__.py", "")],
    "an opaque srt folder": [oci.opaque(SITE + "sglang/srt"), oci.file(SITE + "sglang/srt/c.py", "C = 2\n")],
    "an opaque site-packages, dist-info put back": [oci.opaque(SITE)] + oci.sglang_layer()[:1],
}


@pytest.mark.parametrize("case", sorted(WHITEOUTS))
def test_a_whiteout_deleting_a_patched_file_or_the_package_is_exit_3(tmp_path, case):
    doc = apply(tmp_path, [WHITEOUTS[case]], expect=3)
    message = doc["error"]["message"]
    assert "whiteout" in message and "layer 2 of 2" in message and f"/{SITE}sglang" in message, message


@pytest.mark.parametrize("top", [True, False])
def test_the_package_deleted_with_no_patched_file_in_it_is_exit_3(tmp_path, top):
    """The dist-info stays while the package goes: damage even when no series file was there."""
    engine = oci.engine_files(SITE, "sglang", "0.5.9", {"sglang/__init__.py": "", "sglang/other.py": "x = 1\n"})
    layers = [[oci.whiteout(PKG)]] if top else [[oci.whiteout(PKG)], [oci.file("etc/motd", "hi\n")]]
    doc = apply(tmp_path, layers, base=[engine], expect=3)
    assert f"the engine's package /{PKG} is deleted" in doc["error"]["message"], doc["error"]


def _reinstall() -> list[oci.TarEntry]:
    return [oci.opaque(PKG)] + [e for e in oci.sglang_layer() if e.name.startswith(PKG + "/")]


FINE = {
    "a reinstall behind an opaque whiteout": [_reinstall()],
    "a FIFO mended by a later regular file": [[oci.TarEntry(A, "fifo")], [oci.file(A, oci.A_PY)]],
    "a whiteout of the patched file, put back later": [[oci.whiteout(A)], [oci.file(A, oci.A_PY)]],
    "whiteouts of other files": [[oci.whiteout(SITE + "sglang/srt/c.py"), oci.whiteout("etc/motd")]],
    "a whiteout of bytecode": [[oci.whiteout(SITE + "sglang/srt/__pycache__/a.cpython-311.pyc")]],
    "devices and FIFOs elsewhere": [
        [
            oci.TarEntry("dev/null", "chr"),
            oci.TarEntry("run/x.fifo", "fifo"),
            oci.TarEntry("usr/bin/py", "symlink", link="python3"),
        ]
    ],
}


@pytest.mark.parametrize("case", sorted(FINE))
def test_what_a_runtime_stacks_the_same_way_still_applies(tmp_path, case):
    doc = apply(tmp_path, FINE[case], expect=0)
    assert sorted((p["name"], p["outcome"]) for p in doc["patches"]) == [("pa", "clean"), ("pb", "clean")]


def test_patchctl_s_own_whiteouts_are_not_damage(tmp_path):
    """A patch that deletes a file: patchctl's layer whites it out; apply and status on the patched
    image read that as what apply did (already applied, intact), and a later layer deleting a file
    patchctl wrote is damage again."""
    store = oci.two_patch_store(tmp_path / "store", delete="sglang/srt/c.py")
    layout, out = tmp_path / "L", tmp_path / "out"
    oci.image(layout, [oci.sglang_layer()])
    first = run_json("apply", "sglang", "--image", f"oci:{layout}:base", "--to", f"oci:{out}:p", "--store", str(store), expect=0)
    assert "sglang/srt/c.py" in first["image"]["platforms"][0]["removed"]
    again = run_json(
        "apply", "sglang", "--image", f"oci:{out}:p", "--to", f"oci:{tmp_path / 'again'}:p", "--store", str(store), expect=0
    )
    assert again["image"]["platforms"][0]["layer"] is None
    assert run_json("status", "sglang", "--image", f"oci:{out}:p", expect=0)["state"] == "intact"
    # a layer on top of the patched image deleting a file patchctl's layer wrote
    import json

    index = json.loads((out / "index.json").read_text())
    (descriptor,) = [m for m in index["manifests"] if (m.get("annotations") or {}).get(oci.REF_NAME) == "p"]
    manifest = json.loads(oci.blob_path(out, descriptor["digest"]).read_text())
    config = json.loads(oci.blob_path(out, manifest["config"]["digest"]).read_text())
    top = oci.write_layer(out, [oci.whiteout(A)])
    layers = [
        oci.BuiltLayer(x["digest"], x["size"], d, x["mediaType"])
        for x, d in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True)
    ] + [top]
    oci.write_image(out, layers, tag="later", history=config["history"] + [{"created_by": "rm a.py"}])
    doc = run_json("status", "sglang", "--image", f"oci:{out}:later", expect=3)
    assert f"/{A} is deleted by a whiteout" in doc["error"]["message"], doc["error"]


# --- any stacking: an answer or a clean error, never a traceback, nothing written outside ---------

_NAMES = [
    oci.SITE + p
    for p in (
        "sglang",
        "sglang/srt",
        "sglang/srt/a.py",
        "sglang/srt/b.py",
        "sglang/srt/__pycache__/a.cpython-311.pyc",
        ".patchctl/sglang/state.json",
        "sglang-0.5.9.dist-info/METADATA",
    )
] + [oci.SITE.rstrip("/"), "etc/x", "../escape"]


def _entries():
    from hypothesis import strategies as st

    name = st.sampled_from(_NAMES)
    plain = st.builds(lambda n, d: oci.file(n, d), name, st.binary(max_size=64))
    odd = st.builds(
        lambda n, k: oci.TarEntry(n, k, link="etc/x" if k in ("symlink", "hardlink") else ""),
        name,
        st.sampled_from(["dir", "fifo", "chr", "symlink", "hardlink"]),
    )
    wh = st.builds(oci.whiteout, name)
    opq = st.builds(oci.opaque, st.sampled_from([n for n in _NAMES if not n.endswith((".py", ".pyc", ".json"))]))
    return st.lists(st.one_of(plain, odd, wh, opq), max_size=8)


def test_any_stacking_is_an_answer_or_a_clean_error(tmp_path_factory):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from patchctl.core.engines import get_engine
    from patchctl.core.errors import PatchctlError
    from patchctl.image import layers as L
    from patchctl.image.layout import LayoutRepository
    from patchctl.image.manifest import Layer

    engine = get_engine("sglang")
    want = L.engine_filter(engine, L.with_bytecode(oci.PATCHED), set(oci.PATCHED).__contains__)

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(uppers=st.lists(_entries(), min_size=1, max_size=3), own=st.sets(st.integers(0, 3)))
    def prop(uppers, own):
        root = tmp_path_factory.mktemp("stack")
        repo = LayoutRepository(root / "L", create=True)
        built = [oci.write_layer(repo.root, e) for e in [oci.sglang_layer()] + uppers]
        staging = root / "work" / "staged"
        try:
            staged = L.read_layers(repo, [Layer(b.digest, b.size, b.media_type) for b in built], want, staging, own=own)
        except PatchctlError as exc:
            assert exc.exit_code == 3 and exc.message
        else:
            for name in staged.files:
                path = staging / name
                assert path.is_file() and not path.is_symlink()
        assert not (root / "work" / "escape").exists() and not (root / "escape").exists()
        outside = [p for p in (root / "work").rglob("*") if not str(p).startswith(str(staging))]
        assert outside == []

    prop()
