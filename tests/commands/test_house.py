"""The command layer: the ordered registry, examples in every --help, --json on click's own usage
errors, and the defects the redesign fixed (each reproduced first on the old code)."""
import json
import sys
import time

import pytest
from click.testing import CliRunner

from patchctl.cli import COMMANDS, SECTIONS, main
from patchctl.testing.fixtures import PRISTINE, loader_with


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def every_command():
    for name in COMMANDS:
        yield (name,)
    yield ("matrix", "merge")
    yield ("matrix", "diff")


@pytest.mark.parametrize("words", list(every_command()), ids=" ".join)
def test_every_help_has_an_example(words):
    result = invoke(*words, "--help")
    assert result.exit_code == 0, result.output
    assert "Examples:" in result.output
    examples = result.output.split("Examples:", 1)[1]
    assert "patchctl " + words[0] in examples


def test_help_lists_commands_in_workflow_order():
    text = invoke("--help").output
    names = [name for section in SECTIONS.values() for name in section]
    positions = [text.index(f"\n  {name} ") for name in names]
    assert positions == sorted(positions)
    assert names.index("check") < names.index("apply") < names.index("ensure") < names.index("rebase")


@pytest.mark.parametrize("args,option", [
    (["rebase", "vllm", "--onto", "not-a-version"], "--onto"),
    (["rebase", "vllm", "--onto", "0.23.0", "--from", "x.y"], "--from"),
    (["resolve", "vllm", ".", "--patch", "p", "--onto", "1..2"], "--onto"),
])
def test_a_bad_version_option_names_that_option(args, option):
    """Was: `--as-version 'not-a-version' is not a PEP 440 version` for --onto."""
    result = invoke(*args, "--json")
    doc = json.loads(result.stdout)  # one document, also for a usage error click found
    assert result.exit_code == 2 and doc["exit_code"] == 2 and doc["error"]["kind"] == "usage"
    assert option in doc["error"]["message"] and "--as-version" not in doc["error"]["message"]
    text = invoke(*args)
    assert text.exit_code == 2 and option in text.output


def test_click_usage_errors_are_one_json_document():
    result = invoke("check", "--json")  # the SPEC argument is missing
    doc = json.loads(result.stdout)
    assert result.exit_code == 2 and doc["command"] == "check" and "ENGINE@VERSION" in doc["error"]["message"]


def test_bisect_with_non_versions_is_a_usage_error(builder):
    """Was: a raw InvalidVersion traceback."""
    builder.add("vllm", "p", applies_to=">=1.0",
                variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({3: "x\n"})})})
    for spelling in (["--from", "x", "--to", "y"], ["--good", "x", "--bad", "y"]):
        result = invoke("bisect", "vllm", "p", *spelling, "--store", str(builder.root), "--json")
        doc = json.loads(result.stdout)
        assert result.exit_code == 2 and "must be releases" in doc["error"]["message"]
    # the old spelling (PATCH --engine ENGINE) still works
    result = invoke("bisect", "p", "--engine", "vllm", "--from", "x", "--to", "y", "--store", str(builder.root),
                    "--json")
    assert result.exit_code == 2 and "must be releases" in json.loads(result.stdout)["error"]["message"]


def test_status_wait_is_honoured(tree):
    """Was: --wait accepted and ignored (the lock wait was hard-coded to 30 s)."""
    from patchctl.engines import get_engine
    from patchctl.tree.operations import Target

    target = Target(get_engine("vllm"), tree, None, "test")
    with target.state().locked():
        start = time.monotonic()
        result = invoke("status", "vllm", "--target", str(tree), "--as-version", "1.0", "--wait", "0.5", "--json")
        elapsed = time.monotonic() - start
    doc = json.loads(result.stdout)
    assert result.exit_code == 3 and "another patchctl" in doc["error"]["message"]
    assert 0.4 < elapsed < 10


def test_status_and_revert_take_only_target_options():
    for name in ("status", "revert"):
        text = invoke(name, "--help").output
        for ignored in ("--strict", "--allow-modified") if name == "revert" else ("--index-url", "--store", "--strict"):
            assert ignored not in text, (name, ignored)


def test_list_text_mode_with_a_missing_store_is_an_error_not_a_crash(tmp_path):
    """Was: KeyError: 'series' from the text renderer."""
    result = CliRunner().invoke(main, ["list", "--store", str(tmp_path / "nope")])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2 and "does not exist" in result.output


def test_python_help_says_what_python_is_for():
    assert "run the patches' checks" in invoke("smoke", "--help").output
    assert "run the patches' checks" in invoke("rebase", "--help").output
    assert "holds the engine" in invoke("apply", "--help").output


def test_rebase_verification_never_writes_the_reviewed_store(builder, monkeypatch):
    """Was: the candidate variant was written into patches/ while its checks ran."""
    from patchctl.commands.rebase import verify_with_smoke
    from patchctl.smoketest import suite as smoke
    from patchctl.sources.fetch import SourceContext
    from patchctl.store import Store

    builder.add("vllm", "p", applies_to=">=1.0",
                variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({3: "x\n"})})})
    store = Store.open(builder.root)
    seen = {}

    def fake_gate(candidate_store, ctx, python):
        def gate(patch, version, options=None):
            seen["reviewed"] = (builder.root / "vllm/p/1.1.patch").exists()
            seen["candidate"] = (patch.directory / "1.1.patch").read_bytes()
            seen["pinned_ok"] = options.allow_modified
            return True, "passed"
        return gate

    monkeypatch.setattr(smoke, "cpu_gate", fake_gate)
    from packaging.version import Version

    ok, why = verify_with_smoke(store, SourceContext(), sys.executable)(store.series("vllm").get("p"), Version("1.1"),
                                                                       b"candidate bytes")
    assert ok and seen == {"reviewed": False, "candidate": b"candidate bytes", "pinned_ok": True}
    assert not (builder.root / "vllm/p/1.1.patch").exists()


def test_bisect_smoke_gate_is_called_per_release(monkeypatch, builder):
    """Was: bisect --smoke called the gate with the wrong arguments (a TypeError at the first release)."""
    from patchctl.commands import bisect
    from patchctl.rebase import first_break
    from patchctl.smoketest import suite as smoke

    calls = []

    def fake_gate(store, ctx, python):
        def gate(patch, version, options=None):
            calls.append((patch.name, str(version)))
            return True, "passed"
        return gate

    captured = {}

    def fake_predicate(patch, series, ctx, engine, gate):
        captured["gate"] = gate
        return lambda point: (True, "ok")

    builder.add("vllm", "p", applies_to=">=1.0",
                variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({3: "x\n"})})})
    monkeypatch.setattr(smoke, "cpu_gate", fake_gate)
    monkeypatch.setattr(first_break, "release_predicate", fake_predicate)
    monkeypatch.setattr(first_break, "bisect", lambda points, predicate: first_break.BisectResult("1.1", "1.0", ()))

    class Index:
        def project(self, name):
            class P:
                def versions(self):
                    from packaging.version import Version
                    return [Version("1.0"), Version("1.1")]
            return P()

    class Ctx:
        repo = None
        def index(self):
            return Index()

    from patchctl.store import Store
    doc, code = bisect.run("vllm", "p", Store.open(builder.root), Ctx(), good="1.0", bad="1.1", smoke=True)
    assert code == 0
    from packaging.version import Version
    assert captured["gate"](Version("1.1")) == (True, "passed") and calls == [("p", "1.1")]
