"""git:REF, local directories, nightly sources and --install, on real repos, venvs and a local index."""

import subprocess
import sys

import pytest
from support.builders import build_wheel, git, install_fake_dist, write_tree
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer
from support.invoke import run_json

run = run_json


@pytest.fixture
def store(builder):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    builder.add(
        "sglang",
        "args",
        variants={
            "0.5.9": builder.variant(
                {"sglang/srt/server_args.py": "A = 1\nB = 2\nC = 3\n"}, {"sglang/srt/server_args.py": "A = 1\nB = 20\nC = 3\n"}
            )
        },
    )
    return builder.root


def test_git_ref_with_layout_prefix(store, tmp_path):
    """SGLang keeps its package under python/ in git: the engine table maps it."""
    repo = tmp_path / "sglang-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_tree(
        repo, {"python/sglang/srt/server_args.py": "A = 1\nB = 2\nC = 3\n", "python/sglang/version.py": '__version__ = "0.5.9"\n'}
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "tag", "v0.5.9")
    write_tree(repo, {"python/sglang/srt/server_args.py": "A = 1\nB = 20\nC = 3\n"})
    git(repo, "commit", "-qam", "upstream takes the change")
    doc = run("check", "sglang@git:v0.5.9", "--repo", str(repo), "--store", str(store), expect=0)
    assert doc["version"] == "0.5.9" and doc["patches"][0]["outcome"] == "clean"
    assert doc["source"]["kind"] == "git"
    doc = run("check", "sglang@git:main", "--repo", str(repo), "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "upstreamed"
    doc = run("check", "sglang@git:nope", "--repo", str(repo), "--store", str(store), expect=2)
    assert doc["error"]["message"].endswith("no such ref 'nope'")


def test_local_directory_spec(store, tmp_path):
    tree = write_tree(tmp_path / "checkout", PRISTINE)
    doc = run("check", f"vllm@{tree}", "--as-version", "1.0", "--store", str(store), expect=0)
    assert doc["patches"][0]["outcome"] == "clean"
    doc = run("check", f"vllm@{tree}", "--store", str(store), expect=2)
    assert "cannot tell the vllm version" in doc["error"]["message"]


def test_nightly_source_is_named_when_down(store, tmp_path, monkeypatch):
    # vllm@nightly now defaults to https://wheels.vllm.ai/nightly (engines.yaml); a configured source
    # that is down is named, with how to configure another.
    config = tmp_path / "config.yaml"
    config.write_text("nightly:\n  vllm:\n    url: http://127.0.0.1:9/mirror/nightly\n")
    monkeypatch.setenv("PATCHCTL_CONFIG", str(config))
    doc = run("check", "vllm@nightly", "--store", str(store), expect=3)
    assert "nightly source for vllm (http://127.0.0.1:9/mirror/nightly) is unreachable" in doc["error"]["message"]
    assert "nightly.vllm.url" in doc["error"]["hint"]
    doc = run("check", "vllm@nightly", "--nightly-source", "http://127.0.0.1:9/nightly", "--store", str(store), expect=3)
    assert "nightly source for vllm (http://127.0.0.1:9/nightly) is unreachable" in doc["error"]["message"]
    assert (
        run("check", "vllm-gguf-plugin@nightly", "--store", str(store), expect=2)["error"]["message"]
        == "vllm-gguf-plugin publishes no nightly builds"
    )


def test_nightly_wheel_index_from_config_file(store, tmp_path, monkeypatch):
    files = tmp_path / "files"
    files.mkdir()
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        server.add("vllm", build_wheel(files, "vllm", "1.1.dev20261129", PRISTINE))
        config = tmp_path / "config.yaml"
        config.write_text(f"nightly:\n  vllm:\n    url: {server.url}\n")
        monkeypatch.setenv("PATCHCTL_CONFIG", str(config))
        doc = run("check", "vllm@nightly", "--store", str(store), expect=0)
    assert doc["version"] == "1.1.dev20261129" and doc["patches"][0]["outcome"] == "clean"


def test_install_then_apply_in_a_real_venv(store, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin/python")
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        doc = run(
            "apply", "vllm@1.0", "--install", "--python", python, "--index-url", server.url, "--store", str(store), expect=0
        )
    assert doc["patches"][0]["outcome"] == "clean" and "site-packages" in doc["target"]
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util, pathlib; "
            "p = pathlib.Path(importlib.util.find_spec('vllm').origin).parent; "
            "print((p / 'loader.py').read_text())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "ten\n" in out


def test_vllm_24_points_to_the_plugin_and_patches_it(builder, tmp_path, monkeypatch):
    plugin_file = "vllm_gguf_plugin/loader.py"
    builder.add("vllm", "gguf", applies_to="<0.24", variants={"0.23.0": builder.variant(PRISTINE, {"vllm/loader.py": "x\n"})})
    builder.add(
        "vllm-gguf-plugin",
        "gguf",
        requires=("gguf>=0.18",),
        variants={"0.0.5": builder.variant({plugin_file: "a\nb\nc\n"}, {plugin_file: "a\nB\nc\n"})},
    )
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "0.24.0", PRISTINE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    doc = run("apply", "vllm", "--python", sys.executable, "--store", str(builder.root), expect=0)
    assert doc["patches"][0]["outcome"] == "obsolete"
    assert any("vllm-gguf-plugin is not installed" in w for w in doc["warnings"])
    assert any("GGUF model loading" in w for w in doc["warnings"])
    install_fake_dist(site, "vllm-gguf-plugin", "0.0.5", {plugin_file: "a\nb\nc\n"})
    doc = run("apply", "vllm", "--python", sys.executable, "--store", str(builder.root), expect=0)
    (plugin,) = doc["also"]
    assert plugin["engine"] == "vllm-gguf-plugin" and plugin["patches"][0]["outcome"] == "clean"
    assert (site / plugin_file).read_text() == "a\nB\nc\n"
    assert any("patch gguf needs gguf>=0.18, which is not installed" in w for w in doc["warnings"]), doc["warnings"]
