"""ensure is idempotent on every release the bundled series claims: a tree holding the release's own
files (those the patches touch, read from the real artifact on the package index), patched once by
`apply`, then `ensure` and `apply` again and again — nothing is ever written twice. This is where the
SGLang finding lived (every 0.5.4-0.5.16 tree gained a second guard block on each ensure)."""
from __future__ import annotations

import pytest
from support.builders import install_fake_dist
from support.invoke import run_json

pytestmark = pytest.mark.network


def releases():
    from patchctl.matrix.build import versions_for
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.series import Store

    store, ctx = Store.open(), SourceContext()
    return [(engine, str(v)) for engine in store.engines() for v in versions_for(engine, store, ctx)]


def test_ensure_writes_nothing_on_an_intact_tree_for_every_claimed_release(tmp_path):
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.patching.evaluate import evaluate
    from patchctl.sources.fetch import SourceContext, release
    from patchctl.store.series import Store

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
