"""The smoke runner's check tiers on a real wheel served by a local index, with real pytest runs."""

import json
import sys

import pytest
from click.testing import CliRunner
from support.builders import build_wheel
from support.fixtures import PRISTINE, loader_with
from support.index_server import IndexServer

from patchctl.cli.main import main

CHECK = """
import pytest

def test_patched_tree_has_the_change(patched_tree, pristine_tree, engine_version, engine_name):
    assert engine_name == "vllm" and str(engine_version) == "1.0"
    assert "ten" in (patched_tree / "vllm/loader.py").read_text()
    assert "ten" not in (pristine_tree / "vllm/loader.py").read_text()

@pytest.mark.gpu
def test_needs_a_gpu(patched_tree):
    import torch
    assert torch.cuda.is_available()
"""

FAILING = """
def test_wrong_expectation(patched_tree):
    assert "eleven" in (patched_tree / "vllm/loader.py").read_text()
"""


@pytest.fixture
def setup(tmp_path, builder):
    files = tmp_path / "files"
    files.mkdir()
    wheel = build_wheel(files, "vllm", "1.0", PRISTINE)
    variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
    good = builder.add("vllm", "good", variants={"1.0": variant}, extra_meta={"smoke": {"env": "test"}})
    (good / "checks").mkdir()
    (good / "checks" / "test_good.py").write_text(CHECK)
    bad = builder.add("vllm", "bad", variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": "X = 1\n"})})
    (bad / "checks").mkdir()
    (bad / "checks" / "test_bad.py").write_text(FAILING)
    with IndexServer(files) as server:
        server.add("vllm", wheel)
        yield server, builder.root


def smoke(*args):
    result = CliRunner().invoke(main, ["smoke", *args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def test_cpu_tier_runs_checks_and_reports_failures(setup, fresh_cache):
    server, store = setup
    code, doc = smoke("vllm@1.0", "--index-url", server.url, "--store", str(store), "--python", sys.executable)
    by = {r["patch"]: r for r in doc["results"]}
    assert by["good"]["status"] == "passed" and by["good"]["passed"] == 1
    assert by["bad"]["status"] == "failed" and "test_wrong_expectation" in by["bad"]["failures"][0]
    assert code == 1


def test_gpu_tier_says_not_run_without_gpu(setup, fresh_cache):
    server, store = setup
    code, doc = smoke(
        "vllm@1.0",
        "--patch",
        "good",
        "--tier",
        "gpu",
        "--index-url",
        server.url,
        "--store",
        str(store),
        "--python",
        sys.executable,
    )
    (result,) = doc["results"]
    assert result["status"] == "not-run" and result["reason"] == "not run: no GPU"
    assert code == 0


def test_unknown_patch_name_is_usage_error(setup, fresh_cache):
    server, store = setup
    code, doc = smoke("vllm@1.0", "--patch", "nope", "--index-url", server.url, "--store", str(store))
    assert code == 2 and "nope" in doc["error"]["message"]


PROOF_CHECK = """
import pytest

def test_behaves_as_patched(patched_tree):
    texts = [p.read_text() for p in (patched_tree / "vllm/moved.py", patched_tree / "vllm/loader.py") if p.exists()]
    assert any("ten" in t for t in texts)

@pytest.mark.pristine_fails
def test_pristine_lacks_it(pristine_tree):
    assert "ten" not in (pristine_tree / "vllm/loader.py").read_text()
"""


def test_upstreamed_in_is_proven_on_the_pristine_tree(tmp_path, builder, fresh_cache):
    """Upstream moved the code and took the change (no reverse-apply possible): the metadata claim
    is proven by the patch's own checks on the pristine release, minus the pristine-fails ones."""
    files = tmp_path / "files"
    files.mkdir()
    moved = dict(PRISTINE, **{"vllm/moved.py": "ten\n"})
    del moved["vllm/loader.py"]
    moved["vllm/loader.py"] = "# the loader moved to moved.py\n"
    variant = builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})
    folder = builder.add(
        "vllm", "p", applies_to="<1.1", variants={"1.0": variant}, extra_meta={"upstreamed_in": ">=1.1", "smoke": {"env": "test"}}
    )
    (folder / "checks").mkdir()
    (folder / "checks" / "test_p.py").write_text(PROOF_CHECK)
    with IndexServer(files) as server:
        server.add("vllm", build_wheel(files, "vllm", "1.0", PRISTINE))
        server.add("vllm", build_wheel(files, "vllm", "1.1", moved))
        check = CliRunner().invoke(main, ["check", "vllm@1.1", "--index-url", server.url, "--store", str(builder.root), "--json"])
        assert json.loads(check.stdout)["patches"][0]["outcome"] == "upstreamed"
        code, doc = smoke("vllm@1.1", "--index-url", server.url, "--store", str(builder.root), "--python", sys.executable)
        (result,) = doc["results"]
        assert code == 0 and result["status"] == "passed" and result["passed"] == 1
        assert result["reason"].startswith("upstreamed: behaves as patched on the pristine release")
        # and a claim that is false is caught: 1.0 is not upstreamed, the proof run would fail
        code, doc = smoke("vllm@1.0", "--index-url", server.url, "--store", str(builder.root), "--python", sys.executable)
        assert doc["results"][0]["status"] == "passed"  # patched tree of 1.0: the patch itself


def test_a_long_failure_keeps_its_end(tmp_path):
    """A probe's failure starts with its stderr's first lines (often an import-time warning) and
    ends with the traceback that says why: the report keeps both ends of a long message."""
    from xml.sax.saxutils import quoteattr

    from patchctl.smoke.pytest_run import _parse_junit

    message = "probe exited 1:\n" + "The vLLM package was not found.\n" * 200 + "AttributeError: the cause"
    junit = tmp_path / "junit.xml"
    junit.write_text(
        f'<testsuite><testcase classname="test_x" name="test_y"><failure message={quoteattr(message)}/></testcase></testsuite>'
    )
    _, failed, _, failures, _ = _parse_junit(junit)
    assert failed == 1
    (failure,) = failures
    assert failure.startswith("test_x::test_y: probe exited 1:") and failure.endswith("AttributeError: the cause")
    assert len(failure) < 1400 and "characters ...]" in failure
