"""`patchctl validate --demo` (issue 36, item 3): validate without a GPU, in one command, against a
demo server it starts in-process and stops; in the package, stdlib only."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from click.testing import CliRunner

from patchctl.cli.main import main


def test_validate_demo_json_is_one_document_whose_checks_passed_in_under_30_s(tmp_path):
    t0 = time.monotonic()
    # A process of its own, as a user runs it: the server's threads and port end with it.
    proc = subprocess.run(
        [sys.executable, "-m", "patchctl.cli", "validate", "--demo", "--json", "--baseline-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)  # exactly one document: json.loads refuses trailing text
    assert doc["ok"] and doc["command"] == "validate" and doc["report"]["failures"] == []
    answers = doc["report"]["answers"]
    assert [a["name"] for a in answers] == ["fact", "arithmetic", "counting", "code"] and all(a["passed"] for a in answers)
    levels = doc["report"]["throughput"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 8, 32] and all(lv["failed"] == 0 for lv in levels)
    assert doc["report"]["bad_reply_count"] == 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert elapsed < 30, f"validate --demo took {elapsed:.1f} s"


def test_demo_is_refused_with_a_server_of_the_users():
    result = CliRunner().invoke(main, ["validate", "--demo", "--url", "http://127.0.0.1:1", "--json"])
    assert result.exit_code == 2 and "--demo starts its own server" in json.loads(result.stdout)["error"]["message"]


def test_engine_is_still_required_without_demo():
    result = CliRunner().invoke(main, ["validate", "--url", "http://127.0.0.1:1"])
    assert result.exit_code == 2 and "Missing argument 'ENGINE'" in result.output


def test_the_demo_server_streams_usage_and_answers_non_streamed_requests():
    import requests

    from patchctl.validate.demo import MODEL, DemoServer

    with DemoServer() as server:
        assert requests.get(f"{server.base_url}/v1/models", timeout=5).json()["data"][0]["id"] == MODEL
        body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 17 * 23?"}], "max_tokens": 64}
        whole = requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=5).json()
        assert whole["choices"][0]["message"]["content"] == "391" and whole["usage"]["completion_tokens"] == 5
        streamed = requests.post(
            f"{server.base_url}/v1/chat/completions",
            timeout=5,
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
        )
        events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 5
        assert requests.post(f"{server.base_url}/v1/chat/completions", data=b"[1]", timeout=5).status_code == 400
