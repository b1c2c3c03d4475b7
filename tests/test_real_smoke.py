"""The shipped patches' own smoke checks, run by `patchctl smoke` against the real releases
(every variant's base version: the versions each variant was written for), in the profile
environments. Slow: builds the CPU torch environments once and extracts each release."""

import json

import pytest
from click.testing import CliRunner

from patchctl.cli.main import main
from patchctl.store.layered import Store

pytestmark = [pytest.mark.network, pytest.mark.slow]


def cases(store: Store | None = None) -> list[tuple[str, str]]:
    """(engine, version): every base of a variant of a patch with checks, where the patch applies.
    ci/smoke_cases.py picks among these the ones a change touches (CI's smoke job), by their ids."""
    store = store or Store.open()
    found = set()
    for engine in store.engines():
        for patch in store.series(engine).patches:
            if (patch.directory / "checks").is_dir():
                found.update((engine, str(v.base)) for v in patch.variants if patch.in_range(v.base))
    return sorted(found)


def case_id(engine: str, version: str) -> str:
    return f"{engine}-{version}"


@pytest.mark.parametrize("engine,version", [pytest.param(e, v, id=case_id(e, v)) for e, v in cases()])
def test_patch_checks_pass_on_the_release(engine, version):
    result = CliRunner().invoke(main, ["smoke", f"{engine}@{version}", "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert doc["error"] is None, doc["error"]
    bad = [r for r in doc["results"] if r["status"] in ("failed", "error")]
    assert not bad, bad
    for r in doc["results"]:
        assert r["status"] == "passed" or r["reason"], r  # anything not passed says why
