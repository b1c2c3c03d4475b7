"""The capture loop (patch-package's, quilt's): a hand edit in an installed engine → `new` → `check`
clean and `git apply --check` on the pristine files → `apply`/`revert` round trip → a second edit →
`refresh` → pinned and lint-clean; `status` lists hand edits without changing its exit code; `diff`
shows them as a diff `git apply` takes.

The trees are pip `--target`-style installs of real releases: real files of SGLang 0.5.9 and vLLM
0.23.0 read from the package index, with a dist-info whose RECORD hashes them (what pip writes)."""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.builders import install_fake_dist, write_tree
from support.fixtures import PRISTINE, four_release_index, loader_with
from support.invoke import run_json

from patchctl.cli.main import main
from patchctl.core.yamlio import load_yaml

# engine, version, the installed files (a handful of the release's), the file edited first, the second
RELEASES = {
    "sglang": (
        "0.5.9",
        ["sglang/__init__.py", "sglang/version.py", "sglang/utils.py", "sglang/srt/environ.py", "sglang/cli/main.py"],
        "sglang/utils.py",
        "sglang/srt/environ.py",
    ),
    "vllm": (
        "0.23.0",
        ["vllm/__init__.py", "vllm/version.py", "vllm/envs.py", "vllm/logger.py", "vllm/sequence.py"],
        "vllm/envs.py",
        "vllm/logger.py",
    ),
}


@functools.cache
def release_files(engine: str, version: str, paths: tuple[str, ...]) -> dict[str, bytes]:
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.sources.fetch import SourceContext, release

    source = release(get_engine(engine), Version(version), SourceContext())
    source.prefetch(paths)
    files = {p: source.read(p) for p in paths}
    assert all(data is not None for data in files.values()), files.keys()
    return files


def install(site: Path, engine: str, version: str | None = None, paths: list[str] | None = None) -> dict[str, bytes]:
    default_version, default_paths, _, _ = RELEASES[engine]
    version, paths = version or default_version, paths or default_paths
    files = release_files(engine, version, tuple(paths))
    install_fake_dist(site, engine, version, files)
    return files


def edit(path: Path, after_line: int, text: str) -> bytes:
    """A person's edit: one line inserted after line `after_line`."""
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(after_line, text.encode())
    path.write_bytes(b"".join(lines))
    return path.read_bytes()


def git_apply_check(pristine: dict[str, bytes], patch: bytes | str, tmp: Path) -> subprocess.CompletedProcess:
    tree = write_tree(tmp, pristine)
    return subprocess.run(
        ["git", "apply", "--check", "-v", "-"],
        cwd=tree,
        capture_output=True,
        input=patch if isinstance(patch, bytes) else patch.encode(),
    )


def pins(store: Path, engine: str) -> dict:
    series = load_yaml((store / engine / "series.yaml").read_text())
    return {e["name"]: e["variants"] for e in series["patches"]}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the loop on real releases ------------------------------------------------------------------------


@pytest.mark.network
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_hand_edit_new_check_apply_revert_refresh(tmp_path, engine):
    version, _, first, second = RELEASES[engine]
    site, store = tmp_path / "site", tmp_path / "store"
    pristine = install(site, engine)
    target = ["--target", str(site)]

    edited = edit(site / first, 12, "# a hand edit\n")
    doc = run_json("status", engine, *target, expect=0)
    assert doc["state"] == "not-applied" and doc["unmanaged"] == [first]
    assert f"`patchctl new {engine} NAME --target {site} --store DIR`" in doc["note"]  # runs as printed

    doc = run_json(
        "new", engine, "fix-it", *target, "--store", str(store), "--title", "Fix it", "--why", "It breaks without it.", expect=0
    )
    variant = store / engine / "fix-it" / f"{version}.patch"
    assert doc["variant"] == str(variant) and doc["compared_with"] == "record"
    assert [(f["path"], f["status"], f["release_sha256"]) for f in doc["files"]] == [(first, "modified", sha(pristine[first]))]
    meta = load_yaml((variant.parent / "patch.yaml").read_text())
    assert meta == {
        "title": "Fix it",
        "why": "It breaks without it.",
        "upstream": [],
        "applies_to": f">={version}",
        "drop_when": "upstreamed",
    }
    assert pins(store, engine) == {"fix-it": {variant.name: sha(variant.read_bytes())}}
    assert b"Subject: [PATCH] Fix it" in variant.read_bytes()

    doc = run_json("check", f"{engine}@{version}", "--store", str(store), expect=0)
    assert [(p["name"], p["outcome"]) for p in doc["patches"]] == [("fix-it", "clean")]
    proc = git_apply_check(pristine, variant.read_bytes(), tmp_path / "pristine-1")
    assert proc.returncode == 0, proc.stderr
    assert run_json("lint", "--store", str(store), expect=0)["problems"] == []

    # The tree's record now lists the patch: intact, no hand edit left.
    doc = run_json("status", engine, *target, expect=0)
    assert doc["state"] == "intact" and doc["unmanaged"] == [] and doc["note"] is None

    # apply / revert round trip on the tree, from pristine files.
    (site / first).write_bytes(pristine[first])
    assert run_json("apply", engine, *target, "--store", str(store), expect=0)["written"] == [first]
    assert (site / first).read_bytes() == edited
    assert run_json("status", engine, *target, expect=0)["state"] == "intact"
    assert run_json("revert", engine, *target, expect=0)["restored"] == [first]
    assert (site / first).read_bytes() == pristine[first]
    doc = run_json("status", engine, *target, expect=0)
    assert doc["state"] == "not-applied" and doc["unmanaged"] == []

    # Nothing changed: exit 2, said in words.
    doc = run_json("new", engine, "another", *target, "--store", str(store), expect=2)
    assert doc["error"]["message"] == f"no file of {engine} {version} differs from its release"
    # The name is taken: exit 2.
    edit(site / second, 3, "# unrelated\n")
    doc = run_json("new", engine, "fix-it", *target, "--store", str(store), expect=2)
    assert "already has a patch 'fix-it'" in doc["error"]["message"]
    (site / second).write_bytes(pristine[second])

    # A second edit → refresh: the variant is rewritten from the tree and pinned again.
    run_json("apply", engine, *target, "--store", str(store), expect=0)
    before = variant.read_bytes()
    edit(site / first, 30, "# and a second one\n")
    edit(site / second, 5, "# another file\n")
    doc = run_json("status", engine, *target, expect=1)  # the patched file changed by hand
    assert doc["state"] == "modified" and doc["unmanaged"] == [second]
    doc = run_json("refresh", engine, "fix-it", *target, "--store", str(store), "--file", second, expect=0)
    assert doc["outcome"] == "refreshed" and doc["variant"] == variant.name and sorted(doc["files"]) == sorted([first, second])
    assert variant.read_bytes() != before
    assert pins(store, engine) == {"fix-it": {variant.name: sha(variant.read_bytes())}}
    assert run_json("lint", "--store", str(store), expect=0)["problems"] == []
    doc = run_json("check", f"{engine}@{version}", "--store", str(store), expect=0)
    assert [(p["name"], p["outcome"]) for p in doc["patches"]] == [("fix-it", "clean")]
    proc = git_apply_check(pristine, variant.read_bytes(), tmp_path / "pristine-2")
    assert proc.returncode == 0, proc.stderr
    doc = run_json("status", engine, *target, expect=0)
    assert doc["state"] == "intact" and doc["unmanaged"] == []
    # Refreshing again writes nothing; reverting restores both files.
    assert run_json("refresh", engine, "fix-it", *target, "--store", str(store), expect=0)["outcome"] == "unchanged"
    assert sorted(run_json("revert", engine, *target, expect=0)["restored"]) == sorted([first, second])
    assert {p: (site / p).read_bytes() for p in pristine} == pristine


@pytest.mark.network
def test_the_variant_is_deterministic_and_placeholders_are_unfinished_until_written(tmp_path):
    version, _, first, _ = RELEASES["sglang"]
    variants = []
    for n in (1, 2):
        site, store = tmp_path / f"site{n}", tmp_path / f"store{n}"
        install(site, "sglang")
        edit(site / first, 12, "# a hand edit\n")
        doc = run_json("new", "sglang", "p", "--target", str(site), "--store", str(store), expect=0)
        assert doc["unfinished"] == ["title", "why"]
        variants.append(Path(doc["variant"]).read_bytes())
    assert variants[0] == variants[1]  # fixed identity and date: the same edit, the same bytes

    problems = run_json("lint", "--store", str(store), expect=2)["problems"]
    assert len(problems) == 3 and all("placeholder" in p["message"] for p in problems), problems
    assert {p["where"] for p in problems} == {"sglang/p", f"sglang/p/{version}.patch"}
    meta_file = store / "sglang" / "p" / "patch.yaml"
    meta_file.write_text(
        meta_file.read_text()
        .replace("TODO: say in one line what this patch fixes", "A real title")
        .replace("TODO: what breaks without this patch, and for whom", "A real reason.")
    )
    doc = run_json("refresh", "sglang", "p", "--target", str(site), "--store", str(store), expect=0)
    assert doc["outcome"] == "refreshed"
    assert b"Subject: [PATCH] A real title\n\nA real reason.\n" in (store / "sglang/p" / f"{version}.patch").read_bytes()
    assert run_json("lint", "--store", str(store), expect=0)["problems"] == []


@pytest.mark.network
def test_diff_shows_modified_added_and_deleted_files_and_new_takes_them(tmp_path):
    version, paths, first, second = RELEASES["sglang"]
    site, store = tmp_path / "site", tmp_path / "store"
    pristine = install(site, "sglang")
    edited = edit(site / first, 20, "# edited\n")
    (site / second).unlink()
    (site / "sglang/srt/my_helper.py").write_text("def helper():\n    return 42\n")

    doc = run_json("diff", "sglang", "--target", str(site), expect=0)
    assert {(f["path"], f["status"]) for f in doc["files"]} == {
        (first, "modified"),
        (second, "deleted"),
        ("sglang/srt/my_helper.py", "added"),
    }
    by_path = {f["path"]: f for f in doc["files"]}
    assert by_path[first]["sha256"] == sha(edited) and by_path[first]["release_sha256"] == sha(pristine[first])
    assert by_path[second]["sha256"] is None and by_path["sglang/srt/my_helper.py"]["release_sha256"] is None

    text = CliRunner().invoke(main, ["diff", "sglang", "--target", str(site)])
    assert text.exit_code == 0 and text.stdout.startswith("diff --git a/")
    assert "3 file(s) differ from sglang 0.5.9" in text.stderr
    proc = git_apply_check(pristine, text.stdout, tmp_path / "pristine")
    assert proc.returncode == 0, proc.stderr

    run_json("new", "sglang", "three", "--target", str(site), "--store", str(store), "--title", "t", "--why", "w", expect=0)
    doc = run_json("check", f"sglang@{version}", "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"
    assert sorted(doc["patches"][0]["files"]) == sorted([first, second, "sglang/srt/my_helper.py"])
    # Only the named file, with --file.
    doc = run_json("diff", "sglang", "--target", str(site), "--file", first, expect=0)
    assert doc["files"] == [] and doc["diff"] == ""  # the patch set's now
    assert run_json("status", "sglang", "--target", str(site), expect=0)["state"] == "intact"


@pytest.mark.network
def test_a_tree_without_record_is_compared_with_the_release(tmp_path):
    """A checkout or unpacked tree: `diff` and `new` read the release from the index; `status` (no
    network) says nothing about hand edits."""
    version, paths, first, _ = RELEASES["sglang"]
    tree = write_tree(tmp_path / "tree", release_files("sglang", version, tuple(paths)))
    (tree / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")  # an unpacked sdist
    edit(tree / first, 12, "# edited in a checkout\n")
    doc = run_json("diff", "sglang", "--target", str(tree), "--file", first, "--file", "sglang/version.py", expect=0)
    assert doc["compared_with"] == "release" and [f["path"] for f in doc["files"]] == [first]
    assert run_json("status", "sglang", "--target", str(tree), expect=0)["unmanaged"] == []
    store = tmp_path / "store"
    doc = run_json("new", "sglang", "p", "--target", str(tree), "--store", str(store), "--title", "t", expect=0)
    assert doc["compared_with"] == "release" and [f["path"] for f in doc["files"]] == [first]
    assert run_json("check", f"sglang@{version}", "--store", str(store), expect=0)["patches"][0]["outcome"] == "clean"


@pytest.mark.network
def test_an_edit_on_top_of_a_patched_file(tmp_path):
    """A file the applied patches wrote and a person changed since is reported, left out of `new`
    unless --file names it, and then diffed against what the patches wrote: the new patch stacks."""
    version, _, first, _ = RELEASES["sglang"]
    site, store = tmp_path / "site", tmp_path / "store"
    pristine = install(site, "sglang")
    target = ["--target", str(site), "--store", str(store)]
    edit(site / first, 12, "# the first patch\n")
    run_json("new", "sglang", "first", *target, "--title", "first", expect=0)
    edit(site / first, 40, "# on top of it\n")
    doc = run_json("new", "sglang", "second", *target, expect=2)
    assert "besides the 1 file(s)" not in doc["error"]["message"] and "refresh" in doc["error"]["hint"]
    doc = run_json("new", "sglang", "second", *target, "--title", "second", "--file", first, expect=0)
    assert [f["path"] for f in doc["files"]] == [first] and "patched_sha256" in doc["files"][0]
    check = run_json("check", f"sglang@{version}", "--store", str(store), expect=0)
    assert [(p["name"], p["outcome"]) for p in check["patches"]] == [("first", "clean"), ("second", "clean")]
    assert run_json("status", "sglang", "--target", str(site), expect=0)["state"] == "intact"
    assert run_json("revert", "sglang", "--target", str(site), expect=0)["restored"] == [first]
    assert (site / first).read_bytes() == pristine[first]


@pytest.mark.network
def test_refresh_on_a_newer_release_adds_a_variant_for_it(tmp_path):
    """pip install -U to 0.5.10, the old variant no longer gives the files: the person redoes the edit by
    hand and `refresh` writes 0.5.10.patch beside 0.5.9.patch, both pinned."""
    _, paths, first, _ = RELEASES["sglang"]
    store = tmp_path / "store"
    old_site, new_site = tmp_path / "old", tmp_path / "new"
    install(old_site, "sglang")
    edit(old_site / first, 12, "# the fix\n")
    run_json("new", "sglang", "fix", "--target", str(old_site), "--store", str(store), "--title", "fix", "--why", "w", expect=0)
    install(new_site, "sglang", "0.5.10", paths)
    edit(new_site / first, 14, "# the fix, redone for 0.5.10\n")
    doc = run_json("refresh", "sglang", "fix", "--target", str(new_site), "--store", str(store), expect=0)
    assert (doc["outcome"], doc["variant"], doc["previous_variant"]) == ("added", "0.5.10.patch", "0.5.9.patch")
    folder = store / "sglang" / "fix"
    assert pins(store, "sglang") == {"fix": {n: sha((folder / n).read_bytes()) for n in ("0.5.9.patch", "0.5.10.patch")}}
    for v in ("0.5.9", "0.5.10"):
        doc = run_json("check", f"sglang@{v}", "--store", str(store), expect=0)
        assert (doc["patches"][0]["outcome"], doc["patches"][0]["variant"]) == ("clean", f"{v}.patch")
    assert run_json("lint", "--store", str(store), expect=0)["problems"] == []


# --- without the network: the local index and the store rules ----------------------------------------


def test_the_loop_on_a_local_index(tmp_path, builder):
    """The same loop on real wheels served from 127.0.0.1 (vllm 1.0 of the synthetic tree)."""
    with four_release_index(tmp_path, builder) as server:
        site, store = tmp_path / "site", tmp_path / "mine"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        common = ["--target", str(site), "--index-url", server.url]
        (site / "vllm/loader.py").write_text(loader_with({5: "five, by hand\n"}))
        assert run_json("status", "vllm", "--target", str(site), expect=0)["unmanaged"] == ["vllm/loader.py"]
        run_json("new", "vllm", "p", *common, "--store", str(store), "--title", "t", "--why", "w", expect=0)
        doc = run_json("check", "vllm@1.0", "--store", str(store), "--index-url", server.url, expect=0)
        assert doc["patches"][0]["outcome"] == "clean"
        (site / "vllm/utils.py").write_text(PRISTINE["vllm/utils.py"] + "# more\n")
        doc = run_json("refresh", "vllm", "p", *common, "--store", str(store), "--file", "vllm/utils.py", expect=0)
        assert doc["outcome"] == "refreshed" and doc["files"] == ["vllm/loader.py", "vllm/utils.py"]
        assert run_json("lint", "--store", str(store), expect=0)["problems"] == []
        assert (
            run_json("check", "vllm@1.0", "--store", str(store), "--index-url", server.url, expect=0)["patches"][0]["outcome"]
            == "clean"
        )


def test_a_binary_file_is_left_out_with_a_warning_unless_named(tmp_path, builder):
    with four_release_index(tmp_path, builder) as server:
        site, store = tmp_path / "site", tmp_path / "mine"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        common = ["--target", str(site), "--index-url", server.url, "--store", str(store)]
        (site / "vllm/loader.py").write_text(loader_with({5: "five, by hand\n"}))
        (site / "vllm/weights.bin").write_bytes(b"\x00\x01binary")
        doc = run_json("new", "vllm", "named", *common, "--file", "vllm/weights.bin", expect=2)
        assert "vllm/weights.bin is binary" in doc["error"]["message"]
        doc = run_json("new", "vllm", "p", *common, expect=0)
        assert [f["path"] for f in doc["files"]] == ["vllm/loader.py"]
        assert any("vllm/weights.bin is binary: left out" in w for w in doc["warnings"])


def test_the_bundled_store_is_read_only_unless_named(tmp_path, monkeypatch):
    from patchctl.core.bundled import bundled_store

    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    for command in (["new", "vllm", "p"], ["refresh", "vllm", "p"]):
        doc = run_json(*command, "--target", str(site), expect=2)
        assert "name the store" in doc["error"]["message"] and "--store" in doc["error"]["hint"]
        if bundled_store() is not None:
            monkeypatch.setenv("PATCHCTL_STORE", str(bundled_store()))
            doc = run_json(*command, "--target", str(site), expect=2)
            assert "read-only" in doc["error"]["message"] and str(bundled_store()) in doc["error"]["hint"]
            monkeypatch.delenv("PATCHCTL_STORE")


def test_a_bad_name_is_refused_before_anything_is_read(tmp_path):
    doc = run_json("new", "vllm", "../escape", "--target", str(tmp_path), "--store", str(tmp_path / "s"), expect=2)
    assert "patch name" in doc["error"]["message"]
    assert not (tmp_path / "s").exists()


def test_status_without_record_says_nothing_and_with_one_keeps_its_exit_code(tree, tmp_path):
    assert run_json("status", "vllm", "--target", str(tree), "--as-version", "1.0", expect=0)["unmanaged"] == []
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    (site / "vllm/utils.py").write_text("changed\n")
    (site / "vllm/new_module.py").write_text("x = 1\n")
    (site / "vllm/_C.abi3.so").write_bytes(b"\x7fELF")  # compiled: never hashed, never listed
    doc = run_json("status", "vllm", "--target", str(site), expect=0)
    assert doc["unmanaged"] == ["vllm/new_module.py", "vllm/utils.py"]
    assert doc["note"].startswith(
        "2 files differ from vllm 1.0 and belong to no patch: vllm/new_module.py, "
        f"vllm/utils.py; `patchctl new vllm NAME --target {site} --store DIR` turns them "
        "into one"
    )
    text = CliRunner().invoke(main, ["status", "vllm", "--target", str(site)])
    assert text.exit_code == 0 and "belong to no patch" in text.stdout


def test_revert_from_release_uses_the_shared_scan(tmp_path):
    from patchctl.core.engines import get_engine
    from patchctl.tree.edits import record_mismatches
    from patchctl.tree.target import Target

    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    (site / "vllm/utils.py").write_text("changed\n")
    (site / "vllm/loader.py").unlink()
    (site / "vllm/added.py").write_text("x\n")
    from packaging.version import Version

    target = Target(get_engine("vllm"), site, Version("1.0"), "test")
    assert [(e.path, e.status) for e in record_mismatches(target)] == [
        ("vllm/loader.py", "deleted"),
        ("vllm/utils.py", "modified"),
    ]
    assert ("vllm/added.py", "added") in [(e.path, e.status) for e in record_mismatches(target, added=True)]
