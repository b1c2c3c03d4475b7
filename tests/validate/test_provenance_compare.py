"""Reports that name what they measured, baselines refused when they measured something else, and
`validate --compare` (issue 37 items 3 and 4)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json
from support.reasoner import MODEL

from checklib.testserver import json_reply
from patchctl.cli.main import main
from patchctl.validate import provenance as pv

QUICK = ("--no-answers", "--concurrency", "1", "--requests", "8", "--max-tokens", "6")


def fake_nvidia_smi(folder: Path, monkeypatch, body: str) -> None:
    folder.mkdir(exist_ok=True)
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def serve_max_model_len(shape_server, length: int) -> None:
    """The test server's /v1/models entry carries max_model_len, as vLLM's does."""

    def models(request):
        if request.method == "GET" and request.path == "/v1/models":
            return json_reply({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": length}]})
        return None

    shape_server.server.responders.insert(0, models)


def test_a_report_names_its_patch_set_build_context_gpu_and_prompts(shape_server, tree, builder, tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, 'echo "NVIDIA H200, 550.54.15"; echo "NVIDIA H200, 550.54.15"')
    serve_max_model_len(shape_server, 32768)
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    run_json("apply", "vllm@1.0", "--target", str(tree), "--store", str(builder.root), expect=0)
    state = json.loads(next((tree).rglob("state.json")).read_text())
    (patch,) = next(v for v in state.values() if isinstance(v, dict))["patches"]

    args = ("vllm@1.0", "--url", shape_server.base_url, "--target", str(tree), *QUICK, "--baseline-dir", str(tmp_path / "b"))
    doc = run_json("validate", *args, expect=0)
    prov = doc["report"]["provenance"]
    assert prov["patch_set"] == doc["report"]["deployment"]["patch_set"] and prov["patch_set_from"] == "target"
    assert prov["patches"] == [["loader", patch["sha256"]]] and patch["sha256"]
    assert (prov["engine_version"], prov["engine_build"]) == ("0.0.0+shape", "shape")
    assert (prov["max_model_len"], prov["gpu_name"], prov["gpu_driver"]) == (32768, "2 x NVIDIA H200", "550.54.15")
    assert prov["prompts"] == "unique" and prov["unknown"] == {}
    text = CliRunner().invoke(main, ["validate", *args]).stdout
    assert "measured: patch set" in text and "GPU 2 x NVIDIA H200 (driver 550.54.15)" in text and "max_model_len 32768" in text


def test_what_is_not_known_says_why(shape_server, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    shape_server.settings.update(version="1.2.3", say_max_model_len=False)
    doc = run_json(
        "validate", "vllm", "--url", shape_server.base_url, "--no-answers", "--no-throughput", "--long-context", "off", expect=0
    )
    prov = doc["report"]["provenance"]
    assert (prov["gpu_name"], prov["max_model_len"], prov["engine_build"], prov["prompts"]) == (None, None, None, None)
    assert prov["unknown"]["gpu_name"] == "nvidia-smi not found on this host"
    assert "/v1/models max_model_len" in prov["unknown"]["max_model_len"] and "patch_set" in prov["unknown"]
    assert "version names no build" in prov["unknown"]["engine_build"]


def test_sglang_s_version_is_read_from_get_server_info(shape_server):
    # SGLang's HTTP server has no /version: its version is in /get_server_info, beside its server args.
    shape_server.settings["version"] = None
    info = {"model_path": "m", "tp_size": 1, "version": "0.5.4.post1"}

    def server_info(request):
        return json_reply(info) if request.method == "GET" and request.path == "/get_server_info" else None

    shape_server.server.responders.insert(0, server_info)
    args = ("vllm", "--url", shape_server.base_url, "--no-answers", "--no-throughput")
    doc = run_json("validate", *args, expect=0)
    assert doc["report"]["deployment"]["engine_version"] == "0.5.4.post1"
    assert doc["report"]["provenance"]["engine_version"] == "0.5.4.post1"
    info.pop("version")
    prov = run_json("validate", *args, expect=0)["report"]["provenance"]
    assert prov["engine_version"] == "unknown" and "/get_server_info" in prov["unknown"]["engine_version"]


def test_nvidia_smi_is_asked_only_on_this_host_and_never_waited_for(tmp_path, monkeypatch):
    assert pv.gpu_of("http://gpu-box.example:8000")[2] == "the server is not on this host (gpu-box.example) and does not say"
    fake_nvidia_smi(tmp_path / "hang", monkeypatch, "sleep 30")
    name, driver, why = pv.gpu_of("http://127.0.0.1:8000", timeout_s=0.5)
    assert (name, driver, why) == (None, None, "nvidia-smi did not answer within 0.5 s")
    fake_nvidia_smi(tmp_path / "broken", monkeypatch, 'echo "NVIDIA-SMI has failed because it could not communicate" >&2; exit 9')
    assert pv.gpu_of("http://localhost:1")[2] == "nvidia-smi exited 9: NVIDIA-SMI has failed because it could not communicate"


def test_a_baseline_from_another_gpu_is_refused_naming_the_field(shape_server, tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "a", monkeypatch, 'echo "NVIDIA H100 80GB HBM3, 535.1"')
    args = ("vllm", "--url", shape_server.base_url, *QUICK, "--baseline-dir", str(tmp_path / "b"), "--threshold", "1000")
    run_json("validate", *args, "--update-baseline", expect=0)
    assert run_json("validate", *args, expect=0)["report"]["baseline"]["status"] == "compared"

    fake_nvidia_smi(tmp_path / "c", monkeypatch, 'echo "NVIDIA H200, 550.54.15"')
    refused = run_json("validate", *args, expect=2)
    assert refused["error"]["kind"] == "usage"
    assert "gpu_name 'NVIDIA H100 80GB HBM3' -> 'NVIDIA H200'" in refused["error"]["message"]
    assert "--accept-baseline-mismatch" in refused["error"]["hint"]
    accepted = run_json("validate", *args, "--accept-baseline-mismatch", expect=0)
    assert accepted["report"]["baseline"]["status"] == "compared"
    assert any("gpu_name 'NVIDIA H100 80GB HBM3' -> 'NVIDIA H200'" in w for w in accepted["warnings"])

    # A baseline file that says it measured another patch set or model (copied from another key).
    named = (*args, "--patch-set", "set-a")
    run_json("validate", *named, "--update-baseline", expect=0)
    path = next(p for p in (tmp_path / "b").glob("*.json") if json.loads(p.read_text())["deployment"]["patch_set"] == "set-a")
    data = json.loads(path.read_text())
    data["provenance"]["patch_set"] = "set-b"
    path.write_text(json.dumps(data))
    assert "patch_set 'set-b' -> 'set-a'" in run_json("validate", *named, expect=2)["error"]["message"]
    data["provenance"].update(patch_set="set-a", model="another-model")
    path.write_text(json.dumps(data))
    assert "model 'another-model' -> 'tiny-reasoner'" in run_json("validate", *named, expect=2)["error"]["message"]
    # A field one side does not know is no difference.
    data["provenance"].update(model="tiny-reasoner", gpu_name=None)
    path.write_text(json.dumps(data))
    assert run_json("validate", *named, expect=0)["report"]["baseline"]["status"] == "compared"


def test_max_model_len_is_read_where_vllm_puts_it():
    class Client:
        def __init__(self, body: object) -> None:
            self.body = body

        def resolve_model(self) -> str:
            return "m"

        def side_request(self, _method: str, path: str) -> tuple[int, object]:
            return (200, self.body) if path == "/v1/models" else (404, None)

    vllm = {"data": [{"id": "other", "max_model_len": 1}, {"id": "m", "max_model_len": 131072}]}
    assert pv.max_model_len_of(Client(vllm)) == (131072, None)  # type: ignore[arg-type]
    assert pv.max_model_len_of(Client({"data": [{"id": "m"}]}))[0] is None  # type: ignore[arg-type]
    assert pv.max_model_len_of(Client({"data": [{"id": "m", "max_model_len": True}]}))[0] is None  # type: ignore[arg-type]


# --- --compare ---------------------------------------------------------------------------------------


@pytest.fixture
def saved(shape_server, tmp_path):
    """Two reports of the same server, as --out writes them."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        run_json("validate", "vllm", "--url", shape_server.base_url, *QUICK, "--threshold", "1000", "--out", str(out))
    return a, b


def compare(*args: str):
    return CliRunner().invoke(main, ["validate", "--compare", *args])


def _edit(path: Path, change) -> None:
    report = json.loads(path.read_text())
    change(report)
    path.write_text(json.dumps(report))


def test_compare_two_runs_of_one_server(saved):
    a, b = saved
    result = compare(str(a), str(b), "--threshold", "1000")
    assert result.exit_code == 0, result.output
    assert f"validate --compare: {b}" in result.stdout and "no regression" in result.stdout
    doc = run_json("validate", "--compare", str(a), str(a), expect=0)
    (check, *_rest) = doc["compare"]["checks"]
    assert check["evidence"] == "samples" and check["samples"] == [8, 8] and not check["significant"]


def test_compare_finds_a_slower_b(saved):
    a, b = saved

    def halve(report):
        for lv in report["throughput"]["levels"]:
            lv["output_tok_s"] /= 2
            lv["samples"]["request_tok_s"] = [x / 2 for x in lv["samples"]["request_tok_s"]]

    _edit(b, halve)
    result = compare(str(a), str(b))
    assert result.exit_code == 1, result.output
    assert "significant and beyond the 5% threshold REGRESSED" in result.stdout and "REGRESSED: 1 figure" in result.stdout


def test_compare_of_reports_without_samples_is_held_to_the_threshold(saved):
    a, b = saved
    for path in saved:
        _edit(path, lambda r: [lv.pop("samples") for lv in r["throughput"]["levels"]])
    doc = run_json("validate", "--compare", str(a), str(b), "--threshold", "1000", expect=0)
    assert {c["evidence"] for c in doc["compare"]["checks"]} == {"no samples in the baseline: threshold only"}


@pytest.mark.parametrize(
    ("field", "change", "said"),
    [
        ("gpu_name", lambda r: r["provenance"].update(gpu_name="NVIDIA A100"), "gpu_name"),
        ("max_tokens", lambda r: r["throughput"].update(max_tokens=256), "max_tokens 6 -> 256"),
        ("model", lambda r: r["deployment"].update(model="other"), "model 'tiny-reasoner' -> 'other'"),
        (
            "patch_set",
            lambda r: (r["deployment"].update(patch_set="new"), r["provenance"].update(patches=[["fix", "ab"]])),
            "patch_set 'unknown' -> 'new'",
        ),
    ],
)
def test_compare_refuses_reports_that_measured_different_things(saved, field, change, said):
    a, b = saved
    _edit(a, lambda r: r["provenance"].update(gpu_name="NVIDIA H200"))
    _edit(b, lambda r: r["provenance"].update(gpu_name="NVIDIA H200"))
    if field == "patch_set":
        _edit(a, lambda r: r["deployment"].update(patch_set="old"))
        said = "patch_set 'old' -> 'new' (patches +fix)"
    _edit(b, change)
    doc = run_json("validate", "--compare", str(a), str(b), expect=2)
    assert said in doc["error"]["message"] and f"--allow-different {field}" in doc["error"]["hint"]
    allowed = run_json("validate", "--compare", str(a), str(b), "--allow-different", field, "--threshold", "1000", expect=0)
    assert [d["field"] for d in allowed["compare"]["differences"]] == [field]
    assert any(w.startswith("compared across a difference you allowed") for w in allowed["warnings"])


def test_compare_bad_input_is_exit_2(saved, tmp_path):
    a, _b = saved
    junk = tmp_path / "junk.json"
    junk.write_text('{"not": "a report"}')
    assert "is not a validate report" in run_json("validate", "--compare", str(a), str(junk), expect=2)["error"]["message"]
    missing = run_json("validate", "--compare", str(a), str(tmp_path / "none"), expect=2)
    assert "no such file" in missing["error"]["message"].lower()
    bad = run_json("validate", "--compare", str(a), str(a), "--allow-different", "colour", expect=2)
    assert "--allow-different colour" in bad["error"]["message"]
    assert run_json("validate", "--compare", str(a), str(a), "--url", "http://x", expect=2)["error"]["kind"] == "usage"
    assert run_json("validate", "vllm", "--url", "http://127.0.0.1:1", "--allow-different", "model", expect=2)
