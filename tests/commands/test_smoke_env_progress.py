"""Smoke environment builds show progress on a terminal (named steps, pip's own output on stderr)
and stay quiet anywhere else (issue 24, item 7). The build itself is replaced by a child that prints,
so no index is needed."""

from __future__ import annotations

import sys

import pytest

from patchctl.core.errors import EnvironmentProblem
from patchctl.smoke import envs

CHILD = [sys.executable, "-c", "import sys; print('pip-like progress'); print('on stderr', file=sys.stderr)"]


def test_on_a_terminal_the_step_and_the_childs_output_go_to_stderr(capfd):
    envs._run(CHILD, "install things", None, live=True, step="2/2 installing")
    out, err = capfd.readouterr()
    assert out == ""  # stdout stays one --json document
    assert "smoke: 2/2 installing" in err and "pip-like progress" in err and "on stderr" in err


def test_elsewhere_it_is_quiet_and_logged(capfd):
    seen: list[str] = []
    envs._run(CHILD, "install things", seen.append, live=False, step="2/2 installing")
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert "pip-like progress" in seen[0]


def test_a_failure_says_what_failed_in_both_modes(capfd):
    failing = [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(EnvironmentProblem, match="could not install things: exit code 3"):
        envs._run(failing, "install things", None, live=True)
    with pytest.raises(EnvironmentProblem, match="boom"):
        envs._run(failing, "install things", None, live=False)


def test_on_terminal_follows_stderr(monkeypatch):
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    assert envs.on_terminal()
    monkeypatch.undo()
    assert envs.on_terminal() is sys.stderr.isatty()
