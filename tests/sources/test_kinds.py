"""The registry of upstream kinds (patchctl/sources/registry.py), and the kind that proves the seam:
`ENGINE@file:PATH`, a wheel or sdist on disk (vLLM built from source), for check, export, smoke and
apply --install, built here as real archives."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.builders import build_wheel, write_tree
from support.fixtures import PRISTINE, loader_with

from patchctl.cli.main import main
from patchctl.core.errors import UsageError

CHECK = """
def test_patched_tree_has_the_change(patched_tree, pristine_tree, engine_version):
    assert str(engine_version) == "1.1"
    assert "ten" in (patched_tree / "vllm/loader.py").read_text()
    assert "ten" not in (pristine_tree / "vllm/loader.py").read_text()
"""


def invoke(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def build_sdist(dest: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    """An sdist as setuptools writes one: <name>-<version>/ holding PKG-INFO, a pyproject.toml and the
    package files."""
    top = f"{dist.replace('-', '_')}-{version}"
    members = dict(files)
    members["PKG-INFO"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    members["pyproject.toml"] = (
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{dist}"\nversion = "{version}"\n'
    )
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def store(builder):
    variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
    patch = builder.add("vllm", "good", variants={"1.0": variant}, extra_meta={"smoke": {"env": "test"}})
    (patch / "checks").mkdir()
    (patch / "checks" / "test_good.py").write_text(CHECK)
    return builder.root


@pytest.fixture
def wheel(tmp_path) -> Path:
    return build_wheel(tmp_path / "dist", "vllm", "1.1", dict(PRISTINE))


@pytest.fixture
def sdist(tmp_path) -> Path:
    return build_sdist(tmp_path / "sdist", "vllm", "1.1", dict(PRISTINE))


# --- the registry --------------------------------------------------------------------------------

SPECS = [
    "vllm",
    "vllm@0.23.0",
    "vllm@latest",
    "vllm@nightly",
    "sglang@git:main",
    "vllm@commit:2f3f441f8",
    "vllm@./tree",
    "vllm@/abs/tree",
    "vllm@file:/abs/vllm-1.0-py3-none-any.whl",
    "vllm@file:./vllm-1.0.tar.gz",
]


@pytest.mark.parametrize("text", SPECS)
def test_every_kind_prints_what_it_parses(text):
    from patchctl.sources.spec import parse_spec

    ref = parse_spec(text)
    assert str(ref) == text and parse_spec(str(ref)) == ref


def test_the_registry_holds_one_object_per_kind_name():
    from patchctl.sources import registry
    from patchctl.sources.spec import KINDS

    assert KINDS == registry.names() == ("installed", "latest", "nightly", "git", "commit", "image", "file", "path", "exact")
    assert [registry.kind_named(n).name for n in KINDS] == list(KINDS)
    with pytest.raises(UsageError):
        registry.kind_named("ftp")


def test_file_comes_before_the_directory_it_would_look_like():
    from patchctl.sources.spec import parse_spec

    ref = parse_spec("vllm@file:/x/vllm-1.0-py3-none-any.whl")
    assert (ref.kind, ref.path, ref.version) == ("file", "/x/vllm-1.0-py3-none-any.whl", None)
    assert parse_spec("vllm@file:~/w.whl").path == os.path.expanduser("~/w.whl")


def test_an_engine_may_limit_its_kinds():
    from patchctl.core.engines import get_engine
    from patchctl.sources import registry

    engine = get_engine("vllm")._replace(kinds=("exact", "installed"))
    assert registry.parse("1.0", engine)[0].name == "exact"
    with pytest.raises(UsageError, match="has no 'nightly' upstream"):
        registry.parse("nightly", engine)


def test_commit_wheels_follow_the_engines_layout(monkeypatch):
    """vLLM's <root>/<SHA>/ comes from engines.yaml (nightly.commit_layout); an engine whose wheel
    index names no layout publishes no per-commit builds."""
    from patchctl.core.engines import get_engine
    from patchctl.sources import registry
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.kinds import commit
    from patchctl.sources.spec import EngineRef

    engine = get_engine("vllm")
    assert engine.nightly.commit_layout == "{root}/{commit}"
    seen = []

    def fake_build(ref, ctx, url, what, commit=None):
        seen.append(url)
        raise UsageError("stop")

    monkeypatch.setattr(commit, "wheel_index_build", fake_build)
    monkeypatch.setenv("PATCHCTL_CONFIG", "/nonexistent/config.yaml")
    ctx = SourceContext(nightly_source="http://127.0.0.1:9/nightly")
    with pytest.raises(UsageError, match="stop"):
        registry.open_upstream(EngineRef(engine, "commit", git_ref="abc1234"), ctx)
    assert seen == ["http://127.0.0.1:9/abc1234"]
    bare = engine._replace(nightly=engine.nightly._replace(commit_layout=None))
    with pytest.raises(UsageError, match="publishes no per-commit builds"):
        registry.open_upstream(EngineRef(bare, "commit", git_ref="abc1234"), ctx)


def test_engines_yaml_is_checked_by_its_schema():
    from importlib import resources

    from patchctl.core.schemas import problem
    from patchctl.core.yamlio import load_yaml

    raw = load_yaml(resources.files("patchctl.core").joinpath("engines.yaml").read_text())
    assert problem("engines", raw) is None
    broken = dict(raw, vllm={k: v for k, v in raw["vllm"].items() if k != "version"})
    assert "version" in (problem("engines", broken) or "")
    typo = dict(raw, vllm=dict(raw["vllm"], pakages=["vllm"]))
    assert problem("engines", typo) is not None


# --- ENGINE@file:PATH ----------------------------------------------------------------------------


@pytest.mark.parametrize("artifact", ["wheel", "sdist"])
def test_check_reads_a_file_on_disk_as_the_release_it_holds(artifact, request, store, tmp_path, fresh_cache):
    path = request.getfixturevalue(artifact)
    code, doc = invoke("check", f"vllm@file:{path}", "--store", str(store))
    assert code == 0, doc
    assert doc["version"] == "1.1"
    assert doc["source"]["kind"] == artifact and doc["source"]["description"] == path.name
    assert doc["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert doc["source"]["bytes_fetched"] == 0 and doc["source"]["path"] == str(path)
    # The same outcomes as the same files in a directory.
    write_tree(tmp_path / "tree", PRISTINE)
    code, same = invoke("check", f"vllm@{tmp_path / 'tree'}", "--as-version", "1.1", "--store", str(store))
    assert code == 0 and same["patches"] == doc["patches"]
    assert [p["outcome"] for p in doc["patches"]] == ["clean"]


def test_a_file_of_another_dist_or_kind_is_a_usage_error(tmp_path, store, fresh_cache):
    other = build_wheel(tmp_path, "sglang", "1.0", {"sglang/__init__.py": ""})
    code, doc = invoke("check", f"vllm@file:{other}", "--store", str(store))
    assert code == 2 and "not vllm" in doc["error"]["message"]
    (tmp_path / "vllm-1.0.zip").write_bytes(b"PK")
    code, doc = invoke("check", f"vllm@file:{tmp_path / 'vllm-1.0.zip'}", "--store", str(store))
    assert code == 2 and "neither a wheel" in doc["error"]["message"]
    code, doc = invoke("check", f"vllm@file:{tmp_path / 'missing.whl'}", "--store", str(store))
    assert code == 2 and "is not a file" in doc["error"]["message"]


def test_a_damaged_wheel_member_is_refused(tmp_path, store, fresh_cache):
    """The wheel's RECORD vouches for its members, as for a release from the index."""
    import zipfile

    good = build_wheel(tmp_path / "good", "vllm", "1.1", dict(PRISTINE))
    bad = tmp_path / "bad" / good.name
    bad.parent.mkdir()
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            out.writestr(info, data + b"# changed\n" if info.filename == "vllm/loader.py" else data)
    code, doc = invoke("check", f"vllm@file:{bad}", "--store", str(store))
    assert code != 0 and "RECORD" in json.dumps(doc)


@pytest.mark.parametrize("artifact", ["wheel", "sdist"])
def test_export_writes_the_patched_files_and_the_whole_package(artifact, request, store, tmp_path, fresh_cache):
    path = request.getfixturevalue(artifact)
    code, doc = invoke("export", f"vllm@file:{path}", str(tmp_path / "overlay"), "--store", str(store))
    assert code == 0, doc
    assert doc["written"] == ["vllm/loader.py"]
    assert doc["note"] == f"wrote 1 patched file(s) to {tmp_path / 'overlay'}"
    assert "ten" in (tmp_path / "overlay" / "vllm/loader.py").read_text()
    code, doc = invoke("export", f"vllm@file:{path}", str(tmp_path / "full"), "--full", "--store", str(store))
    assert code == 0, doc
    assert doc["note"] == f"wrote the whole package (vllm) to {tmp_path / 'full'}, 1 of its file(s) patched"
    for rel in PRISTINE:
        assert (tmp_path / "full" / rel).is_file(), rel
    assert "ten" in (tmp_path / "full" / "vllm/loader.py").read_text()


def test_smoke_builds_its_trees_from_the_file(wheel, store, fresh_cache):
    code, doc = invoke("smoke", f"vllm@file:{wheel}", "--store", str(store), "--python", sys.executable)
    assert code == 0, doc
    (result,) = doc["results"]
    assert result["status"] == "passed" and result["passed"] == 1
    assert doc["source"] == {"kind": "file", "description": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}


def test_install_plan_names_the_file(wheel, sdist):
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.spec import parse_spec
    from patchctl.tree.find import plan_install

    for path in (wheel, sdist):
        plan = plan_install(parse_spec(f"vllm@file:{path}"), sys.executable, SourceContext(index_url="http://127.0.0.1:9/simple"))
        assert plan.requirement == str(path) and str(plan.version) == "1.1"
        build = plan.build
        assert (build.kind, build.url, build.artifact, build.spec) == ("file", path.as_uri(), path.name, f"vllm@file:{path}")
        assert build.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert plan.index_url == "http://127.0.0.1:9/simple"


@pytest.mark.slow  # a fresh venv with pip: ~2 min on a shared machine
def test_apply_install_installs_the_wheel_into_a_fresh_venv(wheel, store, tmp_path, monkeypatch, fresh_cache):
    monkeypatch.setenv(
        "PATH", os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "uv").exists())
    )
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    venv.EnvBuilder(with_pip=True, clear=True).create(tmp_path / "venv")
    python = str(tmp_path / "venv" / "bin" / "python")
    code, doc = invoke("apply", f"vllm@file:{wheel}", "--install", "--no-deps", "--python", python, "--store", str(store))
    assert code == 0, doc
    assert doc["build"]["kind"] == "file" and doc["build"]["installer"] == "pip"
    assert doc["build"]["url"] == wheel.as_uri() and doc["build"]["spec"] == f"vllm@file:{wheel}"
    loader = subprocess.run(
        [
            python,
            "-c",
            "import sysconfig, pathlib; print((pathlib.Path(sysconfig.get_paths()['purelib']) / 'vllm/loader.py').read_text())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "ten" in loader
    code, status = invoke("status", "vllm", "--python", python)
    assert code == 0 and status["state"] == "intact"
    assert status["build"]["kind"] == "file" and status["build"]["version"] == "1.1"


def test_config_imports_nothing_from_the_sources_layer():
    """config.py is ground: pip's settings are read by sources/fetch.resolve_index, which asks config
    for the config file's index (imports inside functions count too)."""
    import ast

    import patchctl.core.config

    tree = ast.parse(Path(patchctl.core.config.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {m for m in imported if m.startswith("patchctl.sources")}, imported
