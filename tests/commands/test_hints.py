"""Every hint runs as printed (issue 36, item 5): the common journeys (not installed, wiped, an
unmanaged edit, an extra missing) are provoked, each backticked `patchctl ...` the document prints is
run as it stands (its placeholders NAME and DIR filled in), and none may be a usage error; a flag
named in prose is one the command that names it has."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.builders import fake_venv, install_fake_dist
from support.fixtures import PRISTINE, four_release_index, loader_with
from support.invoke import run_json

from patchctl.cli.hints import complete_command
from patchctl.cli.main import main

HINT = re.compile(r"`(patchctl [^`\n]+)`")


def texts(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in texts(v)]
    if isinstance(value, dict):
        return [t for k, v in value.items() if k != "diff" for t in texts(v)]
    return []


def hints_of(doc: dict) -> list[str]:
    return [m for t in texts(doc) for m in HINT.findall(t)]


def run_hint(hint: str, fill: dict[str, str]) -> tuple[int, dict]:
    from patchctl.sources import fetch

    # A user runs the hint as a new process: no index client kept from an earlier test's run.
    fetch._index.cache_clear()
    words = [fill.get(w, w) for w in shlex.split(hint)[1:]]
    result = CliRunner().invoke(main, [*words, "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.exit_code, doc


def assert_runs(doc: dict, fill: dict[str, str], *, expect_hints: int = 1) -> list[str]:
    found = hints_of(doc)
    assert len(found) >= expect_hints, doc
    for hint in found:
        code, out = run_hint(hint, fill)
        usage = (out.get("error") or {}).get("kind") == "usage"
        assert code != 2 and not usage, f"`{hint}` exits {code} as printed: {out}"
    return found


@pytest.fixture
def store(builder):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    return builder.root


@pytest.fixture
def wiped(store, tmp_path, monkeypatch):
    """vllm 1.0 for --python, patched, then reinstalled by pip: status says to run ensure."""
    site = tmp_path / "site with space"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    run_json("apply", "vllm", "--python", sys.executable, "--store", str(store), expect=0)
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    return site


def test_status_of_a_wiped_tree_names_the_python_and_ensure_runs_as_printed(wiped, tmp_path):
    doc = run_json("status", "vllm", "--python", sys.executable, expect=1)
    assert f"`patchctl ensure vllm --python {shlex.quote(sys.executable)}`" in doc["message"]
    assert assert_runs(doc, {})
    assert run_json("status", "vllm", "--python", sys.executable, expect=0)["state"] == "intact"


@pytest.mark.parametrize("command", ["status", "diff"])
@pytest.mark.parametrize("where", ["--target", "--python"])
def test_an_unmanaged_edit_names_the_target_and_a_store_for_new(command, where, tmp_path, builder, monkeypatch):
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    (site / "vllm/utils.py").write_text("changed\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    located = [where, str(site) if where == "--target" else sys.executable]
    with four_release_index(tmp_path, builder) as server:
        monkeypatch.setenv("PIP_INDEX_URL", server.url)  # the hint's own run finds the same index
        doc = run_json(command, "vllm", *located, expect=0)
        assert f"`patchctl new vllm NAME {shlex.join(located)} --store DIR`" in doc["note" if command == "status" else "summary"]
        assert_runs(doc, {"NAME": "my-fix", "DIR": str(tmp_path / "mine")})
    assert (tmp_path / "mine/vllm/my-fix").is_dir()


@pytest.mark.parametrize("command", ["status", "ensure", "revert", "apply", "diff"])
def test_not_installed_suggests_only_flags_the_command_has(command, tmp_path):
    python = fake_venv(tmp_path / "venv").parent.parent.parent / "bin" / "python"
    doc = run_json(command, "vllm", "--python", str(python))
    assert doc["exit_code"] == 3 and "is not installed" in doc["error"]["message"]
    hint = doc["error"]["hint"]
    prose = HINT.sub("", re.sub(r"`[^`]*`", "", hint))  # flags named for another command are in backticks
    flags = {o for p in main.get_command(None, command).params for o in getattr(p, "opts", [])}
    assert set(re.findall(r"--[a-z-]+", prose)) <= flags, hint


def test_a_hint_that_names_its_own_target_gets_no_second_one():
    given = [("--python", "/opt/py"), ("--store", "/s")]
    # status has no --store: only the --python is carried; a hint naming --target keeps its own.
    assert complete_command("patchctl ensure vllm", given) == "patchctl ensure vllm --python /opt/py --store /s"
    assert complete_command("patchctl revert vllm --target /t", given) == "patchctl revert vllm --target /t --store /s"
    assert complete_command("patchctl status vllm", given) == "patchctl status vllm --python /opt/py"
    assert complete_command("patchctl nosuch x", given) == "patchctl nosuch x"


def test_the_locating_table_is_the_commands_own():
    """hints.LOCATING (kept as a table so that completing a hint imports no command) against the
    click commands: each command, and each of its options that locates a target."""
    import click

    from patchctl.cli.hints import _LOCATORS, LOCATING, _locates

    real = {}
    for name in main.list_commands(None):
        command = main.get_command(None, name)
        subs = (
            [(f"{name} {s}", command.get_command(None, s)) for s in command.list_commands(None)]
            if isinstance(command, click.Group)
            else [(name, command)]
        )
        for full, c in subs:
            real[full] = frozenset(
                o for p in c.params if isinstance(p, click.Option) and _locates(p) for o in p.opts if o in _LOCATORS
            )
    assert LOCATING == real


def test_the_extra_hint_says_how_under_pipx_uv_and_a_venv():
    from patchctl.validate.outputs import PLOT_NEEDS_EXTRA

    assert "pipx inject patchctl matplotlib" in PLOT_NEEDS_EXTRA
    assert "uv " in PLOT_NEEDS_EXTRA and "pip install" in PLOT_NEEDS_EXTRA


def test_a_refused_connection_in_validate_is_one_short_line():
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        doc = run_json("validate", "vllm", "--url", f"http://127.0.0.1:{port}", "--no-answers", expect=3)
    message = doc["error"]["message"]
    assert "\n" not in message and "MaxRetryError" not in message and "HTTPConnection" not in message, message
    assert "refused" in message and len(message) < 200, message


@pytest.mark.parametrize("command", ["status", "ensure", "revert"])
def test_another_version_installed_points_at_apply_install_with_the_python(command, tmp_path, monkeypatch):
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    monkeypatch.setenv("PYTHONPATH", str(site))
    doc = run_json(command, "vllm@2.0", "--python", sys.executable, expect=2)
    hint = doc["error"]["hint"]
    assert "--install" not in HINT.sub("", hint), hint  # only inside the apply command that has it
    assert f"`patchctl apply vllm@2.0 --install --python {shlex.quote(sys.executable)}`" in hint


def source_hints() -> list[tuple[str, str]]:
    """Every `patchctl COMMAND ...` written between backticks in patchctl's source (an f-string's
    {fields} read as one word): (file, command line)."""
    root = Path(__file__).resolve().parents[2] / "patchctl"
    found = []
    for path in sorted(root.rglob("*.py")):
        for m in re.finditer(r"`(patchctl [a-z][^`\n\"]*)`", path.read_text()):
            found.append((str(path.relative_to(root)), re.sub(r"\{[^}]*\}", "X", m.group(1))))
    return found


@pytest.mark.parametrize(("where", "hint"), source_hints())
def test_every_flag_a_hint_in_the_source_names_is_one_its_command_has(where, hint):
    import click

    words = hint.split()[1:]
    command = main.get_command(None, words[0])
    if command is None:
        pytest.skip(f"{words[0]!r} is not a command (prose: {hint})")
    if isinstance(command, click.Group) and len(words) > 1:
        command = command.get_command(None, words[1]) or command
    flags = {o for p in command.params for o in getattr(p, "opts", [])}
    named = {w.split("=", 1)[0] for w in words if w.startswith("--") and re.fullmatch(r"--[a-z][a-z-]*(=.*)?", w)}
    assert named <= flags, f"{where}: `{hint}` names {sorted(named - flags)}, which {words[0]} does not have"


@pytest.mark.parametrize("where", ["group", "command"])
def test_a_deployment_file_is_carried_and_its_settings_are_not_repeated(where, store, tmp_path):
    site = tmp_path / "site"
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    deployment = tmp_path / "etc" / "vllm.yaml"
    deployment.parent.mkdir()
    deployment.write_text(f"engine: vllm\ntarget: {site}\nstores: [{store}]\n")
    named = ["--deployment", str(deployment), "{}"] if where == "group" else ["{}", "--deployment", str(deployment)]

    def argv(command: str) -> list[str]:
        return [command if w == "{}" else w for w in named]

    run_json(*argv("apply"), expect=0)
    install_fake_dist(site, "vllm", "1.0", PRISTINE)  # pip put the release's files back
    doc = run_json(*argv("status"), expect=1)
    assert doc["state"] == "wiped" and f"`patchctl ensure vllm --deployment {deployment}`" in doc["message"]
    assert "--target" not in doc["message"]  # the file says it: the hint names the file, not its settings
    assert_runs(doc, {})
    assert run_json(*argv("status"), expect=0)["state"] == "intact"
