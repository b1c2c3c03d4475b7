"""Trustworthy writes: `apply`, `ensure` and `revert` never report success over a damaged engine.

The fault-injection matrix runs the real CLI in-process (so `patchctl.core.atomic._os_write`, the one seam
every write goes through, can be monkeypatched) on a small synthetic target: BASE (PRISTINE plus
vllm/config.py) and a series of three patches that change loader.py, utils.py and config.py and
create added.py — blob, journal, four target files and the state record: a dozen writes.

Matrix (test ids `test_fault_matrix[FAULT-COMMAND-kNN]`; NN is the NN-th call of `_os_write`):

  fault      what `_os_write` does                                   commands               k
  short      every call takes half of what it is offered              apply revert ensure    every call
  enospc     call k writes half its bytes, then raises ENOSPC          apply revert ensure    1..MAX_WRITES
  eio        ... EIO                                                   apply revert ensure    1..MAX_WRITES
  erofs      ... EROFS                                                 apply revert ensure    1..MAX_WRITES
  zero       call k returns 0, and so does every later call on that
             file: a disk full that reports no error                   apply revert ensure    1..MAX_WRITES

  `apply`: pristine tree → applied. `revert`: applied → pristine. `ensure`: applied, then wiped
  (BASE bytes written back, as a reinstall does) → applied again.

For every cell: exit 0 only when the command fully succeeded, and then the tree is exactly the
expected result; otherwise exit 3, the message gives the cause in words ("No space left on device",
"Input/output error", "Read-only file system", "disk full"), the tree is byte for byte what it was
before, no journal is left, `status` agrees with the tree (and has nothing to recover), and no
`.patchctl-*.tmp` file is left in the tree or the data dir. MAX_WRITES is the number of writes each
command makes now: test_matrix_covers_every_write fails when one is added (raise it), and a k
beyond a command's writes would never fire (the cell checks the success and skips, "only N writes").

The table of results (k, what that write was, and the outcome per fault) is printed at the end of
the module's run (visible without -s). Also here: a rollback that itself fails (the fault stays on),
a real full tmpfs, and processes killed with SIGKILL in the middle of a write (the temp-file sweep).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import mounts
from support.builders import write_tree
from support.fixtures import PRISTINE, loader_with

from patchctl.core import atomic

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to tell which file each write goes to")

BASE = dict(PRISTINE, **{"vllm/config.py": "".join(f"option_{i} = {i}\n" for i in range(1, 31))})
PATCHED = {
    "vllm/loader.py": loader_with({10: "ten\n"}),
    "vllm/utils.py": PRISTINE["vllm/utils.py"].replace("return 2", "return 3"),
    "vllm/added.py": "NEW = True\n",
    "vllm/config.py": BASE["vllm/config.py"].replace("option_15 = 15\n", "option_15 = 'fifteen'\n"),
}
APPLIED = dict(BASE, **PATCHED)
SPEC = "vllm@1.0"
BOOKKEEPING = ".patchctl"  # the bookkeeping: <import root>/.patchctl/<engine>/

COMMANDS = ("apply", "revert", "ensure")
FAULTS = ("enospc", "eio", "erofs", "zero")
ERRNO = {"enospc": errno.ENOSPC, "eio": errno.EIO, "erofs": errno.EROFS}
CAUSE = {  # the cause, in words, that the message must carry
    "enospc": re.escape(os.strerror(errno.ENOSPC)),
    "eio": re.escape(os.strerror(errno.EIO)),
    "erofs": re.escape(os.strerror(errno.EROFS)),
    "zero": f"{re.escape(os.strerror(errno.ENOSPC))}|disk full",
}
# The writes each command makes now; test_matrix_covers_every_write fails when one is added.
MAX_WRITES = {"apply": 14, "revert": 4, "ensure": 6}


# --- the target ------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path) -> Path:
    return write_tree(tmp_path / "tree", BASE)


@pytest.fixture
def store(builder):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(BASE, {"vllm/loader.py": PATCHED["vllm/loader.py"]})})
    builder.add(
        "vllm",
        "utils",
        variants={
            "1.0": builder.variant(BASE, {"vllm/utils.py": PATCHED["vllm/utils.py"], "vllm/added.py": PATCHED["vllm/added.py"]})
        },
    )
    builder.add("vllm", "config", variants={"1.0": builder.variant(BASE, {"vllm/config.py": PATCHED["vllm/config.py"]})})
    return builder.root


def encoded(files: dict[str, str]) -> dict[str, bytes]:
    return {k: v.encode() for k, v in files.items()}


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and ".patchctl-" in path.name and path.name.endswith(".tmp")


def snapshot(root: Path) -> dict[str, bytes]:
    """The tree as the engine sees it: every file but patchctl's bookkeeping and temp files."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and BOOKKEEPING not in rel.parts and not is_temp(p):
            out[rel.as_posix()] = p.read_bytes()
    return out


def data_dir() -> Path:
    return Path(os.environ["PATCHCTL_DATA_DIR"])


def temp_files(*roots: Path) -> list[str]:
    roots = roots + (data_dir(),)
    return sorted(str(p) for r in roots if r.exists() for p in r.rglob("*.patchctl-*.tmp"))


def journals(tree: Path) -> list[str]:
    """journal.json wherever it is in the tree's bookkeeping."""
    base = tree / BOOKKEEPING
    return sorted(str(p) for p in base.rglob("journal.json")) if base.is_dir() else []


def differing(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    return sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))


def invoke(*args: str) -> tuple[int, dict]:
    """`patchctl ARGS --json` in-process (support.invoke.run_json, keeping the exit code)."""
    from patchctl.cli.main import main

    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert doc.get("exit_code", result.exit_code) == result.exit_code, result.output
    return result.exit_code, doc


def error_text(doc: dict) -> str:
    err = doc.get("error") or {}
    return f"{err.get('message') or ''} {err.get('hint') or ''}"


def command_args(command: str, tree: Path, store: Path) -> list[str]:
    args = [command, SPEC, "--target", str(tree)]
    return args + ["--store", str(store)] if command in ("apply", "ensure") else args


# --- the seam --------------------------------------------------------------------------------


class Disk:
    """Replaces atomic._os_write: counts its calls, names what each one writes, injects a fault.

    fault: None (record only), "short" (every call takes half), "enospc"/"eio"/"erofs" (call k writes
    half its bytes, then raises), "zero" (call k and every later call on that file return 0).
    stay: from call k on, every call fails (the disk stays full: the rollback cannot write either).
    at: "k" as an int, or a predicate on (n, label, labels so far) choosing the first failing call.
    """

    def __init__(self, tree: Path, fault: str | None = None, at=None, stay: bool = False):
        self.tree, self.fault, self.at, self.stay = tree.resolve(), fault, at, stay
        self.real = atomic._os_write
        self.labels: list[str] = []  # what each call wrote
        self.fired_at: int | None = None  # the first call that failed
        self.raised: list[tuple[int, str]] = []

    def label(self, fd: int) -> str:
        try:
            tmp = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return "?"
        m = re.fullmatch(r"\.(.+)\.patchctl-\d+(?:-\d+)?\.tmp", tmp.name)
        final = tmp.with_name(m.group(1)) if m else tmp
        try:
            rel = final.relative_to(self.tree)
        except ValueError:
            rel = None
        if rel is not None and BOOKKEEPING not in rel.parts:
            return rel.as_posix()
        if final.parent.name == "blobs":
            return "blob"
        return final.name

    def targets_written(self, upto: int | None = None) -> list[str]:
        labels = self.labels if upto is None else self.labels[:upto]
        return [x for x in labels if x.startswith("vllm/")]

    def _fires(self, n: int, label: str) -> bool:
        if self.fired_at is not None:
            return self.stay
        if self.at is None:
            return False
        hit = n == self.at if isinstance(self.at, int) else self.at(n, label, self.labels)
        if hit:
            self.fired_at = n
        return hit

    def _dead(self, fd: int) -> bool:
        return self.fault == "zero" and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK)

    def __call__(self, fd, data):
        n = len(self.labels) + 1
        label = self.label(fd)
        self.labels.append(label)
        if self.fault == "short":
            return self.real(fd, data[: max(1, len(data) // 2)])
        if self._dead(fd) or (self.fault is not None and self._fires(n, label)):
            self.raised.append((n, label))
            if self.fault == "zero":
                # "Forever": a retry on this open file gets 0 again. The mark is O_NONBLOCK, which
                # does nothing to a regular file and belongs to this open file description, so a
                # file opened later (even under the same fd number) starts healthy.
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
                return 0
            self.real(fd, data[: len(data) // 2])  # part of it reached the temp file first
            raise OSError(ERRNO[self.fault], os.strerror(ERRNO[self.fault]))
        return self.real(fd, data)


# --- the three commands, set up ----------------------------------------------------------------

# The state `status` must report when the tree is as before the command / as after its success.
STATE_BEFORE = {"apply": "not-applied", "revert": "intact", "ensure": "wiped"}
STATE_AFTER = {"apply": "intact", "revert": "not-applied", "ensure": "intact"}
STATUS_EXIT = {"not-applied": 0, "intact": 0, "wiped": 1}


def prepare(command: str, tree: Path, store: Path) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """Bring the tree to where `command` starts; (the tree now, the tree after its success)."""
    if command in ("revert", "ensure"):
        code, doc = invoke("apply", SPEC, "--target", str(tree), "--store", str(store))
        assert code == 0, doc
        assert snapshot(tree) == encoded(APPLIED)
    if command == "ensure":
        write_tree(tree, BASE)  # a reinstall: pristine bytes back; the file the patches created stays
    before = snapshot(tree)
    expected = encoded(BASE) if command == "revert" else encoded(APPLIED)
    if command == "apply":
        assert before == encoded(BASE)
    return before, expected


def expected_file_status(path: str, data: bytes | None, applied: dict[str, str], base: dict[str, str]) -> str:
    if data is not None and path in applied and data == applied[path].encode():
        return "patched"
    pristine = base.get(path)
    if (data is None and pristine is None) or (data is not None and pristine is not None and data == pristine.encode()):
        return "pristine"
    return "missing" if data is None else "changed"


def assert_status_agrees(
    tree: Path, state: str, *, recovered: bool | None = False, applied: dict[str, str] = APPLIED, base: dict[str, str] = BASE
) -> dict:
    """`status` reports `state` and every file as the tree holds it. recovered: True, it must say it
    recovered an interrupted run; False, it must not, and must leave the tree as it is; None, it
    must leave the tree as it is (whatever it says about sweeping)."""
    before = snapshot(tree)
    code, doc = invoke("status", SPEC, "--target", str(tree))
    assert not doc.get("error"), f"status failed (exit {code}): {error_text(doc)}"
    assert doc["state"] == state, doc["message"]
    assert code == STATUS_EXIT[state], doc
    now = snapshot(tree)
    for f in doc["files"]:
        assert f["status"] == expected_file_status(f["path"], now.get(f["path"]), applied, base), (f, doc["message"])
    if recovered:
        assert "recovered" in doc["message"], doc["message"]
    else:
        assert now == before, f"status changed the tree: {differing(before, now)} ({doc['message']})"
    if recovered is False:
        assert "recovered" not in doc["message"], doc["message"]
    return doc


def assert_clean_failure(command: str, code: int, doc: dict, cause: str, tree: Path, before: dict) -> None:
    assert code == 3, f"exit {code} after a failed write: {error_text(doc)}"
    assert re.search(cause, error_text(doc)), f"the cause ({cause}) is not in the message: {error_text(doc)}"
    now = snapshot(tree)
    assert now == before, f"not rolled back: {differing(before, now)} differ; {error_text(doc)}"
    assert journals(tree) == [], f"a journal was left after a rollback that completed: {error_text(doc)}"
    assert temp_files(tree) == []
    assert_status_agrees(tree, STATE_BEFORE[command])


def assert_success(command: str, code: int, doc: dict, tree: Path, expected: dict) -> None:
    assert code == 0, f"exit {code}: {error_text(doc)}"
    now = snapshot(tree)
    assert now == expected, f"exit 0 but {differing(expected, now)} are not the expected result"
    assert journals(tree) == [] and temp_files(tree) == []
    assert_status_agrees(tree, STATE_AFTER[command])


# --- the results table -----------------------------------------------------------------------

RESULTS: dict[tuple[str, str, str], tuple[str, str]] = {}  # (fault, command, k) -> (write, result)


@pytest.fixture(scope="module", autouse=True)
def matrix_summary(request):
    yield
    if not RESULTS:
        return
    lines = ["", "fault matrix (fault × command × k-th write → result):"]
    header = f"  {'command':<8} {'k':>5}  {'write':<16}" + "".join(f" {f:<22}" for f in ("short",) + FAULTS)
    lines.append(header)
    ks = sorted({(c, k) for (_, c, k) in RESULTS}, key=lambda ck: (COMMANDS.index(ck[0]), ck[1] != "every", ck[1]))
    beyond: dict[str, list[str]] = {}
    for command, k in ks:
        cells = [RESULTS.get((f, command, k), ("", "·"))[1] for f in ("short",) + FAULTS]
        if all(c in ("·", "(no write k)") for c in cells) and "(no write k)" in cells:
            beyond.setdefault(command, []).append(k)  # the command makes fewer writes
            continue
        write = next((w for (f, c, kk), (w, _) in RESULTS.items() if c == command and kk == k and w), "")
        lines.append(f"  {command:<8} {k:>5}  {write:<16}" + "".join(f" {c:<22}" for c in cells))
    for command, ks_beyond in beyond.items():
        lines.append(f"  {command:<8} {ks_beyond[0]}–{ks_beyond[-1]}: no such write (the fault never fires)")
    text = "\n".join(lines)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():  # shown without -s
            reporter.write_line(text)
    else:
        print(text)


class record:
    """Records the cell's result, or its failure, in RESULTS: `with record(...) as cell:` and set
    cell.write (what the k-th write was) and cell.result."""

    def __init__(self, fault: str, command: str, k: str, write: str = ""):
        self.key, self.write, self.result = (fault, command, k), write, "?"

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None and not issubclass(kind, pytest.skip.Exception):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else kind.__name__
            self.result = "FAIL " + first[:60]
        RESULTS[self.key] = (self.write, self.result)
        return False


# --- the matrix ------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_short_writes_still_write_whole_files(store, tree, monkeypatch, command):
    with record("short", command, "every", "every write") as rec:
        before, expected = prepare(command, tree, store)
        disk = Disk(tree, "short")
        monkeypatch.setattr(atomic, "_os_write", disk)
        code, doc = invoke(*command_args(command, tree, store))
        monkeypatch.setattr(atomic, "_os_write", disk.real)
        assert len(disk.labels) > 0
        assert_success(command, code, doc, tree, expected)
        rec.result = "exit 0, whole files"


MATRIX = [pytest.param(f, c, k, id=f"{f}-{c}-k{k:02d}") for f in FAULTS for c in COMMANDS for k in range(1, MAX_WRITES[c] + 1)]


@pytest.mark.parametrize("fault,command,k", MATRIX)
def test_fault_matrix(store, tree, monkeypatch, fault, command, k):
    with record(fault, command, f"k{k:02d}", "") as rec:
        before, expected = prepare(command, tree, store)
        disk = Disk(tree, fault, at=k)
        monkeypatch.setattr(atomic, "_os_write", disk)
        code, doc = invoke(*command_args(command, tree, store))
        monkeypatch.setattr(atomic, "_os_write", disk.real)
        rec.write = disk.labels[k - 1] if len(disk.labels) >= k else ""
        if disk.fired_at is None:
            assert_success(command, code, doc, tree, expected)
            rec.result = "(no write k)"
            pytest.skip(f"{command} makes only {len(disk.labels)} writes: the fault never fired")
        if code == 0:  # the fault fired, yet the command says it succeeded: then it must have
            assert_success(command, code, doc, tree, expected)
            rec.result = "exit 0, whole"
        else:
            assert_clean_failure(command, code, doc, CAUSE[fault], tree, before)
            rec.result = "exit 3, rolled back"


@pytest.mark.parametrize("command", COMMANDS)
def test_matrix_covers_every_write(store, tree, monkeypatch, command):
    """If a command makes more writes than MAX_WRITES, the matrix above misses some: raise it."""
    prepare(command, tree, store)
    disk = Disk(tree)
    monkeypatch.setattr(atomic, "_os_write", disk)
    code, doc = invoke(*command_args(command, tree, store))
    monkeypatch.setattr(atomic, "_os_write", disk.real)
    assert code == 0, error_text(doc)
    assert 0 < len(disk.labels) <= MAX_WRITES[command], disk.labels
    assert any(x.startswith("vllm/") for x in disk.labels), disk.labels


# --- a rollback that cannot complete -----------------------------------------------------------


def second_target_write(n: int, label: str, labels: list[str]) -> bool:
    """The second write of a target file: one file is already replaced, so undoing needs a write."""
    return label.startswith("vllm/") and len({x for x in labels if x.startswith("vllm/")}) >= 2


@pytest.mark.parametrize("command", COMMANDS)
def test_rollback_that_cannot_complete_keeps_the_journal_and_says_how_to_finish(store, tree, monkeypatch, command):
    before, _ = prepare(command, tree, store)
    disk = Disk(tree, "enospc", at=second_target_write, stay=True)  # the disk stays full
    monkeypatch.setattr(atomic, "_os_write", disk)
    code, doc = invoke(*command_args(command, tree, store))
    monkeypatch.setattr(atomic, "_os_write", disk.real)
    assert disk.fired_at is not None, disk.labels
    text = error_text(doc)
    assert code == 3, f"exit {code} over a half-written tree: {text}"
    assert re.search(CAUSE["enospc"], text), text
    assert temp_files(tree) == []
    damaged = differing(before, snapshot(tree))
    if not damaged:  # undone without a single write (renames): then it is an ordinary clean failure
        assert_clean_failure(command, code, doc, CAUSE["enospc"], tree, before)
        pytest.skip("the rollback needed no write, so a full disk cannot make it fail")
    assert journals(tree), f"the rollback failed ({damaged} not restored) but the journal is gone: {text}"
    missing = [p for p in damaged if p not in text]
    assert not missing, f"the message does not name {missing}: {text}"
    assert "patchctl status" in text and "space" in text, f"no way out (`patchctl status` after freeing space): {text}"
    # the space is freed: the next command finishes the rollback
    assert_status_agrees(tree, STATE_BEFORE[command], recovered=True)
    assert snapshot(tree) == before
    assert journals(tree) == [] and temp_files(tree) == []


# --- a real full disk --------------------------------------------------------------------------

TMPFS_SIZE = 256 * 1024
SMALL_FILES = ("vllm/a.py", "vllm/b.py", "vllm/c.py")


def lines(tag: str, size: int) -> str:
    """Python source of at most `size` bytes."""
    out, i, total = [], 0, 0
    while True:
        line = f"{tag}_{i:05d} = {'x' * 40!r}\n"
        if total + len(line) > size:
            return "".join(out)
        out.append(line)
        total += len(line)
        i += 1


@pytest.fixture
def small_tmpfs(tmp_path):
    with mounts.small_tmpfs(tmp_path / "tmpfs", TMPFS_SIZE) as mnt:
        yield mnt


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(mnt: Path, leave: int) -> None:
    """A filler file on the tmpfs, so that `leave` bytes stay free (as near as pages allow)."""
    want = max(0, free_bytes(mnt) - leave)
    with open(mnt / "filler", "wb") as f:
        chunk = b"\0" * 4096
        try:
            while want > 0:
                want -= f.write(chunk[: min(want, 4096)])
                f.flush()
        except OSError:
            pass


def test_real_full_tmpfs_midway(builder, tmp_path, small_tmpfs, monkeypatch):
    """A target on a 256 KiB tmpfs whose patched files (6 pages each, from 1) do not all fit.
    Free space is stepped up 8 KiB at a time until apply succeeds; every level must end whole
    (applied; or exit 3, rolled back, and `status` — on the still full disk — agreeing; or, when even
    the rollback finds no space, the journal kept and the files and way out named, which works once
    space is freed). At least one level must run out of space midway (after a target file was
    replaced) and be rolled back cleanly. Every level is checked; the failures are reported together."""
    base = dict(PRISTINE, **{p: lines(Path(p).stem, 3000) for p in SMALL_FILES})
    patched = {p: base[p] + lines(Path(p).stem + "_new", 6 * 4096 - 3100) for p in SMALL_FILES}
    for p in SMALL_FILES:
        builder.add("vllm", Path(p).stem, variants={"1.0": builder.variant(base, {p: patched[p]})})
    store = builder.root
    applied_files = dict(base, **patched)
    applied = encoded(applied_files)
    agrees = functools.partial(assert_status_agrees, applied=applied_files, base=base)
    levels = []  # (KiB free, first failing write, target files replaced before it, outcome, problem)
    for free_kib in range(0, TMPFS_SIZE // 1024, 8):
        for child in small_tmpfs.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        tree = write_tree(small_tmpfs / "tree", base)
        monkeypatch.setenv("PATCHCTL_DATA_DIR", str(tmp_path / f"data-{free_kib}"))
        fill(small_tmpfs, free_kib * 1024)
        before = snapshot(tree)
        disk = Disk(tree)  # records only: the faults are the kernel's

        def recording(fd, data, disk=disk):
            try:
                return disk(fd, data)
            except OSError:
                disk.raised.append((len(disk.labels), disk.labels[-1]))
                raise

        monkeypatch.setattr(atomic, "_os_write", recording)
        code, doc = invoke("apply", SPEC, "--target", str(tree), "--store", str(store))
        monkeypatch.setattr(atomic, "_os_write", disk.real)
        text = error_text(doc)
        first = disk.raised[0] if disk.raised else None
        replaced = sorted(set(disk.targets_written(first[0] - 1)) - {first[1]}) if first else []
        outcome, problem = "?", ""
        try:
            assert temp_files(tree, small_tmpfs) == [], f"temp files left: {temp_files(tree, small_tmpfs)}"
            if code == 0:
                outcome = "applied"
                assert snapshot(tree) == applied, f"exit 0 but {differing(applied, snapshot(tree))} are wrong"
                agrees(tree, "intact")
            else:
                assert code == 3, f"exit {code}: {text}"
                assert re.search(CAUSE["enospc"], text), f"no cause in words: {text}"
                damaged = differing(before, snapshot(tree))
                if not damaged and not journals(tree):
                    outcome = "rolled back"
                    agrees(tree, "not-applied")  # the disk is still full
                else:
                    outcome = "rollback pending"
                    assert journals(tree), f"{damaged} left damaged and no journal: {text}"
                    assert not [p for p in damaged if p not in text], f"{damaged} not all named: {text}"
                    assert "patchctl status" in text, f"no way out named: {text}"
                    (small_tmpfs / "filler").unlink()
                    agrees(tree, "not-applied", recovered=True)
                    assert snapshot(tree) == before and journals(tree) == [] and temp_files(tree, small_tmpfs) == []
                    outcome += ", finished by status"
        except AssertionError as exc:
            problem = str(exc).strip().splitlines()[0][:160]
        levels.append((free_kib, first and first[1], replaced, outcome, problem))
        if code == 0:
            break
    table = "\n".join(
        f"  {kib:>3} KiB free: first ENOSPC at {str(ff):<16} after {len(rep)} file(s) replaced → "
        f"{res}{'  FAIL: ' + why if why else ''}"
        for kib, ff, rep, res, why in levels
    )
    print("\ntmpfs levels:\n" + table)
    assert not [lv for lv in levels if lv[4]], f"levels that did not end whole:\n{table}"
    assert levels[-1][3] == "applied", f"apply never succeeded on the tmpfs:\n{table}"
    assert any(ff and ff.startswith("vllm/") and rep and res == "rolled back" for _, ff, rep, res, _ in levels), (
        f"no level ran out of space midway and rolled back cleanly:\n{table}"
    )


# --- killed in the middle of a write: the temp-file sweep ------------------------------------

KILLER = textwrap.dedent(r"""
    import os, re, signal, sys
    from pathlib import Path
    from patchctl.core import atomic

    point, tree = sys.argv[1], Path(sys.argv[2]).resolve()
    real, seen = atomic._os_write, {}

    def label(fd):
        tmp = Path(os.readlink(f"/proc/self/fd/{fd}"))
        m = re.fullmatch(r"\.(.+)\.patchctl-\d+(?:-\d+)?\.tmp", tmp.name)
        final = tmp.with_name(m.group(1)) if m else tmp
        try:
            if ".patchctl" not in final.relative_to(tree).parts:
                return "file"
        except ValueError:
            pass
        return "blob" if final.parent.name == "blobs" else final.stem

    def write(fd, data):
        kind = label(fd)
        seen[kind] = seen.get(kind, 0) + 1
        seen["#"] = seen.get("#", 0) + 1  # point "#N": the Nth write of any kind
        if point in (kind, f"{kind}:{seen[kind]}", f"#{seen['#']}"):
            real(fd, data[: len(data) // 2])  # half of it is in the temp file
            os.kill(os.getpid(), signal.SIGKILL)
        return real(fd, data)

    atomic._os_write = write
    from patchctl.cli.main import main
    sys.argv = ["patchctl", *sys.argv[3:]]
    main()
""")

KILL_POINTS = [
    ("apply", "blob"),
    ("apply", "journal"),
    ("apply", "file:1"),
    ("apply", "file:2"),
    ("apply", "file:4"),
    ("apply", "state"),
    ("revert", "journal"),
    ("revert", "file:1"),
    ("revert", "file:2"),
]


def kill_mid_write(command: str, point: str, tree: Path, store: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", KILLER, point, str(tree), *command_args(command, tree, store)],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )


@pytest.mark.parametrize("command,point", [pytest.param(c, p, id=f"{c}-{p}") for c, p in KILL_POINTS])
def test_killed_mid_write_recovers_and_sweeps_its_temp_file(store, tree, command, point):
    before, _ = prepare(command, tree, store)
    proc = kill_mid_write(command, point, tree, store)
    assert proc.returncode == -signal.SIGKILL, f"never reached {point}: {proc.stdout}{proc.stderr}"
    left = temp_files(tree)
    assert left, "the killed write left no temp file: the test did not kill mid-write"
    assert_status_agrees(tree, STATE_BEFORE[command], recovered=True if journals(tree) else None)
    assert snapshot(tree) == before
    assert temp_files(tree) == [], f"recovery did not sweep the dead process's temp files: {left}"
    assert journals(tree) == []


def _with_bytecode(tree: Path) -> None:
    import importlib.util

    for rel in ("vllm/loader.py", "vllm/utils.py", "vllm/config.py"):
        pyc = Path(importlib.util.cache_from_source(str(tree / rel)))  # the fixture's files are not Python
        pyc.parent.mkdir(exist_ok=True)
        pyc.write_bytes(b"bytecode of " + rel.encode())


@pytest.mark.parametrize("command", ["apply", "revert"])
def test_killed_at_every_write_leaves_no_temp_file_and_no_folder(store, tree, command):
    """Kill -9 at the 1st, 2nd, ... write of a whole run (the .gitignore of a fresh tree, every blob,
    the journal, every file, every .pyc put back, the record) until a run finishes: after each kill
    `status` recovers, no temp file is left anywhere (the bytecode folder and .patchctl/ included),
    and once the command is run again the tree is exactly what it gives; a revert leaves no .patchctl/."""
    _with_bytecode(tree)
    pristine = {p.relative_to(tree).as_posix(): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}
    killed, stray = 0, []
    for n in range(1, 60):
        if command == "revert":
            code, doc = invoke("apply", SPEC, "--target", str(tree), "--store", str(store))
            assert code == 0, doc
        proc = kill_mid_write(command, f"#{n}", tree, store)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        killed += 1
        stray += temp_files(tree)
        code, doc = invoke("status", SPEC, "--target", str(tree))
        assert code == 0, error_text(doc)
        assert temp_files(tree) == [], f"killed at write {n}: temp files left after recovery"
        code, doc = invoke(*command_args(command, tree, store))
        assert code == 0, error_text(doc)
        code, doc = invoke("revert", SPEC, "--target", str(tree))
        assert code == 0, error_text(doc)
        now = {p.relative_to(tree).as_posix(): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}
        assert now == pristine, f"killed at write {n}: the tree is not as it was ({differing(now, pristine)})"
        assert not (tree / BOOKKEEPING).exists(), f"killed at write {n}: .patchctl/ survived the revert"
    else:
        pytest.fail("the command never finished without a kill")
    assert killed >= (10 if command == "apply" else 5), f"only {killed} writes: the test missed some"
    # The two temp files the sweep used to miss were among those left (and swept).
    where = "/.patchctl/..gitignore.patchctl-" if command == "apply" else "/__pycache__/."
    assert any(where in t for t in stray), stray


def test_sweep_keeps_temp_files_of_live_processes(store, tree):
    before, _ = prepare("apply", tree, store)
    proc = kill_mid_write("apply", "file:2", tree, store)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    live = subprocess.Popen(["sleep", "60"])
    try:
        mine = tree / "vllm" / f".loader.py.patchctl-{live.pid}.tmp"  # another process, still writing
        mine.write_bytes(b"half a file")
        assert_status_agrees(tree, "not-applied", recovered=True)
        assert snapshot(tree) == before
        assert temp_files(tree) == [str(mine)], "only the live process's temp file may stay"
    finally:
        live.kill()
        live.wait()
