"""An interrupted matrix build drops the versions not yet started (issue 36 item 4): before, the
executor's `with` block ran every queued check while the command unwound from the Ctrl-C."""

from __future__ import annotations

import pytest
from packaging.version import Version

from patchctl.matrix import build as build_mod


def test_a_ctrl_c_in_one_cell_runs_no_other_queued_cell(monkeypatch):
    started: list[str] = []

    def check_one(engine, version, *args, **kwargs):
        started.append(str(version))
        raise KeyboardInterrupt

    class Store:
        def engines(self):
            return ["vllm"]

    monkeypatch.setattr(build_mod, "check_one", check_one)
    monkeypatch.setattr(build_mod, "versions_for", lambda *a, **k: [Version(f"0.{n}.0") for n in range(8)])
    with pytest.raises(KeyboardInterrupt):
        build_mod.build(Store(), None, workers=1, nightly=False)  # type: ignore[arg-type]
    assert started == ["0.0.0"], f"queued cells ran after the interrupt: {started}"
