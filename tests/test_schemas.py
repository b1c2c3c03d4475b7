"""The schemas in patchctl/core/schemas/ cross-checked with the jsonschema package: each is a valid Draft 7
schema that fastjsonschema compiles, every committed document validates, and both validators give the
same verdict on damaged documents (fastjsonschema compiles to code of its own, so its reading of a
keyword could differ)."""

from __future__ import annotations

import json
from pathlib import Path

import fastjsonschema
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from patchctl.core.schemas import problem, schema
from patchctl.core.yamlio import load_yaml

REPO = Path(__file__).resolve().parent.parent
SCHEMAS = sorted(p.stem for p in (REPO / "patchctl" / "core" / "schemas").glob("*.json"))
COMMITTED = (
    [("series", p) for p in sorted((REPO / "patches").glob("*/series.yaml"))]
    + [("patch", p) for p in sorted((REPO / "patches").glob("*/*/patch.yaml"))]
    + [("matrix", REPO / "compat_matrix.yaml")]
)


def test_the_documents_patchctl_reads_have_schemas():
    assert {"series", "patch", "index-cache", "pep691", "matrix", "config"} <= set(SCHEMAS)


@pytest.mark.parametrize("name", SCHEMAS)
def test_each_schema_is_a_valid_draft7_schema(name):
    doc = json.loads((REPO / "patchctl" / "core" / "schemas" / f"{name}.json").read_text(encoding="utf-8"))
    assert doc.get("$schema") == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(doc)
    fastjsonschema.compile(doc)
    assert schema(name) == doc  # what patchctl loads is the file (package data)


@pytest.mark.parametrize("name,path", COMMITTED, ids=[str(p.relative_to(REPO)) for _, p in COMMITTED])
def test_every_committed_document_validates_with_both_validators(name, path):
    doc = load_yaml(path.read_text(encoding="utf-8"))
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in jsonschema.Draft7Validator(schema(name)).iter_errors(doc)
    ]
    assert errors == []
    assert problem(name, doc) is None


def test_committed_documents_cover_every_patch():
    assert len([c for c in COMMITTED if c[0] == "patch"]) == len(list((REPO / "patches").glob("*/*/patch.yaml"))) > 0


# The same verdict from both validators ------------------------------------------------------------

VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "x", "upstreamed", "vllm>=0.24", "a" * 64, "1.0.patch", "cpu", "git", "clean", "../x"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["", "name", "x", "files"]), inner, max_size=3),
    max_leaves=5,
)


def _valid_examples() -> dict[str, list]:
    return {
        "series": [load_yaml(p.read_text()) for n, p in COMMITTED if n == "series"],
        "patch": [load_yaml(p.read_text()) for n, p in COMMITTED if n == "patch"],
        "matrix": [
            {
                "schema": "patchctl-matrix/1",
                "engines": {
                    "vllm": {
                        "patches": ["p"],
                        "evidence": {"p": {"proven": ["x"], "not_proven": []}},
                        "nightly": "not run: x",
                        "versions": {
                            "1.0": {
                                "version": "1.0",
                                "artifact": "a.whl",
                                "sha256": "a" * 64,
                                "bytes_fetched": 3,
                                "seconds": 0.5,
                                "patches": {
                                    "p": {"outcome": "clean", "variant": "1.0.patch", "evidence": "applies (smoke not run)"}
                                },
                            },
                            "1.1": {"version": "1.1", "error": "gone", "patches": {}},
                        },
                    }
                },
            }
        ],
        "index-cache": [{"name": "vllm", "fetched_at": 1, "files": [["vllm-1.0.tar.gz", "http://x/v.tar.gz", None, 3, False]]}],
        "pep691": [
            {
                "meta": {"api-version": "1.0"},
                "name": "vllm",
                "files": [
                    {
                        "filename": "vllm-1.0.tar.gz",
                        "url": "/v.tar.gz",
                        "hashes": {"sha256": "a" * 64},
                        "size": 3,
                        "yanked": "bad",
                    }
                ],
            }
        ],
        "config": [{"index_url": "https://m/simple", "nightly": {"vllm": {"url": "https://n", "kind": "wheel-index"}}}],
    }


VALID = _valid_examples()


def _paths(doc, prefix: tuple = ()):
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, prefix + (index,))


@st.composite
def mutated(draw):
    import copy

    name = draw(st.sampled_from(sorted(VALID)))
    doc = copy.deepcopy(draw(st.sampled_from(VALID[name])))
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from(list(_paths(doc))))
        if not path:
            doc = draw(VALUES)
            continue
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(VALUES)
    return name, doc


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fastjsonschema_and_jsonschema_agree(case):
    name, doc = case
    expected = jsonschema.Draft7Validator(schema(name)).is_valid(doc)
    assert (problem(name, doc) is None) == expected, (name, doc)


# The validators generated into the package ---------------------------------------------------------


@pytest.mark.parametrize("name", SCHEMAS)
def test_the_generated_validator_is_the_schemas_own(name):
    """scripts/compile_schemas.py was run after the last schema edit (else patchctl compiles in memory)."""
    from patchctl.core.schemas import generated_module, module_name

    generated = REPO / "patchctl" / "core" / "schemas" / "compiled" / f"{module_name(name)}.py"
    assert generated.read_text(encoding="utf-8") == generated_module(name), "run scripts/compile_schemas.py"


def test_no_validator_code_is_read_from_the_cache(fresh_cache):
    """Code planted in the cache as an older patchctl kept its compiled validators there
    (<cache>/validators/<name>-<key>.marshal, framed with their own sha256) is never executed."""
    import hashlib
    import marshal
    import subprocess
    import sys

    from patchctl.sources.cache import framed

    marker = fresh_cache / "ran"
    planted = compile(f"open({str(marker)!r}, 'w').close()\ndef validate(data):\n    return data\n", "<planted>", "exec")
    for name in SCHEMAS:
        raw = (REPO / "patchctl" / "core" / "schemas" / f"{name}.json").read_bytes()
        key = hashlib.sha256(b"\0".join((raw, fastjsonschema.VERSION.encode(), sys.version.encode()))).hexdigest()[:16]
        planted_file = fresh_cache / "validators" / f"{name}-{key}.marshal"
        planted_file.parent.mkdir(parents=True, exist_ok=True)
        planted_file.write_bytes(framed(marshal.dumps(planted)))  # as older patchctl framed them
    code = (
        "import sys; from patchctl.core.schemas import problem; "
        "print(problem('series', {'engine': 'vllm'}) is not None); "
        "print(any(m == 'patchctl.core.config' for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=fresh_cache.parent
    ).stdout.split()  # (not the checkout: PYTHONPATH names the tree)
    assert not marker.exists()  # the planted code did not run
    assert out == ["True", "False"]  # the schema check is on, and config was not imported (no cycle)


def test_a_stale_generated_validator_is_not_used(monkeypatch):
    import patchctl.core.schemas as schemas

    schemas._validator.cache_clear()
    monkeypatch.setattr(hashlib_module(), "sha256", _always("0" * 64))
    try:
        assert schemas.problem("series", {"engine": 1}) is not None  # compiled in memory, still checks
    finally:
        schemas._validator.cache_clear()


def hashlib_module():
    import patchctl.core.schemas as schemas

    return schemas.hashlib


class _always:
    def __init__(self, digest: str) -> None:
        self.digest = digest

    def __call__(self, *_args: object) -> _always:
        return self

    def hexdigest(self) -> str:
        return self.digest
