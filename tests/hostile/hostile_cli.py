"""What the hostile-target suite's tests share (conftest.py has its fixtures): the real CLI run in a
process of its own (a hang is a timeout, not a stuck suite), each case classed as ok, a clean error
(exit 1/2/3, one JSON document, no traceback), a traceback or a hang, and checked to change nothing
outside the tree. A module of its own, not conftest: `from conftest import` names whichever
conftest was imported first when tests/tree runs in the same session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

from support.fixtures import PRISTINE, loader_with

PATCHED_LOADER = loader_with({10: "ten\n"})
PATCHED_UTILS = PRISTINE["vllm/utils.py"].replace("return 2", "return 3")
TALLY: dict[str, Counter] = defaultdict(Counter)


class Outcome(NamedTuple):
    kind: str  # ok | clean-error | traceback | hang
    code: int | None
    doc: dict
    stderr: str

    @property
    def message(self) -> str:
        return (self.doc.get("error") or {}).get("message", "") or self.doc.get("message", "")


SWAP_HOOK = Path(__file__).with_name("swap_hook.py")


def run_cli(*args: str, timeout: float = 30.0, swap: dict | None = None) -> Outcome:
    """`patchctl ARGS --json` in a process of its own. swap: run it under swap_hook.py (a name of
    the tree swapped for a link out of it between its check and its use; the hook's HOSTILE_SWAP)."""
    env = dict(os.environ)
    command = [sys.executable, "-m", "patchctl.cli.main"]
    if swap is not None:
        env["HOSTILE_SWAP"] = json.dumps(swap)
        command = [sys.executable, str(SWAP_HOOK)]
    try:
        proc = subprocess.run([*command, *args, "--json"], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Outcome("hang", None, {}, "")
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {}
    if "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2, 3) or not doc:
        return Outcome("traceback", proc.returncode, doc, proc.stderr)
    return Outcome("ok" if proc.returncode == 0 else "clean-error", proc.returncode, doc, proc.stderr)


def contents(root: Path) -> dict[str, object]:
    """Everything under root, links as links (not followed): what a write outside the tree would change."""
    out: dict[str, object] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = (p.read_bytes(), p.stat().st_mode & 0o7777)
            else:
                out[rel] = "dir"
    return out


class Case:
    """One hostile case of a class: run it, then `record` what it did (and whether it wrote outside)."""

    def __init__(self, klass: str, outside: Path):
        self.klass, self.outside = klass, outside
        self.before = contents(outside)

    def record(self, outcome: Outcome) -> Outcome:
        wrote_outside = contents(self.outside) != self.before
        TALLY[self.klass]["cases"] += 1
        TALLY[self.klass][outcome.kind] += 1
        if wrote_outside:
            TALLY[self.klass]["outside-writes"] += 1
        assert not wrote_outside, f"{self.klass}: something outside the tree changed"
        assert outcome.kind not in ("traceback", "hang"), (outcome, outcome.stderr[-2000:])
        return outcome
