"""How rebase classifies a patch when the store already holds a variant newer than the old base (the
0.20 -> 0.23 triton-sparse-mla case: rebase used to replay the old variant and call it a conflict), and
that the relocation search runs only for hunks that lost their place, reading only what it needs.
Synthetic wheels on a local index for the mechanics; the real vLLM releases for the regression."""

from __future__ import annotations

import random
import tarfile
from pathlib import Path

import pytest
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json

from patchctl.patching import relocate
from patchctl.patching.hunks import parse_variant
from patchctl.sources.release import ReleaseSource

REPO = Path(__file__).resolve().parents[2]
HEADER = "# a header upstream added\n"
ON_11 = loader_with({20: "upstream twenty\n"})  # upstream's own edit of the line the patches change
FAR = "def unrelated_helper_function():\n    return 'nothing like the moved code'\n"
SERVER = (
    "def pick_backend(capability):\n    major = capability[0]\n    if major == 9:\n"
    "        return 'flashmla_sparse'\n    return 'triton_mla_dense'\n"
)
NEAR = (
    "class Overrides:\n    def pick_backend(self, capability):\n        major = capability[0]\n"
    "        if major == 9:\n            return 'flashmla_sparse'\n        return 'triton_mla_dense'\n"
)
TREES = {
    "1.0": dict(PRISTINE, **{"vllm/server.py": SERVER}),
    "1.1": dict(PRISTINE, **{"vllm/loader.py": ON_11, "vllm/server.py": SERVER}),
    "1.2": dict(PRISTINE, **{"vllm/loader.py": HEADER + ON_11, "vllm/server.py": SERVER}),
    # server.py's code moved one directory down; an unrelated file sits three steps away; and a
    # wheel big enough to be read by range reads, as vLLM's are
    "1.3": dict(
        PRISTINE,
        **{
            "vllm/loader.py": ON_11,
            "vllm/groups/overrides.py": NEAR,
            "vllm/a/b/c/far.py": FAR,
            "vllm/_blob.bin": random.Random(0).randbytes(3 << 20),
        },
    ),
}


class Spy:
    """Counts what a rebase reads of the releases: whole downloads, tar opens, files listed, paths."""

    def __init__(self, monkeypatch):
        self.tar_opens = self.listings = 0
        self.downloads: list[str] = []  # artifacts fetched (or verified) whole
        self.prefetched: list[str] = []
        self.sources: list[ReleaseSource] = []
        spy = self
        init, full, under, prefetch = (
            ReleaseSource.__init__,
            ReleaseSource.download_full,
            ReleaseSource.files_under,
            ReleaseSource.prefetch,
        )
        topen = tarfile.open

        def _init(self, *a, **k):
            init(self, *a, **k)
            spy.sources.append(self)

        def _full(self):
            spy.downloads.append(self.artifact.filename)
            return full(self)

        def _under(self, prefix):
            spy.listings += 1
            return under(self, prefix)

        def _prefetch(self, paths):
            paths = list(paths)
            spy.prefetched += paths
            return prefetch(self, paths)

        def _topen(*a, **k):
            spy.tar_opens += 1
            return topen(*a, **k)

        monkeypatch.setattr(ReleaseSource, "__init__", _init)
        monkeypatch.setattr(ReleaseSource, "download_full", _full)
        monkeypatch.setattr(ReleaseSource, "files_under", _under)
        monkeypatch.setattr(ReleaseSource, "prefetch", _prefetch)
        monkeypatch.setattr(tarfile, "open", _topen)

    @property
    def bytes_fetched(self) -> int:
        return sum(s.bytes_fetched for s in self.sources)


@pytest.fixture
def index(tmp_path, builder):
    files = tmp_path / "files"
    files.mkdir()
    v10, v11 = TREES["1.0"], TREES["1.1"]
    # a person already made the 1.1 variant (the 1.0 one conflicts with upstream's line 20 there)
    builder.add(
        "vllm",
        "rewritten",
        variants={
            "1.0": builder.variant(v10, {"vllm/loader.py": loader_with({20: "our twenty\n"})}),
            "1.1": builder.variant(v11, {"vllm/loader.py": loader_with({20: "our twenty, as on 1.1\n"})}),
        },
    )
    builder.add(
        "vllm",
        "dependent",
        depends_on=("rewritten",),
        variants={"1.0": builder.variant(v10, {"vllm/utils.py": PRISTINE["vllm/utils.py"].replace("return 2", "return 3")})},
    )
    # only a 1.0 variant, conflicting with upstream's line 20 on 1.1: a conflict for a person, its
    # context still in loader.py, so no other file is searched
    builder.add(
        "vllm",
        "clash",
        variants={"1.0": builder.variant(v10, {"vllm/loader.py": loader_with({19: "our nineteen\n", 20: "our twenty!\n"})})},
    )
    # its variants are a script's output: refreshed, but never written by rebase
    builder.add(
        "vllm",
        "made",
        extra_meta={"generated_by": {"generator": "scripts/gen.py", "sources": ["k.py"]}},
        variants={"1.0": builder.variant(v10, {"vllm/loader.py": loader_with({30: "thirty made\n"})})},
    )
    builder.add(
        "vllm",
        "moved",
        variants={"1.0": builder.variant(v10, {"vllm/server.py": SERVER.replace("'triton_mla_dense'", "'triton_mla_sparse'")})},
    )
    with IndexServer(files) as server:
        for version, tree in TREES.items():
            server.add("vllm", build_wheel(files, "vllm", version, tree))
        yield server, builder.root


def rebase(server, store, *args, expect):
    doc = run_json("rebase", "vllm", *args, "--no-write", "--index-url", server.url, "--store", str(store), expect=expect)
    return {i["name"]: i for i in doc["items"]}


def test_a_variant_the_new_version_already_gets_is_unchanged_not_replayed(index, fresh_cache, monkeypatch):
    server, store = index
    spy = Spy(monkeypatch)
    items = rebase(server, store, "--onto", "1.1", "--from", "1.0", expect=1)
    assert {n: i["classification"] for n, i in items.items()} == {
        "rewritten": "unchanged",
        "dependent": "unchanged",
        "clash": "conflict",
        "made": "unchanged",
        "moved": "unchanged",
    }
    rewritten = items["rewritten"]
    assert rewritten["old_variant"] == rewritten["new_variant"] == "1.1.patch"
    assert "1.0.patch is not replayed" in rewritten["reason"]
    # its dependant is carried on top of it (it used to be blocked: "depends on ..., which did not carry over")
    assert items["dependent"]["old_variant"] == "1.0.patch"
    # a conflict whose context is still in its file searches nowhere else: nothing listed or downloaded
    assert items["clash"]["relocations"] == [] and "vllm/loader.py" in items["clash"]["reason"]
    # (these small wheels are fetched whole, cheaper than range reads: only they are, once each)
    assert (spy.listings, spy.tar_opens) == (0, 0)
    assert sorted(s.artifact.filename for s in spy.sources) == ["vllm-1.0-py3-none-any.whl", "vllm-1.1-py3-none-any.whl"]
    assert set(spy.downloads) <= {s.artifact.filename for s in spy.sources}

    # warm: nothing is fetched again
    cold = spy.bytes_fetched
    spy.sources.clear()
    rebase(server, store, "--onto", "1.1", "--from", "1.0", expect=1)
    assert cold > 0 and spy.bytes_fetched == 0 and spy.listings == 0


def test_a_newer_variant_with_moved_lines_is_refreshed_from_itself(index, fresh_cache, tmp_path):
    server, store = index
    doc = run_json("rebase", "vllm", "--onto", "1.2", "--from", "1.0", "--index-url", server.url, "--store", str(store), expect=1)
    rewritten = next(i for i in doc["items"] if i["name"] == "rewritten")
    assert rewritten["classification"] == "refreshed" and rewritten["old_variant"] == "1.1.patch"
    assert "applies with moved lines" in rewritten["reason"]
    written = (store / "vllm/rewritten/1.2.patch").read_bytes()
    # the person's 1.1 change, one line lower: not the 1.0 change replayed
    assert b"+our twenty, as on 1.1" in written and b"@@ -18," in written and b"+our twenty\n" not in written
    made = next(i for i in doc["items"] if i["name"] == "made")
    assert made["classification"] == "refreshed" and "scripts/gen.py makes this patch's variants" in made["reason"]
    assert not (store / "vllm/made/1.2.patch").exists()
    check = run_json("check", "vllm@1.2", "--index-url", server.url, "--store", str(store), expect=1)
    assert next(o for o in check["patches"] if o["name"] == "rewritten")["outcome"] == "clean"


def test_relocation_reads_outward_from_the_lost_file_and_stops_where_it_found_a_home(index, fresh_cache, monkeypatch):
    server, store = index
    spy = Spy(monkeypatch)
    items = rebase(server, store, "--onto", "1.3", "--from", "1.0", expect=1)
    moved = items["moved"]
    assert moved["classification"] == "obsolete" and "vllm/server.py" in moved["reason"]
    (proposal,) = moved["relocations"]
    assert proposal["to"] == "vllm/groups/overrides.py" and proposal["from"] == "vllm/server.py#1"
    assert "+        return 'triton_mla_sparse'" in proposal["diff"] and proposal["reindent"] == 4
    # the 1.3 wheel's central directory and sparse member reads: never the whole wheel (1.0's is small
    # and fetched whole, cheaper than range reads)
    assert spy.listings == 1 and "vllm-1.3-py3-none-any.whl" not in spy.downloads
    assert next(s for s in spy.sources if s.artifact.filename == "vllm-1.3-py3-none-any.whl").sparse
    assert "vllm/groups/overrides.py" in spy.prefetched and "vllm/a/b/c/far.py" not in spy.prefetched


@pytest.fixture
def ranged(tmp_path, builder):
    """Patches whose applies_to ends before 1.1: one upstreamed there, one that still carries, one
    that would conflict, and one that depends on the second."""
    files = tmp_path / "files"
    files.mkdir()
    v10 = TREES["1.0"]
    utils = PRISTINE["vllm/utils.py"]
    builder.add(
        "vllm",
        "fixed-upstream",
        applies_to="<1.1",
        extra_meta={"upstreamed_in": ">=1.1"},
        variants={"1.0": builder.variant(v10, {"vllm/utils.py": utils.replace("return 1", "return 10")})},
    )
    builder.add(
        "vllm",
        "ends",
        applies_to=">=1.0,<1.1",
        variants={"1.0": builder.variant(v10, {"vllm/utils.py": utils.replace("return 2", "return 20")})},
    )
    builder.add(
        "vllm",
        "ends-clash",
        applies_to="<1.1",
        variants={"1.0": builder.variant(v10, {"vllm/loader.py": loader_with({20: "our twenty\n"})})},
    )
    builder.add(
        "vllm",
        "on-top",
        depends_on=("ends",),
        variants={"1.0": builder.variant(v10, {"vllm/loader.py": loader_with({5: "our five\n"})})},
    )
    # its context takes in upstream's line 20: a refresh, were it written
    builder.add(
        "vllm",
        "ends-near",
        applies_to="<1.1",
        variants={"1.0": builder.variant(v10, {"vllm/loader.py": loader_with({23: "our twenty-three\n"})})},
    )
    with IndexServer(files) as server:
        for version in ("1.0", "1.1"):
            server.add("vllm", build_wheel(files, "vllm", version, TREES[version]))
        yield server, builder.root


def test_patches_without_a_variant_for_the_new_version_are_classified_as_check_says(ranged, fresh_cache):
    server, store = ranged
    items = rebase(server, store, "--onto", "1.1", "--from", "1.0", expect=0)
    check = run_json("check", "vllm@1.1", "--index-url", server.url, "--store", str(store), expect=0)
    assert {n: i["classification"] for n, i in items.items()} == {
        "fixed-upstream": "upstreamed",
        "ends": "obsolete",
        "ends-clash": "obsolete",
        "on-top": "obsolete",
        "ends-near": "obsolete",
    }
    assert "which is obsolete on 1.1" in items["on-top"]["reason"]
    assert {o["name"]: o["outcome"] for o in check["patches"]} == {n: i["classification"] for n, i in items.items()}


def test_past_applies_to_shows_whether_the_code_would_carry_and_writes_nothing(ranged, fresh_cache):
    server, store = ranged
    doc = run_json(
        "rebase",
        "vllm",
        "--onto",
        "1.1",
        "--from",
        "1.0",
        "--past-applies-to",
        "--index-url",
        server.url,
        "--store",
        str(store),
        expect=1,
    )
    items = {i["name"]: i for i in doc["items"]}
    assert {n: i["classification"] for n, i in items.items()} == {
        "fixed-upstream": "upstreamed",
        "ends": "unchanged",
        "ends-clash": "conflict",
        "on-top": "unchanged",
        "ends-near": "refreshed",
    }
    assert items["ends-near"]["reason"].startswith("1.1 is outside applies_to <1.1; as if it were not: would write")
    assert items["ends"]["outside_applies_to"] == "<1.1,>=1.0" and "outside applies_to" in items["ends"]["reason"]
    assert items["on-top"]["outside_applies_to"] is None and items["fixed-upstream"]["outside_applies_to"] is None
    assert not list(store.rglob("1.1.patch"))  # nothing is written for a patch outside its range


def test_only_hunks_that_lost_their_place_are_searched_for(builder):
    text = "".join(f"statement_number_{i} = compute({i})\n" for i in range(1, 31))
    lines = text.splitlines(keepends=True)
    ours = "".join(lines[:14] + ["statement_number_15 = compute(15) + ours\n"] + lines[15:])
    parsed = parse_variant(builder.variant({"vllm/x.py": text}, {"vllm/x.py": ours}), "test")
    beside = "".join(lines[:14] + ["statement_number_15 = upstream_rewrote_it()\n"] + lines[15:])
    # applies: not lost; conflicts with an upstream edit, its context still there: not lost
    assert relocate.lost_hunks(parsed, ["vllm/x.py"], lambda p: text) == []
    assert relocate.lost_hunks(parsed, ["vllm/x.py"], lambda p: beside) == []
    # the file is gone, or its context is no longer in it: lost
    assert [i for _, i, _ in relocate.lost_hunks(parsed, ["vllm/x.py"], lambda p: None)] == [1]
    assert len(relocate.lost_hunks(parsed, ["vllm/x.py"], lambda p: "x = 1\n" * 40)) == 1
    # a file not asked about is not looked at
    assert relocate.lost_hunks(parsed, ["vllm/y.py"], lambda p: None) == []


def test_candidate_rings_go_outward_from_the_lost_file():
    names = [
        "pkg/a/b/c.py",
        "pkg/a/b/d/e.py",
        "pkg/a/f.py",
        "pkg/g/h.py",
        "pkg/top.py",
        "pkg/v2/a/b/lost.py",
        "pkg/g/__init__.py",
    ]
    assert relocate.candidate_rings(names, ["pkg/a/b/lost.py"]) == [
        ["pkg/v2/a/b/lost.py"],
        ["pkg/a/b/c.py"],
        ["pkg/a/b/d/e.py", "pkg/a/f.py"],
        ["pkg/top.py"],
        ["pkg/g/__init__.py", "pkg/g/h.py"],
    ]
    # __init__.py is everywhere: it is no hint where a module went
    assert relocate.candidate_rings(["pkg/x/__init__.py"], ["pkg/a/__init__.py"]) == [["pkg/x/__init__.py"]]


@pytest.mark.network
def test_vllm_020_to_023_recognises_triton_sparse_mla_023_and_fetches_no_sdist(tmp_path, monkeypatch):
    """The regression on the real releases and the bundled patch set (read only: --no-write)."""
    spy = Spy(monkeypatch)
    args = ("rebase", "vllm", "--onto", "0.23.0", "--from", "0.20.0", "--no-write", "--store", str(REPO / "patches"))
    doc = run_json(*args, "--workdir", str(tmp_path / "w1"))
    items = {i["name"]: i for i in doc["items"]}
    triton = items["triton-sparse-mla"]
    assert triton["classification"] == "unchanged", triton
    assert triton["old_variant"] == triton["new_variant"] == "0.23.0.patch"
    # the patch that depends on it is carried on top of it, not blocked
    assert items["dsa-indexer-fallback"]["classification"] != "conflict", items["dsa-indexer-fallback"]
    # no hunk lost its place: no listing of the package, no sdist, no archive unpacked
    assert (spy.listings, spy.downloads, spy.tar_opens) == (0, [], 0)
    assert all(s.artifact.kind == "wheel" for s in spy.sources)
    spy.sources.clear()
    run_json(*args, "--workdir", str(tmp_path / "w2"))
    assert spy.bytes_fetched == 0 and spy.downloads == []


def test_resolve_refuses_a_generated_patch(builder, tmp_path):
    """A person's resolution of a generated patch belongs in its recipe: resolve writes no variant."""
    builder.add(
        "vllm",
        "made",
        extra_meta={"generated_by": {"generator": "scripts/gen.py", "sources": ["k.py"]}},
        variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({30: "thirty made\n"})})},
    )
    (tmp_path / "work" / "conflicts" / "made").mkdir(parents=True)
    before = sorted(p.name for p in (builder.root / "vllm" / "made").iterdir())
    doc = run_json(
        "resolve", "vllm", str(tmp_path / "work"), "--patch", "made", "--onto", "1.1", "--store", str(builder.root), expect=2
    )
    assert "made by scripts/gen.py" in doc["error"]["message"]
    assert sorted(p.name for p in (builder.root / "vllm" / "made").iterdir()) == before
