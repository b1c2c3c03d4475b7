"""Every `--json` document has a schema (patchctl/core/schemas/output/), and every command's real
documents validate against it: each command is run in-process on the synthetic releases of a local
index (support.fixtures), in its success form and in its failure forms (a usage error, an error of the
command's own, a crash). A renamed, missing, extra or mistyped key fails (the mutation tests), so
the schemas are strict enough to notice a document that changed shape. docs/json-schema.md is
generated from the schemas (scripts/json_schema_doc.py) and must be what the script writes."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from support.builders import install_fake_dist
from support.fixtures import PRISTINE, four_release_index, loader_with

from patchctl.core import errors, outcomes
from patchctl.core import schemas as S

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = S.output_schema("envelope")["properties"]["command"]["enum"]


def _registry() -> Registry:
    # Each schema by its file name: `"$ref": "envelope.json"` resolves as it does beside the files.
    return Registry().with_resources(
        [(f"{name}.json", Resource.from_contents(S.output_schema(name))) for name in S.output_schema_names()]
    )


VALIDATORS = {name: Draft202012Validator(S.output_schema(name), registry=_registry()) for name in S.output_schema_names()}


def problems(doc: dict) -> list[str]:
    """What is wrong with `doc` by the schema its `command` names (the envelope's, with no such command)."""
    try:
        validator = VALIDATORS[S.output_schema_of(doc["command"])]
    except KeyError:
        validator = VALIDATORS["envelope"]
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def invoke(*args: str) -> tuple[int, dict]:
    """`patchctl ARGS --json` in-process: the exit code and the document, which must validate."""
    from patchctl.cli.main import main

    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.exit_code, doc
    wrong = problems(doc)
    assert not wrong, (args, wrong, doc)
    for key in doc:  # the mutation check on the real document: any key renamed is noticed
        renamed = {(f"{k}_renamed" if k == key else k): v for k, v in doc.items()}
        assert problems(renamed), (args, key)
    return result.exit_code, doc


# --- the schemas themselves ---------------------------------------------------------------------


@pytest.mark.parametrize("name", S.output_schema_names())
def test_each_output_schema_is_a_valid_2020_12_schema(name):
    Draft202012Validator.check_schema(S.output_schema(name))


def test_every_command_has_one_schema_and_the_package_ships_them():
    from patchctl.cli.main import COMMANDS as registered

    commands = set(registered)
    named = set(COMMANDS) - {"patchctl", "matrix-merge", "matrix-diff"}
    assert named == commands, named ^ commands
    assert {S.output_schema_of(c) for c in COMMANDS} == set(S.output_schema_names()[1:])
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"core/schemas/output/*.json"' in pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]


def test_the_enums_are_the_codes():
    """The error kinds and patch outcomes the schemas allow are those the code has, no more, no fewer."""
    defs = S.output_schema("envelope")["$defs"]
    kinds = {cls.kind for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, errors.PatchctlError)}
    assert set(defs["error"]["properties"]["kind"]["enum"]) == kinds
    assert set(defs["patch"]["properties"]["outcome"]["enum"]) == set(outcomes.ALL)


# --- every command's real documents ---------------------------------------------------------------


@pytest.fixture
def seen() -> Iterator[dict[str, set]]:
    """Which commands gave a document without an error, and which one with an error."""
    forms: dict[str, set] = {"ok": set(), "error": set(), "exit": set()}
    yield forms


def _run(seen: dict[str, set], *args: str, expect: int) -> dict:
    code, doc = invoke(*args)
    assert code == expect, doc
    seen["error" if doc["error"] else "ok"].add(doc["command"])
    seen["exit"].add(code)
    return doc


def test_every_command_s_documents_validate(tmp_path, builder, seen, monkeypatch):
    with four_release_index(tmp_path, builder) as server:
        index = ("--index-url", server.url)
        store = ("--store", str(builder.root))
        site = tmp_path / "site"
        install_fake_dist(site, "vllm", "1.0", PRISTINE)
        tree = ("--target", str(site))
        run = lambda *args, expect=0: _run(seen, *args, expect=expect)  # noqa: E731

        # the release commands: loader is clean on 1.0 and conflicts on 1.2
        run("check", "vllm@1.0", *index, *store)
        assert run("check", "vllm@1.2", *index, *store, expect=1)["patches"][0]["outcome"] == "conflict"
        run("export", "vllm@1.0", str(tmp_path / "out"), *index, *store)
        run("export", "vllm@1.2", str(tmp_path / "out2"), *index, *store, expect=1)
        run("export", "vllm@1.0", str(tmp_path / "out"), *index, *store, expect=2)  # not empty
        run("list", *store)
        run("list", "vllm@1.0", *index, *store)
        run("show", "loader", "vllm@1.0", *index, *store)
        run("show", "nope", *store, expect=2)
        run("lint", *store)
        run("pin", *store)
        run("droppable", *index, *store)
        run("bisect", "vllm", "loader", "--from", "1.0", "--to", "1.2", *index, *store)
        run("bisect", "vllm", "loader", "--from", "1.2", "--to", "1.0", *index, *store, expect=2)

        # a tree, through its life: status, apply, ensure, a hand edit captured, reverts, drift
        run("status", "vllm", *tree)
        run("apply", "vllm", *tree, *store, *index)
        run("status", "vllm", *tree)
        run("ensure", "vllm", *tree, *store, *index)
        (site / "vllm/utils.py").write_text(PRISTINE["vllm/utils.py"] + "# by hand\n")
        assert run("diff", "vllm", *tree, *index)["files"]
        mine = tmp_path / "mine"
        run("new", "vllm", "edit", *tree, "--store", str(mine), "--title", "t", "--why", "w", *index)
        run("new", "vllm", "edit", *tree, "--store", str(mine), *index, expect=2)  # already in the series
        (site / "vllm/utils.py").write_text(PRISTINE["vllm/utils.py"] + "# by hand, again\n")
        run("refresh", "vllm", "edit", *tree, "--store", str(mine), *index)
        run("refresh", "vllm", "nope", *tree, "--store", str(mine), *index, expect=2)
        assert run("revert", "vllm", "--patch", "edit", *tree, *index)["reverted"] == ["edit"]
        run("status", "vllm", *tree)
        run("revert", "vllm", *tree)
        run("apply", "vllm", *tree, *store, *index, "--patch", "loader")
        (site / "vllm/loader.py").write_text("changed by hand\n")
        assert run("status", "vllm", *tree, expect=1)["state"] == "modified"
        assert run("apply", "vllm", *tree, *store, *index, expect=1)["state"] == "modified"
        run("revert", "vllm", *tree, "--force")
        old = tmp_path / "old"
        install_fake_dist(old, "vllm", "1.2", PRISTINE | {"vllm/loader.py": loader_with({9: "nine!\n", 10: "TEN\n"})})
        assert run("apply", "vllm", "--target", str(old), *store, *index, expect=1)["error"]["kind"] == "patch-failed"
        run("status", "vllm", "--target", str(tmp_path / "nothing"), expect=2)
        run("apply", "vllm", *tree, *store, *index)
        (site / ".patchctl/vllm/state.json").write_text("{")
        assert run("status", "vllm", *tree, expect=3)["error"]["kind"] == "state-damaged"

        # the matrix, and its merge and diff
        before, after = tmp_path / "m1.yaml", tmp_path / "m2.yaml"
        run("matrix", "-o", str(before), "--engine", "vllm", "--version", "1.0", "--no-nightly", *index, *store)
        run("matrix", "-o", str(after), "--engine", "vllm", "--no-nightly", "--diff", str(before), *index, *store, expect=1)
        run("matrix", "diff", str(before), str(after), expect=1)
        run("matrix", "merge", str(before), "-o", str(tmp_path / "m3.yaml"))
        run("matrix", "diff", str(before), str(tmp_path / "absent.yaml"), expect=2)

        # rebase onto the release loader conflicts with, and the resolution of that conflict
        workdir = tmp_path / "work"
        doc = run("rebase", "vllm", "--onto", "1.2", "--from", "1.0", "--workdir", str(workdir), *index, *store, expect=1)
        conflict = doc["items"][0]["conflict"]
        worktree = Path(conflict["worktree"])
        text = (worktree / "vllm/loader.py").read_text()
        start, end = text.index("<<<<<<<"), text.index(">>>>>>>")
        (worktree / "vllm/loader.py").write_text(text[:start] + "ten, resolved\n" + text[text.index("\n", end) + 1 :])
        run("resolve", "vllm", str(workdir), "--patch", "loader", "--onto", "1.2", *store)
        run("resolve", "vllm", str(workdir), "--patch", "nope", "--onto", "1.2", *store, expect=2)
        run("rebase", "vllm", "--onto", "9.9", *index, *store, expect=2)

        # smoke: a patch without checks is not run, and says why
        run("smoke", "vllm@1.0", *index, *store, "--python", sys.executable)
        run("smoke", "vllm@1.0", *index, *store, "--patch", "nope", expect=2)

    # validate, on the test server
    from support.reasoner import ReasonerServer

    with ReasonerServer() as served:
        # twice, so that the report's every section is there: golden and baseline recorded, then compared
        quick = (
            "--url",
            served.base_url,
            "--concurrency",
            "1",
            "--requests",
            "1",
            "--max-tokens",
            "4",
            "--golden",
            str(tmp_path / "golden.json"),
            "--baseline-dir",
            str(tmp_path / "baselines"),
            "--model",
            "m",
            "--engine-version",
            "1",
        )
        run("validate", "vllm", *quick, "--record-golden", "--update-baseline", "--out", str(tmp_path / "v" / "s.json"))
        # A one-request level's timings swing by more than 5% on a loaded machine (a regression verdict,
        # exit 1, seen once): the comparison is what this needs, not its verdict, so any change passes.
        report = run("validate", "vllm", *quick, "--threshold", "1000", "--out", str(tmp_path / "v" / "s2.json"))["report"]
        assert report["golden"]["mode"] == "compared" and report["baseline"]["status"] == "compared", report
    # --compare: two saved reports, no server
    saved = (str(tmp_path / "v" / "s.json"), str(tmp_path / "v" / "s2.json"))
    assert run("validate", "--compare", *saved, "--threshold", "1000")["compare"]["checks"]
    run("validate", "vllm", "--url", "ftp://nowhere", expect=2)

    # a usage error click finds, for every command, and a command line that names none
    for command in COMMANDS:
        argv = {"patchctl": [], "matrix-merge": ["matrix", "merge"], "matrix-diff": ["matrix", "diff"]}.get(command, [command])
        _run(seen, *argv, "--no-such-option", expect=2)
    # a bug: the internal error document names the crash log
    from patchctl.cli.commands import lint

    def crash(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(lint, "run", crash)
    assert run("lint", *store, expect=4)["crash_log"]

    with_error = {c for c in COMMANDS if c not in ("patchctl", "matrix-merge", "matrix-diff")}
    assert seen["ok"] >= set(COMMANDS) - {"patchctl"}, set(COMMANDS) - seen["ok"]
    assert seen["error"] >= with_error, with_error - seen["error"]
    assert seen["exit"] == {0, 1, 2, 3, 4}


# --- the schemas notice a document that changed shape ------------------------------------------

APPLY = {
    "schema": "patchctl/1",
    "command": "apply",
    "ok": True,
    "exit_code": 0,
    "warnings": [],
    "error": None,
    "engine": "vllm",
    "version": "1.0",
    "target": "/site",
    "source": {"kind": "target", "description": "--target"},
    "patches": [
        {
            "name": "loader",
            "outcome": "clean",
            "variant": "1.0.patch",
            "reason": "r",
            "files": ["vllm/loader.py"],
            "hunks": [
                {"file": "vllm/loader.py", "index": 1, "status": "clean", "offset": 0, "fuzz": 0, "line": 7, "context": None}
            ],
        }
    ],
    "written": ["vllm/loader.py"],
    "removed": [],
    "note": None,
    "state_before": "not-applied",
    "also": [],
    "build": None,
}
ERROR = {
    "schema": "patchctl/1",
    "command": "status",
    "ok": False,
    "exit_code": 2,
    "warnings": [],
    "error": {"kind": "usage", "message": "m", "hint": None},
}


def _keys(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every key of every object in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*path, key)
            yield from _keys(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _keys(value, (*path, i))


def _at(doc: dict, path: tuple) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def test_the_examples_validate():
    assert problems(APPLY) == [] and problems(ERROR) == []


@pytest.mark.parametrize("path", list(_keys(APPLY)), ids=lambda p: "/".join(map(str, p)))
def test_a_renamed_key_fails(path):
    doc = copy.deepcopy(APPLY)
    parent = _at(doc, path[:-1])
    parent[f"{path[-1]}_renamed"] = parent.pop(path[-1])
    assert problems(doc), path


@pytest.mark.parametrize(
    "path", [p for p in _keys(APPLY) if not isinstance(_at(APPLY, p[:-1]), list)], ids=lambda p: "/".join(map(str, p))
)
def test_an_extra_key_fails_everywhere(path):
    doc = copy.deepcopy(APPLY)
    parent = _at(doc, path[:-1])
    parent["unexpected"] = 1
    assert problems(doc), path


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.pop("patches"),  # a required key missing
        lambda d: d.update(ok=False),  # ok is exit_code == 0
        lambda d: d.update(exit_code=7),
        lambda d: d.update(command="aply"),
        lambda d: d["patches"][0].update(outcome="cleanish"),
        lambda d: d["patches"][0]["hunks"][0].update(offset="12"),
        lambda d: d.update(crash_log=None),  # only with an internal error
        lambda d: d.update(state_before=None),
        lambda d: d.update(error={"kind": "usage", "message": "m"}),
    ],
)
def test_a_changed_document_fails(change):
    doc = copy.deepcopy(APPLY)
    change(doc)
    assert problems(doc)


def test_an_error_document_may_leave_the_command_s_keys_out_but_not_the_envelope_s():
    assert problems(ERROR) == []
    assert problems({**ERROR, "error": {**ERROR["error"], "kind": "internal"}})  # no crash_log
    assert problems({k: v for k, v in ERROR.items() if k != "warnings"})
    assert problems({**ERROR, "error": None, "ok": False})  # no error: status's keys are required


# --- docs/json-schema.md is generated from the schemas ---------------------------------------


def test_the_json_schema_page_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("json_schema_doc", ROOT / "scripts" / "json_schema_doc.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (ROOT / "docs" / "json-schema.md").read_text(encoding="utf-8") == script.render(), (
        "docs/json-schema.md is stale: run `python scripts/json_schema_doc.py --write`"
    )
