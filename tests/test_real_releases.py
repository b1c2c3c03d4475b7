"""Against the real releases on the configured package index (downloaded once per cache): the tests
marked `network`. The releases iterated are the committed compat_matrix.yaml's rows (support.releases)."""

import pytest
from packaging.version import Version
from support.builders import write_tree
from support.invoke import run_json
from support.releases import committed_releases

from patchctl.core.engines import get_engine
from patchctl.sources.fetch import SourceContext, release
from patchctl.store.layered import Store

GGUF = "vllm/model_executor/model_loader/gguf_loader.py"
SERVER_ARGS = "sglang/srt/server_args.py"


cli = run_json


def pristine(engine: str, version: str, path: str) -> str:
    return release(get_engine(engine), Version(version), SourceContext()).read(path).decode()


def one_line_change(text: str, anchor: str, added: str) -> str:
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if anchor in line)
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    lines.insert(at, f"{indent}{added}\n")
    return "".join(lines)


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    """A test-only series made from the real 0.20.0 gguf_loader.py and sglang 0.5.9 server_args.py."""
    from support.builders import StoreBuilder

    builder = StoreBuilder(tmp_path_factory.mktemp("real") / "store")
    base = pristine("vllm", "0.20.0", GGUF)
    changed = one_line_change(base, "def _get_gguf_weights_map", "# patchctl test marker")
    builder.add("vllm", "marker", applies_to=">=0.20", variants={"0.20.0": builder.variant({GGUF: base}, {GGUF: changed})})
    sbase = pristine("sglang", "0.5.9", SERVER_ARGS)
    schanged = one_line_change(sbase, "def _set_default_nsa_backends", "# patchctl test marker")
    builder.add("sglang", "marker", variants={"0.5.9": builder.variant({SERVER_ARGS: sbase}, {SERVER_ARGS: schanged})})
    return builder.root


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.20.0", "0.23.0"])
def test_check_real_vllm(tiny_store, version):
    doc = cli("check", f"vllm@{version}", "--store", str(tiny_store), expect=0)
    (patch,) = doc["patches"]
    assert patch["outcome"] in ("clean", "offset")
    assert doc["source"]["sha256"] and doc["source"]["kind"] in ("wheel", "sdist")


@pytest.mark.network
def test_check_real_sglang(tiny_store):
    doc = cli("check", "sglang@0.5.9", "--store", str(tiny_store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"


@pytest.mark.network
def test_vllm_24_moves_gguf_to_the_plugin(tiny_store):
    doc = cli("check", "vllm@0.24.0", "--store", str(tiny_store))
    assert any("vllm-gguf-plugin" in w for w in doc["warnings"])
    assert doc["patches"][0]["outcome"] == "obsolete"  # gguf_loader.py is gone from the tree


@pytest.mark.network
def test_export_apply_revert_byte_exact_on_real_files(tiny_store, tmp_path):
    doc = cli("export", "vllm@0.23.0", str(tmp_path / "overlay"), "--store", str(tiny_store), expect=0)
    assert doc["written"] == [GGUF]
    assert "# patchctl test marker" in (tmp_path / "overlay" / GGUF).read_text()
    original = pristine("vllm", "0.23.0", GGUF)
    tree = write_tree(tmp_path / "tree", {GGUF: original, "vllm/__init__.py": ""})
    cli("apply", "vllm@0.23.0", "--target", str(tree), "--store", str(tiny_store), expect=0)
    assert (tree / GGUF).read_text() != original
    cli("revert", "vllm@0.23.0", "--target", str(tree), expect=0)
    assert (tree / GGUF).read_text() == original


@pytest.mark.network
def test_real_store_lints_and_checks_its_newest_claimed_version():
    store = Store.open()
    assert cli("lint", expect=0)["problems"] == []
    for engine in store.engines():
        patches = store.series(engine).patches
        if not patches:
            continue
        newest = max(v.base for p in patches for v in p.variants)
        doc = cli("check", f"{engine}@{newest}")
        bad = [p for p in doc["patches"] if p["outcome"] == "conflict"]
        assert not bad, bad


def _committed_matrix():
    import yaml

    from patchctl.store.layered import default_store_dir

    path = default_store_dir().parent / "compat_matrix.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def check_committed_releases(store: Store, ctx: SourceContext) -> dict:
    """`patchctl matrix` (check only, no nightly) on the committed matrix's rows, each engine's own,
    and only those: a release the index lists beyond them is left to the nightly."""
    from patchctl.matrix import build as matrix

    committed = committed_releases()
    docs = [
        matrix.build(store, ctx, engines=[engine], nightly=False, only_versions={str(v) for e, v in committed if e == engine})
        for engine in dict.fromkeys(e for e, _ in committed)
    ]
    doc = matrix.merge(docs)
    # Every committed row was checked: a release the index no longer lists is not silently skipped.
    checked = sorted((e, Version(v)) for e, d in doc["engines"].items() for v in d["versions"])
    assert checked == sorted(committed), sorted(set(committed) ^ set(checked))
    return doc


@pytest.mark.network
def test_every_claimed_release_applies_or_is_classified():
    """Every patch against every real release the matrix covers: no conflicts anywhere. The
    releases are the committed matrix's rows (support.releases), not the index's newest: a new
    upstream release is checked by the nightly, and here from the pull request that carries it."""
    from patchctl.sources import fetch

    store = Store.open()
    doc = check_committed_releases(store, fetch.SourceContext())
    conflicts = [
        (e, v, p)
        for e, d in doc["engines"].items()
        for v, r in d["versions"].items()
        for p, c in r["patches"].items()
        if c["outcome"] == "conflict"
    ]
    errors = [(e, v, r["error"]) for e, d in doc["engines"].items() for v, r in d["versions"].items() if r.get("error")]
    assert not conflicts and not errors, (conflicts, errors)
    for engine, data in doc["engines"].items():
        for version, row in data["versions"].items():
            for patch in store.series(engine).patches:
                if not patch.in_range(Version(version)):
                    expected = "upstreamed" if patch.upstreamed_at(Version(version)) else "obsolete"
                    assert row["patches"][patch.name]["outcome"] == expected, (engine, version, patch.name)


@pytest.mark.network
def test_committed_matrix_matches_a_regenerated_slice():
    """compat_matrix.yaml is the tool's output, never hand-edited: regenerate the newest and the
    oldest release of each engine and compare outcomes and variants."""
    from patchctl.matrix import build as matrix
    from patchctl.sources import fetch

    committed = _committed_matrix()
    if committed is None:
        pytest.skip("no compat_matrix.yaml committed yet")
    store = Store.open()
    for engine, data in committed["engines"].items():
        versions = [v for v in data["versions"] if v != "nightly"]
        for version in {versions[0], versions[-1]}:
            fresh = matrix.check_one(engine, Version(version), store, fetch.SourceContext())
            strip = lambda row: {p: (c["outcome"], c["variant"]) for p, c in row["patches"].items()}  # noqa: E731
            assert strip(fresh) == strip(data["versions"][version]), (engine, version)
            assert fresh["sha256"] == data["versions"][version]["sha256"]


def test_the_releases_checked_are_the_committed_rows_whatever_the_index_lists(tmp_path, monkeypatch, fresh_cache):
    """An index listing every committed release and a newer one of each engine: exactly the committed
    rows are checked (check_one stubbed: which rows, not their outcome, is the question here)."""
    from support.builders import build_wheel
    from support.index_server import IndexServer

    from patchctl.matrix import build as matrix

    store = Store.open()
    committed = committed_releases()
    files = tmp_path / "files"
    checked = []
    monkeypatch.setattr(
        matrix, "check_one", lambda engine, version, *a, **k: checked.append((engine, version)) or {"patches": {}}
    )
    with IndexServer(files) as server:
        for engine, version in [*committed, *((e, Version("999.0")) for e in store.engines())]:
            eng = get_engine(engine)
            server.add(eng.dist, build_wheel(files, eng.dist, str(version), {f"{eng.packages[0]}/__init__.py": ""}))
        check_committed_releases(store, SourceContext(index_url=server.url))
    assert sorted(checked) == sorted(committed) and len(committed) >= 30
