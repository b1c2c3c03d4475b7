"""`patchctl validate` through the real entry point: options, the document, errors -> exit codes and
documents, the patch set of the baseline key, the optional plot, and the deprecated `smoke --serve`."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json

from patchctl.cli.main import main
from patchctl.validate.outputs import PLOT_NEEDS_EXTRA

SHAPE = "-m support.reasoner"  # the test server's reasoning model, as a process
QUICK = ("--concurrency", "1", "--requests", "1", "--max-tokens", "4")


def validate(*args: str):
    return CliRunner().invoke(main, ["validate", *args])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_runs_stops_and_writes_json_and_png(tmp_path):
    port = free_port()
    out = tmp_path / "r" / "serve.json"
    result = validate(
        # No --url: the URL comes from the command's --port.
        "vllm",
        "--start",
        f"{sys.executable} {SHAPE} --port {port}",
        "--patch-set",
        "digest1",
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--max-tokens",
        "12",
        "--out",
        str(out),
        "--ready-timeout",
        "20",
    )
    assert result.exit_code == 0, result.output
    assert "throughput" in result.stdout and "OK" in result.stdout and f"wrote {out}" in result.stdout
    stored = json.loads(out.read_text())
    # An explicit --patch-set is the baseline key's patch set, verbatim.
    assert stored["deployment"]["patch_set"] == "digest1" and stored["ok"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    # Stopped: the port is free again and no pid file is left.
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert not list(Path(os.environ["PATCHCTL_DATA_DIR"]).rglob("*.pid"))


def test_json_document_and_failure_exit_code(shape_server):
    shape_server.settings["wrong"] = True
    result = validate("vllm", "--url", shape_server.base_url, *QUICK, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["command"], doc["ok"], doc["exit_code"], doc["error"]) == ("validate", False, 1, None)
    assert (doc["engine"], doc["url"], doc["started"], doc["files"]) == ("vllm", shape_server.base_url, False, None)
    assert any(f.startswith("answers/arithmetic") for f in doc["report"]["failures"])
    assert doc["report"]["throughput"]["levels"][0]["requests"] == 1
    # Nothing says which patches the server runs: the baseline key says so.
    assert (doc["patch_set_from"], doc["report"]["deployment"]["patch_set"]) == ("unknown", "unknown")


def test_text_output_names_failures(shape_server):
    shape_server.settings["wrong"] = True
    result = validate("vllm", "--url", shape_server.base_url, "--no-throughput")
    assert result.exit_code == 1 and "FAILED" in result.stdout and "answers/arithmetic" in result.stdout


def test_usage_errors_exit_2():
    assert validate("vllm", "--url", "http://127.0.0.1:1", "--concurrency", "0").exit_code == 2
    result = validate("vllm", "--url", "http://127.0.0.1:1", "--record-golden")
    assert result.exit_code == 2 and "--golden PATH" in result.stderr
    assert validate("vllm", "--url", "127.0.0.1:8000").exit_code == 2  # no scheme


def test_neither_url_nor_start_is_a_usage_document():
    doc = run_json("validate", "vllm", expect=2)
    assert (doc["command"], doc["error"]["kind"]) == ("validate", "usage")
    assert "--url URL" in doc["error"]["message"] and "--start CMD" in doc["error"]["message"]
    text = validate("vllm")
    assert text.exit_code == 2 and "--url URL" in text.stderr and "Traceback" not in text.output


def test_a_bad_golden_file_is_a_usage_document_not_a_traceback(shape_server, tmp_path):
    bad = tmp_path / "bad.json"
    for content in ("this is not JSON", json.dumps({"format": 1, "entries": "no"})):
        bad.write_text(content)
        result = validate("vllm", "--url", shape_server.base_url, "--golden", str(bad), "--json")
        assert result.exit_code == 2, result.output
        doc = json.loads(result.stdout)  # one document, nothing else on stdout
        assert (doc["command"], doc["exit_code"], doc["error"]["kind"]) == ("validate", 2, "usage")
        assert f"{bad} is not a golden file" in doc["error"]["message"]
    # Found before the server is asked anything.
    assert shape_server.requests == []


def test_environment_problems_exit_3(tmp_path):
    port = free_port()
    dead = validate("vllm", "--url", f"http://127.0.0.1:{port}")
    assert dead.exit_code == 3 and "no OpenAI-compatible server answers" in dead.stderr
    broken = validate("vllm", "--start", f"{sys.executable} -c 'raise SystemExit(7)'", "--url", f"http://127.0.0.1:{port}")
    assert broken.exit_code == 3 and "exited with 7" in broken.stderr
    doc = run_json("validate", "vllm", "--url", f"http://127.0.0.1:{port}", expect=3)
    assert doc["error"]["kind"] == "network"
    missing = run_json("validate", "vllm", "--start", "no-such-server-command --port 1", expect=3)
    assert missing["error"]["kind"] == "environment" and "no-such-server-command" in missing["error"]["message"]


def test_patch_set_of_a_pristine_tree_is_none(shape_server, tree):
    doc = run_json(
        "validate", "vllm@1.0", "--url", shape_server.base_url, "--target", str(tree), "--no-answers", "--no-throughput", expect=0
    )
    assert (doc["patch_set_from"], doc["target"]) == ("target", str(tree))
    assert doc["report"]["deployment"]["patch_set"] == "none"


def test_patch_set_follows_what_is_applied_to_the_tree(shape_server, tree, builder):
    patched = {"vllm/loader.py": loader_with({10: "ten\n"})}
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, patched)})
    args = ("--url", shape_server.base_url, "--target", str(tree), "--no-answers", "--no-throughput")
    run_json("apply", "vllm@1.0", "--target", str(tree), "--store", str(builder.root), expect=0)
    applied = run_json("validate", "vllm@1.0", *args, expect=0)["report"]["deployment"]["patch_set"]
    assert applied not in ("none", "unknown") and len(applied) == 16
    # --patch-set wins over the tree.
    named = run_json("validate", "vllm@1.0", *args, "--patch-set", "my-set", expect=0)
    assert (named["patch_set_from"], named["report"]["deployment"]["patch_set"]) == ("option", "my-set")
    run_json("revert", "vllm@1.0", "--target", str(tree), expect=0)
    assert run_json("validate", "vllm@1.0", *args, expect=0)["report"]["deployment"]["patch_set"] == "none"


def test_out_without_matplotlib_writes_the_json_and_warns(shape_server, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    # No thinking: with QUICK's max_tokens 4 a reasoning model ends inside its reasoning, which warns too.
    shape_server.settings["reasoning"] = False
    out = tmp_path / "r.json"
    result = validate("vllm", "--url", shape_server.base_url, "--no-answers", *QUICK, "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["files"] == {"json": str(out), "png": None}
    assert doc["warnings"] == [PLOT_NEEDS_EXTRA]
    assert json.loads(out.read_text())["ok"] and not out.with_suffix(".png").exists()


def test_help_and_no_heavy_imports():
    help_text = validate("--help")
    assert help_text.exit_code == 0 and "--url URL" in help_text.output and "Examples:" in help_text.output
    code = (
        "import patchctl.cli.commands.validate, sys; "
        "print([m for m in ('requests', 'git', 'rich', 'matplotlib') if m in sys.modules])"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
