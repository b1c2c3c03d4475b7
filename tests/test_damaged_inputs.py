"""No traceback for any input ("Trustworthy writes"): every document patchctl reads — the store's
series.yaml and patch.yaml, the index page cache, a wheel's cached central directory, an index's PEP
691 response, a matrix, the config file — either reads, or fails with a PatchctlError (a message and a
documented exit code), whatever damage it took.

Property tests start from a valid document and damage it at random (truncated at a byte, bytes
flipped or replaced, a value replaced by a JSON value of another type, a key deleted), then read it
through the real code path. Regression tests replay each input that escaped as a traceback, through
the CLI, and check the exit code and that the message names the file.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json

from checklib.testserver import Reply, TestServer
from patchctl.core.errors import EnvironmentProblem, PatchctlError

REPO = Path(__file__).resolve().parent.parent
PROPERTY = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


# Damage ---------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "other")


def _paths(doc, prefix: tuple = ()):
    """Every value's address in a document: () for the whole, then keys and indices."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, prefix + (index,))


def _at(doc, path: tuple):
    for step in path:
        doc = doc[step]
    return doc


def dump_yaml(doc) -> bytes:
    from patchctl.core.yamlio import dump_yaml as dump  # libyaml's emitter where installed: fast

    return dump(doc, sort_keys=False, allow_unicode=True).encode()


def dump_json(doc) -> bytes:
    return json.dumps(doc).encode()


BYTE_DAMAGE = ("truncate", "flip", "replace-bytes")


@st.composite
def damaged_bytes(draw, raw: bytes, how: str | None = None):
    """`raw` damaged at the byte level: cut short, bits flipped, or a few bytes replaced."""
    how = how or draw(st.sampled_from(BYTE_DAMAGE))
    if how == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how == "flip":
        out = bytearray(raw)
        for _ in range(draw(st.integers(1, 4))):
            out[draw(st.integers(0, len(out) - 1))] ^= draw(st.integers(1, 255))
        return bytes(out)
    start = draw(st.integers(0, len(raw)))
    end = draw(st.integers(start, min(len(raw), start + 8)))
    return raw[:start] + draw(st.binary(max_size=8)) + raw[end:]


# What a hostile writer puts where a value goes: numbers no reader can take (NaN, inf, 1e400, past
# 64 bits), a NUL byte in a string, and nesting deep enough to exhaust json's and YAML's recursion
# (and, at 100,000 levels, libyaml's C stack).
HOSTILE_JSON = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", '"a\\u0000b"', "9" * 30, "-" + "9" * 25)
HOSTILE_YAML = (".nan", ".inf", "-.inf", "1.0e+400", '"a\\0b"', "9" * 30, "-" + "9" * 25)
DEPTHS = (65, 200, 1_000, 5_000, 20_000, 100_000)
_MARKER = "HOSTILEVALUE"


@st.composite
def hostile(draw, doc, dump):
    """`doc` serialized by `dump` with one value (or the whole) replaced by a hostile one, as text."""
    doc = copy.deepcopy(doc)
    path = draw(st.sampled_from(list(_paths(doc))))
    if path:
        _at(doc, path[:-1])[path[-1]] = _MARKER
    else:
        doc = _MARKER
    as_json = dump is dump_json
    depth = draw(st.sampled_from((None, *DEPTHS)))
    if depth is None:
        value = draw(st.sampled_from(HOSTILE_JSON if as_json else HOSTILE_YAML))
    else:
        value = draw(st.sampled_from(("[" * depth + "]" * depth, ('{"a": ' if as_json else "{a: ") * depth + "1" + "}" * depth)))
    return dump(doc).decode().replace(f'"{_MARKER}"' if as_json else _MARKER, value, 1).encode()


@st.composite
def damaged(draw, doc, dump):
    """`doc` serialized by `dump`, then damaged one way."""
    raw = dump(doc)
    how = draw(st.sampled_from([*BYTE_DAMAGE, "retype", "delete-key", "hostile"]))
    if how == "hostile":
        return draw(hostile(doc, dump))
    if how in BYTE_DAMAGE:
        return draw(damaged_bytes(raw, how))
    doc = copy.deepcopy(doc)
    if how == "retype":
        path = draw(st.sampled_from(list(_paths(doc))))
        old = _at(doc, path)
        new = draw(JSON_VALUES.filter(lambda v: _kind(v) != _kind(old)))
        if not path:
            return dump(new)
        _at(doc, path[:-1])[path[-1]] = new
        return dump(doc)
    keyed = [p for p in _paths(doc) if p and isinstance(_at(doc, p[:-1]), dict)]
    if not keyed:
        return raw
    path = draw(st.sampled_from(keyed))
    del _at(doc, path[:-1])[path[-1]]
    return dump(doc)


def reads_or_says_why(read, *args, **kwargs) -> None:
    """The promise: `read(*args, **kwargs)` succeeds, or fails with a PatchctlError that has a message."""
    try:
        read(*args, **kwargs)
    except PatchctlError as exc:
        assert exc.message and exc.exit_code in (1, 2, 3)


# Fixtures ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_copy(tmp_path_factory):
    """The committed store, copied: its real series.yaml and patch.yaml files are the valid start."""
    root = tmp_path_factory.mktemp("store") / "patches"
    shutil.copytree(REPO / "patches", root, ignore=shutil.ignore_patterns("checks", "src", "__pycache__", "checklib"))
    return root


@pytest.fixture
def store(builder):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    return builder.root


@pytest.fixture
def index(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    with IndexServer(files) as server:
        # Incompressible filler: range reads must be cheaper than one GET of the wheel, so that its
        # central directory is read and cached.
        filler = {f"vllm/filler/blob{i}.bin": random.Random(i).randbytes(150_000) for i in range(40)}
        server.add("vllm", build_wheel(files, "vllm", "1.0", dict(PRISTINE, **filler)))
        yield server


class Page:
    """An index that answers every project page with the body it is given (for wrong shapes)."""

    def __init__(self):
        self.body = b""
        self.ctype = "application/vnd.pypi.simple.v1+json"
        self.server = TestServer([lambda request: Reply(200, self.body, {"Content-Type": self.ctype})], protocol="HTTP/1.0")

    @property
    def url(self) -> str:
        return f"{self.server.root}/simple"

    def __enter__(self) -> Page:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()


@pytest.fixture
def page():
    with Page() as served:
        yield served


def index_cache_file(cache: Path, url: str, name: str = "vllm") -> Path:
    from patchctl.sources.index import PackageIndex

    return PackageIndex(url, cache)._cache_file(name)


def new_process() -> None:
    """What a second `patchctl` process sees: no index client (and its pages) kept from the first."""
    from patchctl.sources import fetch

    fetch._index.cache_clear()


def artifact_dirs(cache: Path) -> list[Path]:
    return [p for p in (cache / "artifacts").iterdir() if p.is_dir()]


# Valid documents --------------------------------------------------------------------------------

WHEEL_SHA = "a" * 64
# (its url: a page's hashes and validators count only for the URL it was fetched from)
INDEX_CACHE = {
    "name": "vllm",
    "url": "http://127.0.0.1:9/simple/vllm/",
    "fetched_at": 1764547200,
    "files": [
        ["vllm-1.0-py3-none-any.whl", "http://127.0.0.1:9/files/vllm-1.0-py3-none-any.whl", WHEEL_SHA, 1295, False],
        ["vllm-1.1-cp38-abi3-manylinux1_x86_64.whl", "http://127.0.0.1:9/files/b.whl", "b" * 64, None, False],
        ["vllm-1.1.tar.gz", "http://127.0.0.1:9/files/vllm-1.1.tar.gz", "c" * 64, 47, True],
        ["vllm-1.2.tar.gz", "http://127.0.0.1:9/files/vllm-1.2.tar.gz", None, None, False],
    ],
}
PEP691 = {
    "meta": {"api-version": "1.0"},
    "name": "vllm",
    "files": [
        {
            "filename": "vllm-1.0-py3-none-any.whl",
            "url": "/files/vllm-1.0-py3-none-any.whl",
            "size": 1295,
            "hashes": {"sha256": WHEEL_SHA},
            "yanked": False,
            "requires-python": ">=3.9",
        },
        {
            "filename": "vllm-1.1.tar.gz",
            "url": "https://files.example/vllm-1.1.tar.gz",
            "hashes": {"sha256": "c" * 64},
            "yanked": "broken build",
        },
    ],
}
CONFIG = {
    "index_url": "https://mirror.example/simple",
    "nightly": {
        "vllm": {"url": "https://wheels.example/nightly"},
        "sglang": {"url": "https://git.example/sglang.git", "ref": "main", "kind": "git"},
        "vllm-gguf-plugin": {"kind": "none"},
    },
}


def small_matrix() -> dict:
    """The committed compat_matrix.yaml, two versions per engine plus a row that could not be evaluated."""
    return copy.deepcopy(_small_matrix())


@functools.lru_cache(maxsize=1)
def _small_matrix() -> dict:
    from patchctl.core.yamlio import load_yaml

    doc = load_yaml((REPO / "compat_matrix.yaml").read_text())
    for data in doc["engines"].values():
        data["versions"] = dict(list(data["versions"].items())[:2])
        for entry in data["evidence"].values():
            entry["proven"], entry["not_proven"] = entry["proven"][:1], entry["not_proven"][:1]
    doc["engines"]["vllm"]["versions"]["0.99.0"] = {"version": "0.99.0", "error": "not on the index", "patches": {}}
    return doc


# Property tests ---------------------------------------------------------------------------------

PATCH_FILES = sorted(str(p.relative_to(REPO / "patches")) for p in (REPO / "patches").glob("*/*/patch.yaml"))
SERIES_FILES = sorted(str(p.relative_to(REPO / "patches")) for p in (REPO / "patches").glob("*/series.yaml"))


def read_store(root: Path, engine: str) -> None:
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.store.layered import Store
    from patchctl.store.series import choose_variant, drop_rule_met

    for patch in Store.open(root).series(engine).patches:  # and what the commands then ask of it
        for version in ("0.0.1", "0.5.10", "0.20.0", "1.0"):
            choose_variant(patch, Version(version))
            drop_rule_met(patch, get_engine(engine).dist, Version(version))


@PROPERTY
@given(data=st.data())
def test_damaged_series_yaml_reads_or_is_a_store_error(store_copy, data):
    rel = data.draw(st.sampled_from(SERIES_FILES))
    original = (REPO / "patches" / rel).read_bytes()
    target = store_copy / rel
    try:
        target.write_bytes(data.draw(damaged(yaml.safe_load(original), dump_yaml)))
        reads_or_says_why(lambda: read_store(store_copy, rel.split("/")[0]))
    finally:
        target.write_bytes(original)


@PROPERTY
@given(data=st.data())
def test_damaged_patch_yaml_reads_or_is_a_store_error(store_copy, data):
    rel = data.draw(st.sampled_from(PATCH_FILES))
    original = (REPO / "patches" / rel).read_bytes()
    target = store_copy / rel
    try:
        target.write_bytes(data.draw(damaged(yaml.safe_load(original), dump_yaml)))
        reads_or_says_why(lambda: read_store(store_copy, rel.split("/")[0]))
    finally:
        target.write_bytes(original)


def read_index(cache: Path, url: str, offline: bool) -> None:
    """The page, then the artifact `check` would pick for each version it lists."""
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.release import choose_artifact

    project = PackageIndex(url, cache, offline=offline).project("vllm")
    for version in project.versions(include_pre=True):
        for prefer_sdist in (False, True):
            reads_or_says_why(choose_artifact, project, version, prefer_sdist=prefer_sdist)


@PROPERTY
@given(data=st.data())
def test_damaged_index_cache_reads_or_is_an_environment_error(data):
    url = "http://127.0.0.1:9/simple"
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        file = index_cache_file(cache, url)
        file.parent.mkdir(parents=True)
        file.write_bytes(data.draw(damaged(INDEX_CACHE, dump_json)))
        reads_or_says_why(lambda: read_index(cache, url, offline=True))


@PROPERTY
@given(data=st.data())
def test_damaged_pep691_response_reads_or_is_a_network_error(page, data):
    page.body = data.draw(damaged(PEP691, dump_json))
    with tempfile.TemporaryDirectory() as tmp:
        reads_or_says_why(lambda: read_index(Path(tmp), page.url, offline=False))


@pytest.fixture(scope="module")
def wheel_index(tmp_path_factory):
    """One real wheel on a local index, its index page and central directory (the cache file's bytes)."""
    from patchctl.sources.index import PackageIndex

    files = tmp_path_factory.mktemp("files")
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        cache = tmp_path_factory.mktemp("cache")
        project = PackageIndex(server.url, cache).project("vllm")
        source = release_source(project, cache, offline=False)
        source.read("vllm/loader.py")
        cd = (source.dir / "central-directory.bin").read_bytes()
        yield server, project, cd


def release_source(project, cache: Path, offline: bool):
    from patchctl.core.engines import get_engine
    from patchctl.sources.release import ReleaseSource, choose_artifact

    return ReleaseSource(get_engine("vllm"), choose_artifact(project, project.versions()[-1]), cache, offline=offline)


@PROPERTY
@given(data=st.data(), offline=st.booleans())
def test_damaged_central_directory_cache_reads_or_is_an_error(wheel_index, data, offline):
    _, project, cd = wheel_index
    with tempfile.TemporaryDirectory() as tmp:
        source = release_source(project, Path(tmp), offline=offline)
        source.dir.mkdir(parents=True)
        damage = data.draw(damaged_bytes(cd))
        (source.dir / "central-directory.bin").write_bytes(damage)

        def read():
            assert "vllm/loader.py" in source.files_under("vllm/")
            for path in ("vllm/loader.py", "vllm/utils.py", "vllm/absent.py"):
                assert source.read(path) == (PRISTINE[path].encode() if path in PRISTINE else None)

        if offline:
            reads_or_says_why(read)
        else:  # the sha256 the file starts with catches any damage, and the network reads the list again
            read()
            assert (source.dir / "central-directory.bin").read_bytes() == cd


@PROPERTY
@given(data=st.data())
def test_damaged_matrix_loads_or_is_a_usage_error(tmp_path, data):
    from patchctl.matrix import build as matrix
    from patchctl.matrix.html_page import render_html

    valid = small_matrix()
    path = tmp_path / "m.yaml"
    path.write_bytes(data.draw(damaged(valid, dump_yaml)))

    def read():
        doc = matrix.load(path)
        matrix.diff(valid, doc)
        matrix.diff(doc, valid)
        matrix.markdown(matrix.merge([valid, doc]))
        render_html(doc)

    reads_or_says_why(read)


@PROPERTY
@given(data=st.data())
def test_damaged_config_reads_or_is_a_usage_error(monkeypatch, data):
    from patchctl.core import config
    from patchctl.core.engines import get_engine
    from patchctl.sources import fetch
    from patchctl.sources.kinds.nightly import nightly_source

    monkeypatch.setenv("PIP_INDEX_URL", "https://pip.example/simple")  # where no index_url is configured
    Path(config.config_file()).write_bytes(data.draw(damaged(CONFIG, dump_yaml)))

    reads_or_says_why(fetch.resolve_index, None)
    for engine in ("vllm", "sglang", "vllm-gguf-plugin"):
        reads_or_says_why(nightly_source, get_engine(engine), None)


def test_the_undamaged_documents_read(store_copy, page, wheel_index, tmp_path, monkeypatch):
    """The starting points of the property tests are valid: damage is what makes them fail."""
    from patchctl.core import config
    from patchctl.core.engines import get_engine
    from patchctl.matrix import build as matrix
    from patchctl.sources import fetch
    from patchctl.sources.index import PackageIndex
    from patchctl.sources.kinds.nightly import nightly_source

    for engine in ("vllm", "sglang", "vllm-gguf-plugin"):
        read_store(store_copy, engine)
    cache = tmp_path / "cache"
    file = index_cache_file(cache, "http://127.0.0.1:9/simple")
    file.parent.mkdir(parents=True)
    file.write_bytes(dump_json(INDEX_CACHE))
    project = PackageIndex("http://127.0.0.1:9/simple", cache, offline=True).project("vllm")
    assert [str(v) for v in project.versions(include_pre=True)] == ["1.0", "1.1", "1.2"]
    page.body = dump_json(PEP691)
    read_index(tmp_path / "cache2", page.url, offline=False)
    _, project, cd = wheel_index
    source = release_source(project, tmp_path / "cache3", offline=True)
    source.dir.mkdir(parents=True)
    (source.dir / "central-directory.bin").write_bytes(cd)
    assert "vllm/loader.py" in source.files_under("vllm/")
    (tmp_path / "m.yaml").write_bytes(dump_yaml(small_matrix()))
    assert matrix.load(tmp_path / "m.yaml") == small_matrix()
    Path(config.config_file()).write_bytes(dump_yaml(CONFIG))
    assert fetch.resolve_index(None).url == "https://mirror.example/simple"
    assert nightly_source(get_engine("sglang"), None).kind == "git"


# Regression tests: each input that escaped as a traceback, through the CLI -----------------------


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, text)
    path.write_text(text.replace(old, new))


def store_error(store: Path, named: Path, *, command: tuple[str, ...] = ("list", "vllm@1.0")) -> str:
    doc = run_json(*command, "--store", str(store), expect=2)
    assert doc["error"]["kind"] == "store" and str(named) in doc["error"]["message"], doc["error"]
    return doc["error"]["message"]


def test_series_name_that_is_an_integer(store):
    series = store / "vllm" / "series.yaml"
    _edit(series, "name: loader", "name: 12345")
    assert "patches[0].name must be string" in store_error(store, series)


def test_series_pin_that_is_an_integer(store):
    series = store / "vllm" / "series.yaml"
    text = series.read_text()
    pin = text.split("1.0.patch: ", 1)[1].split()[0]
    _edit(series, pin, "5")
    assert "1.0.patch must be string" in store_error(store, series)


@pytest.mark.parametrize("name", ["series.yaml", "loader/patch.yaml"])
def test_store_file_that_is_not_utf8(store, name):
    path = store / "vllm" / name
    path.write_bytes(path.read_bytes() + b"\nwhy: caf\xe9\n")
    assert "not UTF-8 text (byte 0xe9" in store_error(store, path)
    doc = run_json("lint", "--store", str(store), expect=2)
    assert any(str(path) in p["message"] for p in doc["problems"])


@pytest.mark.parametrize(
    "old,new,complaint",
    [
        ("requires: []", "requires: [5]", "requires[0] must be string"),
        ("depends_on: []", "depends_on: 5", "depends_on must be array or null"),
        ("title: Test patch loader", "title: ''", "'title' is required"),
        ("title: Test patch loader", "title: [Test patch loader]", "title must be string"),
        ("title: Test patch loader", "title: 5", "title must be string"),
        ("why: tests", "why: tests\nsmoke: {env: ../../etc}", "smoke.env must match pattern"),
        ("why: tests", "why: tests\nevidence: [proven]", "evidence must be object or null"),
        ("why: tests", "why: tests\nupstream: https://github.com/x/y/pull/1", "upstream must be array or null"),
        ("why: tests", "why: tests\nupstreamed_in: 5", "upstreamed_in must be string or null"),
        ("why: tests", "why: tests\ntitel: typo", "must not contain {'titel'} properties"),
    ],
)
def test_patch_yaml_of_the_wrong_shape(store, old, new, complaint):
    meta = store / "vllm" / "loader" / "patch.yaml"
    _edit(meta, old, new)
    assert complaint in store_error(store, meta)


def test_variant_file_with_an_empty_base(store):
    empty = store / "vllm" / "loader" / ".patch"
    empty.write_text("not a variant")
    assert "variant files are named <base-version>.patch" in store_error(store, empty)


@pytest.mark.parametrize("rule", ["5", "vllm", "'vllm @ https://example/vllm.whl'", "'vllm>=0.24; python_version<\"3\"'"])
def test_drop_when_must_be_upstreamed_or_a_requirement_with_a_specifier(store, rule):
    meta = store / "vllm" / "loader" / "patch.yaml"
    meta.write_text(meta.read_text() + f"drop_when: {rule}\n")
    message = store_error(store, meta)
    assert "must be 'upstreamed' or a requirement like 'vllm>=0.24'" in message
    doc = run_json("lint", "--store", str(store), expect=2)  # lint passed `drop_when: 5` before
    assert any(str(meta) in p["message"] and "drop_when" in p["message"] for p in doc["problems"])


@pytest.mark.parametrize("rule", ["upstreamed", "vllm>=0.24", "'vllm >=1.2, <2'"])
def test_drop_when_that_is_right_still_reads(store, rule):
    meta = store / "vllm" / "loader" / "patch.yaml"
    meta.write_text(meta.read_text() + f"drop_when: {rule}\n")
    assert run_json("lint", "--store", str(store), expect=0)["problems"] == []


def test_truncated_index_cache_offline_says_to_refresh_it(index, store, fresh_cache):
    run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    cache_file = index_cache_file(fresh_cache, index.url)
    cache_file.write_bytes(cache_file.read_bytes()[:40])
    new_process()
    doc = run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), "--offline", expect=3)
    assert doc["error"]["kind"] == "environment"
    assert f"cache file {cache_file} is damaged; run once without --offline to refresh it" in doc["error"]["message"]
    # online, the page is read again and the cache is whole again
    new_process()
    run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    assert json.loads(cache_file.read_text())["name"] == "vllm"
    new_process()
    run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), "--offline", expect=0)


def test_damaged_index_cache_with_the_index_down_is_deleted(index, store, fresh_cache):
    run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    cache_file = index_cache_file(fresh_cache, index.url)
    cache_file.write_text('{"name": "vllm", "files": [["vllm-1.0-py3-none-any.whl"]]}')
    index.__exit__(None, None, None)
    new_process()
    doc = run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=3)
    assert "nothing is cached" in doc["error"]["message"] and index.url in doc["error"]["message"]
    assert not cache_file.exists()


def test_truncated_central_directory_cache_is_read_again(index, store, fresh_cache):
    run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    (artifact,) = artifact_dirs(fresh_cache)
    cd_file = artifact / "central-directory.bin"
    whole = cd_file.read_bytes()
    cd_file.write_bytes(whole[:100])
    shutil.rmtree(artifact / "members")  # so that the members must be read again, through the list
    doc = run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"
    assert cd_file.read_bytes() == whole  # whole again


def test_truncated_central_directory_cache_offline_says_to_refresh_it(index, store, fresh_cache):
    from patchctl.sources.index import PackageIndex

    run_json("check", "vllm@1.0", "--index-url", index.url, "--store", str(store), expect=0)
    (artifact,) = artifact_dirs(fresh_cache)
    cd_file = artifact / "central-directory.bin"
    cd_file.write_bytes(cd_file.read_bytes()[:100])
    source = release_source(PackageIndex(index.url, fresh_cache, offline=True).project("vllm"), fresh_cache, offline=True)
    with pytest.raises(EnvironmentProblem) as raised:
        source.files_under("vllm/")  # what rebase reads to find code that moved
    assert raised.value.exit_code == 3
    assert f"cache file {cd_file} is damaged; run once without --offline to refresh it" in raised.value.message
    assert cd_file.exists()  # offline nothing can replace it: left for the next online run


@pytest.mark.parametrize(
    "body,complaint",
    [
        ({"meta": {"api-version": "1.0"}, "name": "vllm", "files": {"vllm-1.0.tar.gz": {}}}, "files must be array"),
        ({"meta": {"api-version": "1.0"}, "files": [{"url": "/files/vllm-1.0.tar.gz"}]}, "must contain ['filename'"),
        ({"files": [{"filename": "vllm-1.0.tar.gz", "url": "/f", "size": "12"}]}, "size must be integer or null"),
        ([1, 2], "the document must be object"),
        (b'{"files": [', "does not parse"),
    ],
)
def test_index_json_of_the_wrong_shape_names_the_index(page, store, fresh_cache, body, complaint):
    page.body = body if isinstance(body, bytes) else json.dumps(body).encode()
    doc = run_json("check", "vllm@1.0", "--index-url", page.url, "--store", str(store), expect=3)
    assert doc["error"]["kind"] == "network"
    assert f"{page.url}/vllm/" in doc["error"]["message"] and complaint in doc["error"]["message"]


def test_index_html_that_does_not_parse_names_the_index(page, store, fresh_cache):
    page.ctype, page.body = "text/html", b"<![bogus[ <a href='/f/vllm-1.0.tar.gz'>x</a>"
    doc = run_json("check", "vllm@1.0", "--index-url", page.url, "--store", str(store), expect=3)
    assert f"{page.url}/vllm/" in doc["error"]["message"]


def test_index_hash_that_is_not_a_sha256_is_no_hash(page, store, fresh_cache):
    """The sha256 names the artifact's cache folder: "../../x" must not become a path."""
    page.body = json.dumps(
        {"files": [{"filename": "vllm-1.0.tar.gz", "url": "/f/vllm-1.0.tar.gz", "hashes": {"sha256": "../../../escape"}}]}
    ).encode()
    doc = run_json("check", "vllm@1.0", "--index-url", page.url, "--store", str(store), expect=2)
    assert "is not on the package index" in doc["error"]["message"]
    assert not (fresh_cache.parent.parent / "escape").exists()


@pytest.mark.parametrize(
    "content,complaint",
    [
        ("[1, 2]\n", "not a patchctl-matrix/1 document"),
        ("{}\n", "not a patchctl-matrix/1 document"),
        ("schema: patchctl-matrix/1\nengines: [vllm]\n", "engines must be object"),
        (
            "schema: patchctl-matrix/1\nengines:\n  vllm:\n    patches: [p]\n    versions:\n      '1.0': {version: '1.0', "
            "artifact: a.whl, sha256: null, bytes_fetched: 1, seconds: 0.1, patches: {p: {outcome: 5, variant: null}}}\n",
            "outcome must be one of",
        ),
        (
            "schema: patchctl-matrix/1\nengines:\n  vllm:\n    patches: []\n    versions:\n      not-a-version: "
            "{version: x, error: e, patches: {}}\n",
            "'not-a-version' is not a version",
        ),
        ("schema: patchctl-matrix/1\nengines: {vllm: {patches: [\n", "not valid YAML"),
        (b"schema: patchctl-matrix/1 \xff\n", "not UTF-8 text"),
    ],
)
def test_matrix_diff_of_a_file_that_is_not_a_matrix(tmp_path, content, complaint):
    good = tmp_path / "good.yaml"
    shutil.copy(REPO / "compat_matrix.yaml", good)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    for args in (
        ("diff", str(bad), str(good)),
        ("diff", str(good), str(bad)),
        ("merge", str(good), str(bad), "-o", str(tmp_path / "out.yaml")),
    ):
        doc = run_json("matrix", *args, expect=2)
        assert doc["error"]["kind"] == "usage"
        assert str(bad) in doc["error"]["message"] and complaint in doc["error"]["message"], doc["error"]


def test_committed_matrix_diffs_against_itself(tmp_path):
    doc = run_json("matrix", "diff", str(REPO / "compat_matrix.yaml"), str(REPO / "compat_matrix.yaml"), expect=0)
    assert doc["diff"] == {"regressions": [], "fixes": [], "changes": []}


@pytest.mark.parametrize(
    "content,spec,complaint",
    [
        ("nightly: [vllm]\n", "vllm@nightly", "nightly must be object or null"),
        ("nightly:\n  vllm: https://wheels.example/nightly\n", "vllm@nightly", "nightly.vllm must be object or null"),
        ("nightly:\n  vllm: {url: [a]}\n", "vllm@nightly", "nightly.vllm.url must be string or null"),
        ("nightly:\n  vllm: {kind: svn}\n", "vllm@nightly", "nightly.vllm.kind must be one of"),
        ("index_url: [https://mirror.example/simple]\n", "vllm@1.0", "index_url must be string or null"),
        ("index-url: https://mirror.example/simple\n", "vllm@1.0", "must not contain {'index-url'} properties"),
        ("- index_url\n", "vllm@1.0", "must hold a mapping"),
        (b"index_url: https://caf\xe9.example/simple\n", "vllm@1.0", "not UTF-8 text"),
    ],
)
def test_config_file_of_the_wrong_shape(tmp_path, monkeypatch, store, fresh_cache, content, spec, complaint):
    config = tmp_path / "config.yaml"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.setenv("PATCHCTL_CONFIG", str(config))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    doc = run_json("check", spec, "--store", str(store), "--offline", expect=2)
    assert doc["error"]["kind"] == "usage"
    assert f"config file {config}" in doc["error"]["message"] and complaint in doc["error"]["message"], doc["error"]


# `apply --install --json`: exactly one document on stdout ----------------------------------------


def test_pip_install_writes_nothing_on_stdout(tmp_path, capfd):
    from patchctl.tree.find import _run_installer  # what `apply --install` runs pip through

    wheels = tmp_path / "wheels"
    build_wheel(wheels, "patchctl-tiny", "1.0", {"patchctl_tiny/__init__.py": "VALUE = 1\n"})
    _run_installer(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "patchctl-tiny==1.0",
            "--no-index",
            "--find-links",
            str(wheels),
            "--target",
            str(tmp_path / "t"),
            "--no-cache-dir",
        ],
        "pip",
    )
    out, err = capfd.readouterr()
    assert out == "" and "patchctl-tiny" in err.replace("_", "-")
    assert (tmp_path / "t" / "patchctl_tiny" / "__init__.py").is_file()


def test_apply_install_json_prints_one_document(tmp_path, store):
    """The real CLI in a process of its own (CliRunner cannot see what pip writes on fd 1): pip installs
    vllm 1.0 from a local index into a target folder that the interpreter then imports from."""
    site = tmp_path / "site"
    files = tmp_path / "files"
    files.mkdir()
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        env = dict(
            os.environ, PIP_TARGET=str(site), PYTHONPATH=str(site), PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1"
        )
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "patchctl.cli.main",
                "apply",
                "vllm@1.0",
                "--install",
                "--python",
                sys.executable,
                "--index-url",
                server.url,
                "--store",
                str(store),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    doc = json.loads(proc.stdout)  # one document, nothing of pip's around it
    assert proc.returncode == 0 and doc["ok"], proc.stderr
    assert doc["patches"][0]["outcome"] == "clean" and "Successfully installed" in proc.stderr
    assert (site / "vllm" / "loader.py").read_text() == loader_with({10: "ten\n"})


# Hostile values: every reader refuses them by name ------------------------------------------------
# (the bounded loaders of patchctl/core/yamlio.py: on main a NUL byte, NaN or deep nesting was a
# RecursionError, a ValueError or a libyaml segfault, i.e. exit 4, or a wait that never ended)

HOSTILE = settings(PROPERTY, max_examples=25)


def refused_naming(read, named) -> None:
    """The promise for a hostile document: a PatchctlError (exit 2 or 3) whose message names it."""
    with pytest.raises(PatchctlError) as raised:
        read()
    assert raised.value.exit_code in (2, 3) and str(named) in raised.value.message, raised.value.message


@HOSTILE
@given(data=st.data(), kind=st.sampled_from(["series", "patch"]))
def test_hostile_store_yaml_is_refused_by_name(store_copy, data, kind):
    rel = data.draw(st.sampled_from(SERIES_FILES if kind == "series" else PATCH_FILES))
    original = (REPO / "patches" / rel).read_bytes()
    target = store_copy / rel
    try:
        target.write_bytes(data.draw(hostile(yaml.safe_load(original), dump_yaml)))
        refused_naming(lambda: read_store(store_copy, rel.split("/")[0]), target)
    finally:
        target.write_bytes(original)


@HOSTILE
@given(data=st.data())
def test_hostile_index_cache_offline_is_refused_by_name(data):
    from patchctl.sources.index import PackageIndex

    url = "http://127.0.0.1:9/simple"
    with tempfile.TemporaryDirectory() as tmp:
        file = index_cache_file(Path(tmp), url)
        file.parent.mkdir(parents=True)
        file.write_bytes(data.draw(hostile(INDEX_CACHE, dump_json)))
        refused_naming(lambda: PackageIndex(url, Path(tmp), offline=True).project("vllm"), file)


@HOSTILE
@given(data=st.data())
def test_hostile_pep691_response_is_refused_by_name(page, data):
    from patchctl.sources.index import PackageIndex

    page.body = data.draw(hostile(PEP691, dump_json))
    with tempfile.TemporaryDirectory() as tmp:
        refused_naming(lambda: PackageIndex(page.url, Path(tmp)).project("vllm"), page.url)


@HOSTILE
@given(data=st.data())
def test_hostile_matrix_and_config_are_refused_by_name(tmp_path, data):
    from patchctl.core import config
    from patchctl.matrix import build as matrix
    from patchctl.sources import fetch

    path = tmp_path / "m.yaml"
    path.write_bytes(data.draw(hostile(small_matrix(), dump_yaml)))
    refused_naming(lambda: matrix.load(path), path)
    Path(config.config_file()).write_bytes(data.draw(hostile(CONFIG, dump_yaml)))
    refused_naming(lambda: fetch.resolve_index(None), config.config_file())


DEPLOYMENT = {
    "engine": "vllm",
    "target": "/srv/vllm/site-packages",
    "stores": ["/etc/patchctl/store"],
    "patches": ["loader"],
    "wait": 60,
    "validate": {"url": "http://127.0.0.1:8000", "concurrency": [1, 8]},
}


@HOSTILE
@given(data=st.data())
def test_hostile_deployment_file_is_a_usage_error_naming_it(tmp_path, data):
    from patchctl.cli import deployment

    path = tmp_path / "d.yaml"
    path.write_bytes(data.draw(hostile(DEPLOYMENT, dump_yaml)))
    path.chmod(0o644)
    refused_naming(lambda: deployment.load(path), path)


def _state_body() -> dict:
    return {"engine": "vllm", "version": "1.0", "applied": [], "files": {}}


@HOSTILE
@given(data=st.data(), kind=st.sampled_from(["record", "journal"]))
def test_hostile_record_or_journal_is_damaged_by_name(data, kind):
    """A forged record or journal (its seal recomputed by whoever wrote it): exit 3 naming it."""
    import hashlib

    from patchctl.tree.bookkeeping import upgrade
    from patchctl.tree.bookkeeping.record import unseal

    body = data.draw(hostile(_state_body(), dump_json)).decode()
    seal = hashlib.sha256(body.replace(" ", "").encode()).hexdigest()
    raw = f'{{"sha256": "{seal}", "{kind}": {body}}}'.encode()
    where = Path("/srv/site/.patchctl/vllm") / f"{'state' if kind == 'record' else 'journal'}.json"
    fmt = upgrade.RECORD if kind == "record" else upgrade.JOURNAL
    refused_naming(lambda: upgrade.current(fmt, unseal(kind, raw, where, "hint"), where, "hint"), where)


IMAGE_MANIFEST = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + "c" * 64, "size": 120},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + "d" * 64, "size": 4096}],
}
IMAGE_CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "config": {"Env": ["PATH=/usr/bin"], "Labels": {"a": "b"}},
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "e" * 64]},
}


@HOSTILE
@given(data=st.data())
def test_hostile_image_manifest_and_config_are_refused_by_digest(data):
    import hashlib

    from patchctl.image.manifest import load_image, media_type_of
    from patchctl.image.registry import Manifest

    raw = data.draw(hostile(IMAGE_MANIFEST, dump_json))
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    refused_naming(lambda: media_type_of(Manifest(raw, "", digest)), digest[:19])

    class Blobs:
        def __init__(self, config: bytes):
            self.config = config

        def small_blob(self, digest: str, limit: int = 0) -> bytes:
            return self.config

    good = dump_json(IMAGE_MANIFEST)
    refused_naming(
        lambda: load_image(
            Blobs(data.draw(hostile(IMAGE_CONFIG, dump_json))),  # type: ignore[arg-type]
            Manifest(good, "", "sha256:" + hashlib.sha256(good).hexdigest()),
        ),
        "sha256:" + "c" * 12,
    )
