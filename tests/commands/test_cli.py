"""Exit codes, JSON documents and text output of the CLI on bad input."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from support.fixtures import PRISTINE, loader_with

from patchctl.cli.main import main


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("spec,needle", [("tensorrt@1.0", "unknown engine"), ("vllm@1..0", "not a PEP 440 version")])
def test_bad_specs_exit_2_in_json_and_text(spec, needle):
    result = invoke("check", spec, "--json")
    doc = json.loads(result.stdout)
    assert result.exit_code == 2 and doc["ok"] is False and needle in doc["error"]["message"]
    assert doc["schema"] == "patchctl/1" and doc["error"]["kind"] == "usage"
    text = subprocess.run([sys.executable, "-m", "patchctl.cli.main", "check", spec], capture_output=True, text=True)
    assert text.returncode == 2 and needle in text.stderr


def test_lint_reports_each_problem(builder):
    folder = builder.add(
        "vllm", "p", applies_to=">=2.0", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({3: "x\n"})})}
    )
    (folder / "1.0.patch").write_bytes((folder / "1.0.patch").read_bytes() + b"\n")
    (builder.root / "vllm" / "orphan").mkdir()
    (builder.root / "vllm" / "orphan" / "patch.yaml").write_text("title: x\napplies_to: '>=1'\n")
    doc = json.loads(invoke("lint", "--store", str(builder.root), "--json").output)
    messages = " | ".join(p["message"] for p in doc["problems"])
    assert doc["exit_code"] == 2
    assert "does not match its sha256 pin" in messages
    assert "outside applies_to" in messages
    assert "not in series.yaml" in messages


@pytest.mark.parametrize(
    "content,needle",
    [
        ("patches: [", "not valid YAML"),
        ("patches:\n  - {}\n", "needs a 'name'"),
        ("patches:\n  - name: missing\n", "patch.yaml is missing"),
    ],
)
def test_malformed_series(tmp_path, content, needle):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "series.yaml").write_text(content)
    result = invoke("list", "vllm", "--store", str(tmp_path), "--json")
    assert result.exit_code == 2 and needle in json.loads(result.stdout)["error"]["message"]


def test_list_explains_variant_choice(builder):
    v = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({3: "x\n"})})
    builder.add("vllm", "p", applies_to=">=0.16,<0.24", variants={"0.16.0": v, "0.20.0": v}, drop_when="vllm>=0.24")
    doc = json.loads(invoke("list", "vllm@0.21.0", "--store", str(builder.root), "--json").output)
    (row,) = doc["series"]
    assert row["chosen_variant"] == "0.20.0.patch" and "newest base <= 0.21.0" in row["why"]
    assert row["drop_rule_met"] is False
    text = invoke("list", "vllm@0.21.0", "--store", str(builder.root)).output
    assert "0.20.0.patch" in text


def test_missing_store_is_usage_error(tmp_path):
    result = invoke("lint", "--store", str(tmp_path / "nope"), "--json")
    assert result.exit_code == 2 and "does not exist" in json.loads(result.stdout)["error"]["message"]
