"""ensure is idempotent on every release the bundled series claims: a tree holding the release's own
files (those the patches touch, read from the real artifact on the package index), patched once by
`apply`, then `ensure` and `apply` again and again — nothing is ever written twice. This is where the
SGLang finding lived (every 0.5.4-0.5.16 tree gained a second guard block on each ensure).

The releases are the committed compat_matrix.yaml's rows, not the index's listing: a new upstream
release reaches this test through the nightly's pull request, never by itself."""

from __future__ import annotations

import pytest
import yaml
from support.builders import build_wheel, install_fake_dist
from support.index_server import IndexServer
from support.invoke import run_json
from support.releases import MATRIX, committed_releases


def releases() -> list[tuple[str, str]]:
    return [(engine, str(version)) for engine, version in committed_releases()]


def test_the_releases_are_the_committed_matrix_rows_whatever_the_index_lists(tmp_path, monkeypatch, fresh_cache):
    """An index that lists a newer release of every engine (as vLLM 0.34.0 appeared on 2026-12-02)
    changes nothing: the list is the matrix's rows, read here with a plain YAML reader."""
    from patchctl.core.engines import get_engine
    from patchctl.store.layered import Store

    files = tmp_path / "files"
    with IndexServer(files) as server:
        for engine in Store.open().engines():
            eng = get_engine(engine)
            server.add(eng.dist, build_wheel(files, eng.dist, "999.0", {f"{eng.packages[0]}/__init__.py": ""}))
        monkeypatch.setenv("PIP_INDEX_URL", server.url)
        listed = releases()
    rows = yaml.safe_load(MATRIX.read_text())["engines"]
    assert sorted(listed) == sorted((e, v) for e, data in rows.items() for v in data["versions"] if v != "nightly")
    assert not any(v == "999.0" for _, v in listed)
    assert {e for e, _ in listed} == set(Store.open().engines())


@pytest.mark.network
def test_ensure_writes_nothing_on_an_intact_tree_for_every_claimed_release(tmp_path):
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.patching.evaluate import evaluate
    from patchctl.sources.fetch import SourceContext, release
    from patchctl.store.layered import Store

    store, ctx = Store.open(), SourceContext()
    checked = []
    for engine, version in releases():
        eng = get_engine(engine)
        source = release(eng, Version(version), ctx)
        result = evaluate(store.series(engine).patches, Version(version), source)
        if not result.changes:
            continue  # nothing of the series applies here: no tree to keep intact
        site = tmp_path / f"{engine}-{version}"
        pristine = {c.path: c.before for c in result.changes if c.before is not None}
        install_fake_dist(site, eng.dist, version, {**pristine, f"{eng.packages[0]}/__init__.py": b""})
        run_json("apply", engine, "--target", str(site), expect=0)
        applied = {c.path: (site / c.path).read_bytes() for c in result.changes if c.after is not None}
        assert applied == {c.path: c.after for c in result.changes if c.after is not None}, (engine, version)
        for _ in range(2):
            doc = run_json("ensure", engine, "--target", str(site), expect=0)
            assert doc["written"] == [], (engine, version, doc)
            again = run_json("apply", engine, "--target", str(site), expect=0)  # the evaluating path
            assert again["written"] == [], (engine, version, again["patches"])
        assert {p: (site / p).read_bytes() for p in applied} == applied, (engine, version)
        checked.append(f"{engine}@{version}")
    engines = {c.split("@")[0] for c in checked}
    assert {"vllm", "sglang", "vllm-gguf-plugin"} <= engines, checked
    assert len(checked) >= 30, checked
