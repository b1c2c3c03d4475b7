"""The click layer, wired the way patchctl/cli.py wires commands: options, (doc, code), errors -> exit codes."""
import json
import os
import socket
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from patchctl import report
from patchctl.errors import PatchctlError
from patchctl.serve.cli import render_serve_document, serve_options, serve_requested, serve_smoke

SHAPE = str(Path(__file__).with_name("shape_server.py"))


@click.command()
@click.argument("engine")
@serve_options
@click.option("--json", "as_json", is_flag=True)
def smoke(engine, as_json, **opts):
    assert serve_requested(**opts)
    try:
        doc, code = serve_smoke(engine, "digest1", progress=lambda m: click.echo(m, err=True), **opts)
    except PatchctlError as exc:
        click.echo(f"error ({exc.kind}): {exc.message}", err=True)
        raise SystemExit(exc.exit_code)
    if as_json:
        report.emit_json(doc)
    else:
        click.echo(render_serve_document(doc), nl=False)
    raise SystemExit(code)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_runs_stops_and_writes_json_and_png(tmp_path):
    port = free_port()
    out = tmp_path / "r" / "serve.json"
    result = CliRunner().invoke(smoke, [
        # No --serve: the URL comes from the command's --port.
        "vllm", "--start", f"{sys.executable} {SHAPE} --port {port}",
        "--concurrency", "1,2", "--requests", "2", "--max-tokens", "12", "--out", str(out), "--ready-timeout", "20",
    ])
    assert result.exit_code == 0, result.output
    assert "throughput" in result.stdout and "OK" in result.stdout and f"wrote {out}" in result.stdout
    stored = json.loads(out.read_text())
    assert stored["deployment"]["patch_set"] == "digest1" and stored["ok"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    # Stopped: the port is free again and no pid file is left.
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert not list(Path(os.environ["PATCHCTL_DATA_DIR"]).rglob("*.pid"))


def test_json_document_and_failure_exit_code(shape_server):
    shape_server.settings["wrong"] = True
    result = CliRunner().invoke(smoke, ["vllm", "--serve", shape_server.base_url, "--concurrency", "1",
                                        "--requests", "1", "--max-tokens", "4", "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["command"], doc["tier"], doc["ok"], doc["exit_code"]) == ("smoke", "serve", False, 1)
    assert any(f.startswith("answers/arithmetic") for f in doc["serve"]["failures"])
    assert doc["serve"]["throughput"]["levels"][0]["requests"] == 1


def test_text_output_names_failures(shape_server):
    shape_server.settings["wrong"] = True
    result = CliRunner().invoke(smoke, ["vllm", "--serve", shape_server.base_url, "--no-throughput"])
    assert result.exit_code == 1 and "FAILED" in result.stdout and "answers/arithmetic" in result.stdout


def test_usage_errors_exit_2():
    assert CliRunner().invoke(smoke, ["vllm", "--serve", "http://127.0.0.1:1", "--concurrency", "0"]).exit_code == 2
    result = CliRunner().invoke(smoke, ["vllm", "--serve", "http://127.0.0.1:1", "--record-golden"])
    assert result.exit_code == 2 and "--golden PATH" in result.stderr


def test_environment_problems_exit_3(tmp_path):
    port = free_port()
    dead = CliRunner().invoke(smoke, ["vllm", "--serve", f"http://127.0.0.1:{port}"])
    assert dead.exit_code == 3 and "no OpenAI-compatible server answers" in dead.stderr
    broken = CliRunner().invoke(smoke, ["vllm", "--start", f"{sys.executable} -c 'raise SystemExit(7)'",
                                        "--serve", f"http://127.0.0.1:{port}"])
    assert broken.exit_code == 3 and "exited with 7" in broken.stderr
