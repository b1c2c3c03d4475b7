"""The deployment file (--deployment FILE, PATCHCTL_DEPLOYMENT): what is wrong in one is a usage error
naming the file, the line and the key; its settings fill the commands' options, and the command line
wins over the file, which wins over the defaults; relative paths are relative to the file."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from support.builders import install_fake_dist
from support.fixtures import PRISTINE, loader_with
from support.invoke import heavy_imports, run_json

from patchctl.cli.main import main


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o644)  # whatever the umask: a deployment file its group may write is refused
    return path


def command_of(name: str) -> click.Command:
    cmd = main.get_command(click.Context(main), name)
    assert cmd is not None
    return cmd


def context(command: str, *args: str) -> click.Context:
    """The command's context after click read `args`: its parameters as the command would get them."""
    cmd = main.get_command(click.Context(main), command)
    assert cmd is not None
    return cmd.make_context(command, list(args))


@pytest.fixture
def served(builder, tmp_path):
    """Two stores with one patch each, a vllm 1.0 tree, and a deployment file naming store `a` and the
    tree with relative paths."""
    change = {"vllm/loader.py": loader_with({10: "ten\n"})}
    builder.add("vllm", "from-a", variants={"1.0": builder.variant(PRISTINE, change)})
    other = type(builder)(tmp_path / "b")
    other.add("vllm", "from-b", variants={"1.0": other.variant(PRISTINE, change)})
    install_fake_dist(tmp_path / "site", "vllm", "1.0", PRISTINE)
    etc = tmp_path / "etc"
    etc.mkdir()
    deployment = write(etc / "vllm.yaml", "engine: vllm\ntarget: ../site\nstores: [../store]\nwait: 7\n")
    return deployment, tmp_path


# --- what is wrong in a file: exit 2, the file, the line, the key -----------------------------------

BAD = [
    ("engine: vllm\nwait: 60\nstorse: [a]\n", ["line 3", "storse", "not a key"]),
    ("engine: vllm\nvalidate:\n  url: http://x\n  concurency: [1, 8]\n", ["line 4", "validate.concurency"]),
    ("engine: vllm\nwait: soon\n", ["line 2", "wait", "number"]),
    ("engine: vllm\nwait: true\n", ["line 2", "wait", "number"]),
    ("engine: vllm\nstores:\n  - a\n  - 3\n", ["line 4", "stores[1]", "string"]),
    ("engine: vllm\nvalidate:\n  requests: 0\n", ["line 3", "validate.requests"]),
    ("engine: vllm\nsource: 0.5\n", ["line 2", "source", "string"]),
    ("python: /usr/bin/python3\n", ["engine: missing"]),
    ("engine: tensorrt\n", ["line 1", "unknown engine 'tensorrt'"]),
    ("engine: vllm\npython: /p\ntarget: /t\n", ["line 3", "python and target"]),
    ("- engine: vllm\n", ["must hold a mapping"]),
    ("", ["must hold a mapping", "not nothing"]),
    ("engine: vllm\nstores: [a\n", ["not valid YAML", "line"]),
]


@pytest.mark.parametrize(("text", "said"), BAD, ids=[b[1][0] + "-" + str(i) for i, b in enumerate(BAD)])
def test_a_bad_file_is_a_usage_error_naming_line_and_key(tmp_path, text, said):
    path = write(tmp_path / "d.yaml", text)
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert doc["error"]["kind"] == "usage" and str(path) in doc["error"]["message"]
    for words in said:
        assert words in doc["error"]["message"], (words, doc["error"])


def test_an_unquoted_version_gets_the_hint_to_quote_it(tmp_path):
    doc = run_json("ensure", "--deployment", str(write(tmp_path / "d.yaml", "engine: vllm\nsource: 1.0\n")), expect=2)
    assert "quote" in doc["error"]["hint"]


def test_a_missing_file_is_a_usage_error(tmp_path):
    doc = run_json("ensure", "--deployment", str(tmp_path / "nope.yaml"), expect=2)
    assert "does not exist" in doc["error"]["message"]


def test_text_mode_prints_the_error_and_its_hint_without_a_traceback(tmp_path):
    path = write(tmp_path / "d.yaml", "engine: vllm\nwiat: 60\n")
    result = CliRunner().invoke(main, ["ensure", "--deployment", str(path)])
    assert result.exit_code == 2
    assert "error (usage): deployment file" in result.output and "line 2: wiat: not a key" in result.output
    assert "  hint: " in result.output
    assert "Traceback" not in result.output


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a link owned by another user")
def test_a_symlink_another_user_planted_is_refused(tmp_path):
    real = write(tmp_path / "real.yaml", "engine: vllm\n")
    link = tmp_path / "d.yaml"
    link.symlink_to(real)
    os.lchown(link, 65534, 65534)
    doc = run_json("ensure", "--deployment", str(link), expect=2)
    assert "symlink owned by uid 65534" in doc["error"]["message"]


def test_a_symlink_of_this_user_is_followed(served, tmp_path):
    deployment, _ = served
    link = tmp_path / "link.yaml"
    link.symlink_to(deployment)
    assert run_json("ensure", "--deployment", str(link), expect=0)["deployment"] == str(deployment)


def test_a_file_everyone_may_write_is_refused(tmp_path):
    path = write(tmp_path / "d.yaml", "engine: vllm\n")
    path.chmod(0o666)
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert "writable by everyone" in doc["error"]["message"]


def test_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "d.yaml"
    os.mkfifo(fifo)
    doc = run_json("ensure", "--deployment", str(fifo), expect=2)
    assert "not a regular file" in doc["error"]["message"]


def test_a_huge_file_is_refused(tmp_path):
    path = write(tmp_path / "d.yaml", "engine: vllm\n" + "#" * (2 << 20) + "\n")
    doc = run_json("ensure", "--deployment", str(path), expect=2)
    assert "more than a deployment file may be" in doc["error"]["message"]


# --- precedence: command line > file > defaults ---------------------------------------------------


def test_the_file_fills_the_command_and_names_itself(served, monkeypatch, tmp_path):
    deployment, root = served
    monkeypatch.chdir(tmp_path.parent)  # relative paths are the file's, not the working directory's
    doc = run_json("ensure", "--deployment", str(deployment), expect=0)
    assert doc["deployment"] == str(deployment)
    assert doc["target"] == str(root / "site")
    assert [p["name"] for p in doc["patches"]] == ["from-a"]
    assert "ten" in (root / "site/vllm/loader.py").read_text()


def test_the_command_line_beats_the_file(served):
    deployment, root = served
    doc = run_json("apply", "--deployment", str(deployment), "--store", str(root / "b"), expect=0)
    assert [p["name"] for p in doc["patches"]] == ["from-b"]
    params = context("ensure", "--deployment", str(deployment), "--wait", "1", "--store", "/x").params
    assert params["wait"] == 1.0 and params["stores"] == ("/x",)


def test_the_file_beats_the_defaults_and_the_defaults_fill_the_rest(served):
    deployment, root = served
    params = context("ensure", "--deployment", str(deployment)).params
    assert params["wait"] == 7.0  # the file's; the default is 0
    assert params["target_dir"] == str(root / "site") and params["python"] is None
    assert params["spec"] == "vllm"
    assert params["allow_fuzz"] is False and params["no_bundled"] is False  # not in the file: the defaults
    assert context("ensure", "vllm", "--target", "/t").params["wait"] == 0.0


def test_an_engine_argument_on_the_command_line_wins(served):
    deployment, _ = served
    assert context("ensure", "vllm@1.0", "--deployment", str(deployment)).params["spec"] == "vllm@1.0"


def test_source_completes_the_engine_argument(tmp_path):
    path = write(tmp_path / "d.yaml", 'engine: sglang\nsource: "0.5.10"\nnightly_source: https://mirror.example/sglang.git\n')
    params = context("check", "--deployment", str(path)).params
    assert params["spec"] == "sglang@0.5.10"
    assert params["nightly_source"] == "https://mirror.example/sglang.git"


@pytest.mark.parametrize(
    ("source", "spec"),
    [
        ("file:wheels/sglang.whl", "sglang@file:{d}/wheels/sglang.whl"),
        ("./checkout", "sglang@{d}/checkout"),
        ("git:main", "sglang@git:main"),
        ("nightly", "sglang@nightly"),
    ],
)
def test_a_relative_source_is_the_files(tmp_path, source, spec):
    path = write(tmp_path / "d.yaml", f"engine: sglang\nsource: {source}\n")
    assert context("check", "--deployment", str(path)).params["spec"] == spec.format(d=tmp_path)


def test_validate_takes_its_settings(tmp_path):
    path = write(
        tmp_path / "d.yaml",
        "engine: sglang\npython: venv/bin/python\nvalidate:\n"
        "  url: http://127.0.0.1:30000\n  concurrency: [1, 4]\n  requests: 20\n  max_tokens: 64\n"
        "  baseline_dir: baselines\n  shared_prompt: true\n  timeout: 45\n  level_timeout: 600\n",
    )
    params = context("validate", "--deployment", str(path), "--max-tokens", "32").params
    assert params["shared_prompt"] is True
    assert params["timeout"] == 45 and params["level_timeout"] == 600
    assert params["engine"] == "sglang" and params["url"] == "http://127.0.0.1:30000"
    assert params["concurrency"] == (1, 4) and params["requests_per_level"] == 20
    assert params["max_tokens"] == 32  # the command line's
    assert params["python"] == str(tmp_path / "venv/bin/python")
    assert params["baseline_dir"] == tmp_path / "baselines"
    # Absent from the file, the option's default: unique prompts.
    path = write(tmp_path / "e.yaml", "engine: sglang\nvalidate:\n  url: http://127.0.0.1:30000\n")
    assert context("validate", "--deployment", str(path)).params["shared_prompt"] is False


def test_python_fills_only_the_engines_interpreter(tmp_path):
    """smoke's --python is the interpreter the checks run with: the file's `python` is not it."""
    path = write(tmp_path / "d.yaml", "engine: vllm\npython: /opt/vllm/bin/python\n")
    assert context("status", "--deployment", str(path)).params["python"] == "/opt/vllm/bin/python"
    assert context("smoke", "--deployment", str(path)).params["python"] is None


def test_a_bare_interpreter_name_is_left_to_path(tmp_path):
    path = write(tmp_path / "d.yaml", "engine: vllm\npython: python3\n")
    assert context("status", "--deployment", str(path)).params["python"] == "python3"


def test_bundled_false_leaves_the_bundled_set_out(tmp_path):
    path = write(tmp_path / "d.yaml", "engine: vllm\nbundled: false\nstores: [s]\n")
    params = context("lint", "--deployment", str(path)).params
    assert params["no_bundled"] is True and params["stores"] == (str(tmp_path / "s"),)


@pytest.mark.parametrize("command", ["apply", "ensure"])
def test_patches_and_exclude_fill_patch_and_exclude(tmp_path, command):
    path = write(tmp_path / "d.yaml", "engine: vllm\npatches: [a, b]\nexclude: [c]\n")
    cmd = context(command, "--deployment", str(path))
    by_flag = {o: cmd.params[p.name] for p in cmd.command.params for o in getattr(p, "opts", ()) if p.name in cmd.params}
    assert tuple(by_flag["--patch"]) == ("a", "b") and tuple(by_flag["--exclude"]) == ("c",)


def test_revert_takes_every_patch_out_whatever_the_file_chose(tmp_path):
    """On commands shaped as apply and revert (their --patch/--exclude are helper record's): apply gets
    the file's choice, revert none."""
    from patchctl.cli.deployment import load

    used = load(write(tmp_path / "d.yaml", "engine: vllm\npatches: [a]\nexclude: [c]\n"))
    params = [click.Option(["--patch", "only"], multiple=True), click.Option(["--exclude"], multiple=True)]
    assert used.defaults_for(click.Command("apply", params=params)) == {"only": ("a",), "exclude": ("c",)}
    assert used.defaults_for(click.Command("revert", params=params)) == {}


def test_patches_fill_checks_patch_option(tmp_path):
    path = write(tmp_path / "d.yaml", "engine: vllm\npatches: [a, b]\n")
    assert context("check", "--deployment", str(path)).params["only"] == ("a", "b")


# --- where the file is named --------------------------------------------------------------------


def test_the_environment_variable_names_it(served, monkeypatch):
    deployment, root = served
    monkeypatch.setenv("PATCHCTL_DEPLOYMENT", str(deployment))
    doc = run_json("ensure", expect=0)
    assert doc["deployment"] == str(deployment) and doc["target"] == str(root / "site")
    assert run_json("status", expect=0)["deployment"] == str(deployment)


def test_the_group_option_names_it(served):
    deployment, root = served
    doc = run_json("--deployment", str(deployment), "ensure", expect=0)
    assert doc["deployment"] == str(deployment) and doc["target"] == str(root / "site")


def test_the_commands_option_beats_the_environment(served, monkeypatch, tmp_path):
    deployment, _ = served
    monkeypatch.setenv("PATCHCTL_DEPLOYMENT", str(tmp_path / "absent.yaml"))
    assert run_json("ensure", "--deployment", str(deployment), expect=0)["deployment"] == str(deployment)


def test_every_command_takes_it():
    from patchctl.cli.main import COMMANDS

    for name in COMMANDS:
        cmd = main.get_command(click.Context(main), name)
        assert cmd is not None and any(p.name == "deployment" for p in cmd.params), name


def test_help_works_with_a_broken_deployment_in_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PATCHCTL_DEPLOYMENT", str(write(tmp_path / "d.yaml", "nonsense: 1\n")))
    result = CliRunner().invoke(main, ["ensure", "--help"])
    assert result.exit_code == 0 and "--deployment FILE" in result.output


DEPLOYMENT_HEAVY = ("requests", "git", "rich", "matplotlib", "urllib3", "platformdirs")


def test_ensure_with_a_deployment_imports_nothing_heavy(served):
    deployment, _ = served
    run_json("ensure", "--deployment", str(deployment), expect=0)
    report = heavy_imports(["ensure", "--deployment", str(deployment)], DEPLOYMENT_HEAVY)
    assert report == {"exit": 0, "heavy": []}
