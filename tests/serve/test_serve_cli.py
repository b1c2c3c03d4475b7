"""The click layer: options parse, --start runs a real server process, exit codes, JSON + PNG."""
import json
import socket
import sys
from pathlib import Path

import click
from click.testing import CliRunner

from patchctl.serve.cli import run_from_cli, serve_options

SHAPE = str(Path(__file__).with_name("shape_server.py"))


@click.command()
@serve_options
def smoke(**opts):
    raise SystemExit(run_from_cli(patch_set="digest1", **opts))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_start_runs_stops_and_writes_json_and_png(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # pid files and baselines
    port = free_port()
    out = tmp_path / "r" / "serve.json"
    result = CliRunner().invoke(smoke, [
        # No --serve: the URL comes from the command's --port.
        "--start", f"{sys.executable} {SHAPE} --port {port}",
        "--concurrency", "1,2", "--requests", "2", "--max-tokens", "12", "--json", str(out), "--ready-timeout", "20",
    ])
    assert result.exit_code == 0, result.output
    assert "throughput" in result.stdout and "OK" in result.stdout
    report = json.loads(out.read_text())
    assert report["deployment"]["patch_set"] == "digest1" and report["ok"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    # Stopped: the port is free again and no pid file is left.
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert not list((tmp_path / "data").rglob("*.pid"))


def test_failures_exit_1_and_bad_options_are_usage_errors(tmp_path, monkeypatch, shape_server):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    shape_server.settings["wrong"] = True
    result = CliRunner().invoke(smoke, ["--serve", shape_server.base_url, "--no-throughput"])
    assert result.exit_code == 1 and "FAILED" in result.stdout and "answers/arithmetic" in result.stdout
    assert CliRunner().invoke(smoke, ["--concurrency", "0"]).exit_code == 2
    assert CliRunner().invoke(smoke, ["--record-golden"]).exit_code == 2


def test_start_of_a_broken_server_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    port = free_port()
    result = CliRunner().invoke(smoke, ["--start", f"{sys.executable} -c 'raise SystemExit(7)'",
                                        "--serve", f"http://127.0.0.1:{port}"])
    assert result.exit_code == 2 and "exited with 7" in result.output
