"""tree/service.py, the one service under apply, ensure, revert and status (issue 34, item 2): it reads
the tree's record once, under the lock, and returns typed results."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from support.builders import write_tree
from support.fixtures import PRISTINE
from support.invoke import run_json

from patchctl.tree.bookkeeping import TargetState


@pytest.fixture
def reads(monkeypatch):
    """Every load of a tree's record, as True when it happened under the tree's lock."""
    seen: list[bool] = []
    held = [0]
    real_load, real_locked = TargetState.load, TargetState.locked

    def load(self, *args, **kwargs):
        seen.append(held[0] > 0)
        return real_load(self, *args, **kwargs)

    @contextmanager
    def locked(self, *args, **kwargs):
        with real_locked(self, *args, **kwargs) as unlocked:
            held[0] += 1
            try:
                yield unlocked
            finally:
                held[0] -= 1

    monkeypatch.setattr(TargetState, "load", load)
    monkeypatch.setattr(TargetState, "locked", locked)
    return seen


def test_apply_ensure_and_revert_read_the_record_once_under_the_lock(store, tree, reads):
    """Was: apply and ensure decided the stores from a record read before the lock (a concurrent apply
    could change it in between), then read it again under the lock."""
    target = ["vllm@1.0", "--target", str(tree)]
    run_json("apply", *target, "--store", str(store), expect=0)
    write_tree(tree, PRISTINE)  # pip reinstalled the engine
    reads.clear()
    assert run_json("ensure", *target, expect=0)["written"]
    assert reads == [True], reads
    for args in (
        ["ensure", *target, "--store", str(store)],  # intact: nothing to do
        ["apply", *target],  # the record's stores and choice
        ["apply", *target, "--exclude", "utils", "--dry-run"],
        ["apply", *target, "--store", str(store), "--exclude", "utils"],
        ["revert", *target, "--patch", "loader"],
    ):
        reads.clear()
        run_json(*args, expect=0)
        assert reads == [True], (args, reads)


def test_the_service_returns_typed_results(store, tree):
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.store.layered import Store
    from patchctl.tree import service
    from patchctl.tree.bookkeeping import Selection
    from patchctl.tree.stores import Stores
    from patchctl.tree.target import Target

    target = Target(get_engine("vllm"), tree, Version("1.0"), "directory")
    stores = Stores(Store.open(store), named=True)
    done = service.apply_tree(target, service.ApplyRequest(stores))
    assert done.ok and done.failure is None and done.removed == () and done.state_before == "not-applied"
    assert sorted(done.written) == ["vllm/added.py", "vllm/loader.py", "vllm/utils.py"]
    assert done.record is not None and {p.name for p in done.record.patches} == {"loader", "utils"}
    smaller = service.ApplyRequest(stores, selection=Selection(exclude=("utils",)), dry_run=True)
    dry = service.apply_tree(target, smaller)
    assert dry.removed == ("utils",) and dry.written == () and any("utils" in w for w in dry.warnings)
    intact = service.apply_tree(target, service.ApplyRequest(Stores(Store.open(store)), mode=service.Mode.ENSURE))
    assert intact.result is None and intact.note == "patches intact: nothing to do"
    (tree / "vllm/loader.py").write_text("edited by hand\n")
    drift = service.apply_tree(target, service.ApplyRequest(Stores(Store.open(store)), mode=service.Mode.ENSURE))
    assert not drift.ok and drift.failure is not None and drift.failure.state == "modified"
    assert service.status(target).status.state == "modified"
