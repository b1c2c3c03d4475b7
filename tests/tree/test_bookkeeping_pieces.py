"""The bookkeeping in pieces (issue 34, item 4): on-disk format versions are read in one place
(tree/bookkeeping/upgrade.py), the lock's holder keeps the folders open instead of reopening them by
name, and no environment variable can make patchctl kill itself (the kill -9 tests install their
hook through test support: support.crash_at)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import crash_at
from support.fixtures import PRISTINE, loader_with
from support.invoke import run_json

from patchctl.core.errors import EnvironmentProblem, StateDamaged
from patchctl.tree.bookkeeping import upgrade
from patchctl.tree.bookkeeping.record import seal

SPEC = "vllm@1.0"
PATCHED = loader_with({10: "ten\n"})


@pytest.fixture
def store(builder) -> Path:
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": PATCHED})})
    return builder.root


def applied(tree: Path, store: Path) -> Path:
    run_json("apply", SPEC, "--target", str(tree), "--store", str(store), expect=0)
    return tree / ".patchctl" / "vllm"


def retagged(path: Path, kind: str, tag: str) -> bytes:
    """The sealed document at `path` with its format tag changed (and sealed again, as a newer
    patchctl would have written it)."""
    body = json.loads(path.read_text())[kind]
    body["schema"] = tag
    raw = seal(kind, body)
    path.write_bytes(raw)
    return raw


# --- upgrade.py: the one reader of format versions ---------------------------------------------


def test_a_record_from_a_newer_patchctl_is_refused_by_name_and_left_alone(store, tree):
    books = applied(tree, store)
    raw = retagged(books / "state.json", "record", "patchctl-state/4")
    for command in ("status", "ensure", "apply", "revert"):
        extra = ["--store", str(store)] if command in ("apply", "ensure") else []
        doc = run_json(command, SPEC, "--target", str(tree), *extra, expect=3)
        message = doc["error"]["message"]
        assert str(books / "state.json") in message and "patchctl-state/4" in message, message
        assert "newer patchctl" in message and doc["error"]["kind"] != "state-damaged", doc["error"]
        assert "pip install -U patchctl" in doc["error"]["hint"]
    assert (books / "state.json").read_bytes() == raw  # not set aside, not rewritten
    assert (tree / "vllm/loader.py").read_text() == PATCHED


def test_a_journal_from_a_newer_patchctl_is_refused_by_name_and_kept(store, tree):
    proc = crash_at.run("file:1", ["apply", SPEC, "--target", str(tree), "--store", str(store)])
    assert proc.returncode == -9, proc.stderr
    journal = tree / ".patchctl/vllm/journal.json"
    raw = retagged(journal, "journal", "patchctl-journal/3")
    doc = run_json("status", SPEC, "--target", str(tree), expect=3)
    assert str(journal) in doc["error"]["message"] and "newer patchctl" in doc["error"]["message"], doc["error"]
    assert journal.read_bytes() == raw  # not replayed, not removed


def test_a_format_no_release_wrote_is_damaged(store, tree):
    """0.1.0 is the first release: the pre-release patchctl-state/2 is read by nothing."""
    books = applied(tree, store)
    retagged(books / "state.json", "record", "patchctl-state/2")
    doc = run_json("status", SPEC, "--target", str(tree), expect=3)
    assert doc["error"]["kind"] == "state-damaged", doc["error"]
    assert "patchctl-state/2" in doc["error"]["message"] and "--from-release" in doc["error"]["hint"]


@pytest.mark.parametrize("tag", ["patchctl-state/", "patchctl-state/x", "patchctl-state/03", "other/3", None, 3])
def test_a_tag_that_is_no_version_is_damaged(tag):
    with pytest.raises(StateDamaged, match="is damaged"):
        upgrade.current(upgrade.RECORD, {"schema": tag}, Path("/t/state.json"), "hint")


def test_an_older_version_goes_through_every_step_up_to_today_before_it_is_validated():
    """The upgrade path, as the next format change will use it: version 1 is brought to 3 by two
    steps in order, and only the result is checked against today's schema."""
    seen = []

    def one_to_two(body):
        seen.append(("1->2", body["schema"]))
        body = dict(body)
        return dict(body, engine=body.pop("engine_name"))

    def two_to_three(body):
        seen.append(("2->3", body["schema"]))
        return {**body, "stores": [], "selection": None}

    fmt = upgrade.RECORD._replace(steps={1: one_to_two, 2: two_to_three})
    old = {
        "schema": "patchctl-state/1",
        "engine_name": "vllm",
        "root": "/t",
        "version": "1.0",
        "applied_at": 0.0,
        "store_fingerprint": None,
        "build": None,
        "patches": [],
        "files": [],
    }
    body = upgrade.current(fmt, old, Path("/t/state.json"), "hint")
    assert seen == [("1->2", "patchctl-state/1"), ("2->3", "patchctl-state/2")]
    assert body["schema"] == "patchctl-state/3" and body["engine"] == "vllm" and body["stores"] == []
    broken = dict(old, engine_name=None)  # a step's result that today's schema refuses
    with pytest.raises(StateDamaged, match="engine"):
        upgrade.current(fmt, broken, Path("/t/state.json"), "hint")


def test_a_newer_version_is_an_environment_problem_not_damage():
    with pytest.raises(EnvironmentProblem) as raised:
        upgrade.current(upgrade.JOURNAL, {"schema": "patchctl-journal/9"}, Path("/t/journal.json"), "hint")
    assert not isinstance(raised.value, StateDamaged) and raised.value.exit_code == 3
    assert "/t/journal.json" in raised.value.message


def test_what_patchctl_writes_is_todays_version(store, tree):
    books = applied(tree, store)
    assert json.loads((books / "state.json").read_text())["record"]["schema"] == upgrade.RECORD.tag
    assert (
        upgrade.read_journal(upgrade.write_journal({"entries": [], "previous_state": None, "pid": 1}), Path("j"), "h")["schema"]
        == upgrade.JOURNAL.tag
    )


# --- the session: the lock's folders serve every access under it -----------------------------


def opens_of_the_bookkeeping(monkeypatch, *args: str) -> int:
    """How often `patchctl ARGS` opens `.patchctl` by its name (each open of the folders starts there)."""
    real, count = os.open, [0]

    def counting(path, *a, **k):
        if path == ".patchctl":
            count[0] += 1
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", counting)
    try:
        run_json(*args, expect=0)
    finally:
        monkeypatch.setattr(os, "open", real)
    return count[0]


def test_under_the_lock_the_folders_are_opened_once(store, tree, monkeypatch):
    """Taking the lock opens the folders (to open the lock file, then to check it is still the one
    linked, whose descriptors the session keeps); nothing under the lock opens them again. On the
    old code every read, write and blob reopened them: status 6 times, revert 14, apply 15."""
    target = ["--target", str(tree)]
    # apply also reads the record before its lock (cli/commands/apply.py) and makes the folders
    assert opens_of_the_bookkeeping(monkeypatch, "apply", SPEC, *target, "--store", str(store)) <= 4
    assert opens_of_the_bookkeeping(monkeypatch, "status", SPEC, *target) == 2
    assert opens_of_the_bookkeeping(monkeypatch, "ensure", SPEC, *target, "--store", str(store)) <= 3
    assert opens_of_the_bookkeeping(monkeypatch, "revert", SPEC, *target) == 2
    assert (tree / "vllm/loader.py").read_text() == PRISTINE["vllm/loader.py"]


# --- the fault seam --------------------------------------------------------------------------


def test_no_environment_variable_kills_patchctl(store, tree):
    """The kill -9 tests' hook lives in test support (support.crash_at), not in patchctl: the
    variable the old seam read is nothing to it now."""
    env = dict(os.environ, PATCHCTL_CRASH_AT="file:1")
    proc = subprocess.run(
        [sys.executable, "-m", "patchctl.cli.main", "apply", SPEC, "--target", str(tree), "--store", str(store), "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tree / "vllm/loader.py").read_text() == PATCHED


@pytest.mark.parametrize("step", ["gitignore", "journal", "file:1", "state"])
def test_the_seam_kills_at_each_step_it_is_asked_to(store, tree, step):
    proc = crash_at.run(step, ["apply", SPEC, "--target", str(tree), "--store", str(store)])
    assert proc.returncode == -9, proc.stderr
    doc = run_json("status", SPEC, "--target", str(tree))
    assert doc["state"] == "not-applied" and (tree / "vllm/loader.py").read_text() == PRISTINE["vllm/loader.py"]


def test_a_lock_unlinked_as_its_waiter_checks_it_is_opened_again(tree, monkeypatch):
    """The holder before us may unlink the lock (nothing applied) between our open and our check of
    it: a file with 0 links is that race, not a planted link, so the lock is opened again. Checking
    the count before the check left a window between the two looks (seen once in 8 rounds of
    hostile/test_bookkeeping.py::test_waiters_survive_the_holder_removing_the_folder under load:
    exit 3, "lock has 0 hard links"); the unlink here comes inside it."""
    from patchctl.tree.bookkeeping import TargetState, lock

    real, checked = lock.own_file, []

    def holder_leaves_first(fd, shown, owners):
        checked.append(fd)
        if len(checked) == 1:
            os.unlink(tree / ".patchctl/vllm/lock")
        return real(fd, shown, owners)

    monkeypatch.setattr(lock, "own_file", holder_leaves_first)
    with TargetState(tree, "vllm").locked() as unlocked:
        assert unlocked is None and len(checked) == 2  # opened again, and the new lock is held
        assert (tree / ".patchctl/vllm/lock").is_file()
    assert not (tree / ".patchctl").exists()
