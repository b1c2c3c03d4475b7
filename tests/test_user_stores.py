"""The user's own stores layered over the bundled patch set: --store (repeatable), PATCHCTL_STORE (a
path list) and the config's `stores:`; a name in two stores is refused unless the user's patch
overrides; `list` says where each patch comes from; no silent fallback to ./patches."""

import os

import pytest
import yaml
from support.builders import StoreBuilder
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json

from patchctl.core.bundled import bundled_store


@pytest.fixture(autouse=True)
def with_bundled(monkeypatch):
    monkeypatch.delenv("PATCHCTL_BUNDLED", raising=False)


def user_store(tmp_path, name="mine", patch="my-fix", **meta):
    builder = StoreBuilder(tmp_path / name)
    builder.add(
        "vllm",
        patch,
        applies_to=">=0.16",
        extra_meta=meta or None,
        variants={"0.16.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({3: "x\n"})})},
    )
    return builder.root


def rows(doc):
    return {(r["engine"], r["name"]): r for r in doc["series"]}


def test_a_user_store_comes_first_and_the_bundled_one_last(tmp_path):
    mine = user_store(tmp_path)
    doc = run_json("list", "vllm", "--store", str(mine), expect=0)
    series = rows(doc)
    assert series[("vllm", "my-fix")]["store"] == str(mine.resolve())
    assert series[("vllm", "gguf-glm-dsa")]["store"] == str(bundled_store().resolve())
    names = [r["name"] for r in doc["series"]]
    assert names[-1] == "my-fix"  # applied after the bundled series: it may depend on it
    assert run_json("list", "vllm", "--store", str(mine), "--no-bundled", expect=0)["series"][0]["name"] == "my-fix"


def test_stores_from_the_environment_and_the_config(tmp_path, monkeypatch):
    one, two = user_store(tmp_path, "one", "fix-one"), user_store(tmp_path, "two", "fix-two")
    monkeypatch.setenv("PATCHCTL_STORE", os.pathsep.join([str(one)]))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"stores": [str(two)]}))
    monkeypatch.setenv("PATCHCTL_CONFIG", str(config))
    names = [r["name"] for r in run_json("list", "vllm", expect=0)["series"]]
    assert {"fix-one", "fix-two", "gguf-glm-dsa"} <= set(names)


def test_a_name_in_two_stores_is_refused_unless_overridden(tmp_path):
    clash = user_store(tmp_path, "clash", "gguf-glm-dsa")
    doc = run_json("list", "vllm", "--store", str(clash), expect=2)
    assert "gguf-glm-dsa is in two stores" in doc["error"]["message"]
    assert str(clash.resolve()) in doc["error"]["message"] and "overrides: true" in doc["error"]["hint"]
    mine = user_store(tmp_path, "over", "gguf-glm-dsa", overrides=True)
    series = rows(run_json("list", "vllm", "--store", str(mine), expect=0))
    assert series[("vllm", "gguf-glm-dsa")]["store"] == str(mine.resolve())
    assert [r["name"] for r in run_json("list", "vllm", "--store", str(mine), expect=0)["series"]].count("gguf-glm-dsa") == 1


def test_a_missing_store_is_an_error_and_cwd_patches_is_never_taken(tmp_path, monkeypatch):
    doc = run_json("list", "--store", str(tmp_path / "nope"), expect=2)
    assert "does not exist" in doc["error"]["message"]
    (tmp_path / "patches" / "vllm").mkdir(parents=True)  # patch-package's folder in the user's project
    (tmp_path / "patches" / "vllm" / "series.yaml").write_text("garbage: [")
    monkeypatch.chdir(tmp_path)
    assert run_json("list", "vllm", expect=0)["series"]  # the bundled set, untouched by ./patches
