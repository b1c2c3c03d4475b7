"""Root never runs the service user's code (issue 33, item 1): `status`/`ensure --python VENV/bin/python`
read the venv's files; a `.pth`, a sitecustomize or the interpreter itself, planted by the venv's
owner, must not run. An interpreter outside any venv is run only when it belongs to root or the
running user, isolated, with its output capped and a deadline that kills its whole process group."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_cli import Outcome
from support.builders import fake_venv, install_fake_dist
from support.fixtures import PRISTINE

SERVICE_UID = 4001
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the service user's uid needs root")


def _run(*args: str, timeout: float = 40.0) -> tuple[Outcome, int]:
    """The CLI in a process of its own, with its peak RSS (KiB) as the kernel counts it."""
    wrapper = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); "
        "sys.stderr.write('\\nRSS %d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
        "sys.exit(p.returncode)"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", wrapper, sys.executable, "-m", "patchctl.cli.main", *args, "--json"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return Outcome("hang", None, {}, ""), 0
    rss = int(proc.stderr.rsplit("RSS ", 1)[1]) if "RSS " in proc.stderr else 0
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {}
    if "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2, 3) or not doc:
        return Outcome("traceback", proc.returncode, doc, proc.stderr), rss
    return Outcome("ok" if proc.returncode == 0 else "clean-error", proc.returncode, doc, proc.stderr), rss


def _chown(top: Path, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, uid, uid, follow_symlinks=False)


def _payload(marker: Path) -> str:
    return f"import os; open({str(marker)!r}, 'w').write(str(os.getuid()))"


# cfg_version x include-system-site-packages x where the owner's code sits x command: 36 cases.
@root_only
@pytest.mark.parametrize("cfg_version", ["version", "version_info", None])
@pytest.mark.parametrize("system_site", [False, True])
@pytest.mark.parametrize("planted", ["pth", "sitecustomize", "interpreter"])
@pytest.mark.parametrize("command", ["status", "ensure"])
def test_a_service_users_venv_runs_nothing_as_root(case, store, tmp_path, cfg_version, system_site, planted, command):
    marker = tmp_path / "ran-as"
    script = f'#!/bin/sh\necho $(id -u) > {marker}\nexec {sys.executable} "$@"\n' if planted == "interpreter" else None
    venv = tmp_path / "srv" / "venv"
    site = fake_venv(venv, cfg_version=cfg_version, system_site=system_site, interpreter=script)
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    if planted == "pth":
        (site / "zz-owner.pth").write_text(_payload(marker) + "\n")
    elif planted == "sitecustomize":
        (site / "sitecustomize.py").write_text(_payload(marker) + "\n")
    _chown(tmp_path / "srv", SERVICE_UID)
    args = [command, "vllm", "--python", str(venv / "bin" / "python")]
    outcome, _ = _run(*args, *(["--store", str(store)] if command == "ensure" else []))
    case(f"venv code run as root ({command})").record(outcome)
    assert not marker.exists(), f"the venv owner's {planted} ran as uid {marker.read_text().strip()}"
    assert outcome.code == 0, outcome
    assert outcome.doc["version"] == "1.0" and outcome.doc["target"] == str(site)


def _editable_pth(tmp_path: Path, site: Path) -> Path:
    src = tmp_path / "src"
    install_fake_dist(src, "vllm", "1.1", PRISTINE)
    (site / "__editable__.vllm-1.1.pth").write_text(f"{src}\n")
    return src


def _editable_finder(tmp_path: Path, site: Path) -> Path:
    src = tmp_path / "checkout"
    install_fake_dist(src, "vllm", "1.1", PRISTINE)
    # setuptools' strict editable install: a finder module, its .pth an import line (never run here).
    for entry in src.glob("*.dist-info"):
        entry.rename(site / entry.name)
    (site / "__editable___vllm_1_1_finder.py").write_text(
        f"import sys\nMAPPING: dict[str, str] = {{'vllm': {str(src / 'vllm')!r}}}\n"
        "def install():\n    raise SystemExit('the finder must not run')\n"
    )
    (site / "__editable__.vllm-1.1.pth").write_text(
        "import __editable___vllm_1_1_finder; __editable___vllm_1_1_finder.install()\n"
    )
    return src


def _pythonpath(tmp_path: Path, site: Path) -> Path:
    other = tmp_path / "pp"
    install_fake_dist(other, "vllm", "1.1", PRISTINE)
    os.environ["PYTHONPATH"] = str(other)
    return other


def _two_copies(tmp_path: Path, site: Path) -> Path:
    """A .pth path after site-packages: site-packages' own copy is found first, as Python finds it."""
    install_fake_dist(site, "vllm", "1.1", PRISTINE)
    later = tmp_path / "later"
    install_fake_dist(later, "vllm", "0.9", PRISTINE)
    (site / "later.pth").write_text(f"# a comment\n\n{later}\n")
    return site


def _normalised_name(tmp_path: Path, site: Path) -> Path:
    install_fake_dist(site, "vllm", "1.1", PRISTINE)
    (site / "vllm-1.1.dist-info").rename(site / "VLLM-1.1.dist-info")
    return site


@pytest.mark.parametrize("layout", [_editable_pth, _editable_finder, _pythonpath, _two_copies, _normalised_name])
def test_the_engine_is_found_where_python_would_import_it(case, tmp_path, monkeypatch, layout):
    monkeypatch.setenv("PYTHONPATH", "")  # recorded, so a layout that sets it is undone after the test
    monkeypatch.delenv("PYTHONPATH")
    site = fake_venv(tmp_path / "venv")
    expected_root = layout(tmp_path, site)
    outcome, _ = _run("status", "vllm", "--python", str(tmp_path / "venv" / "bin" / "python"))
    case("editable and path layouts").record(outcome)
    assert outcome.code == 0, outcome
    assert (outcome.doc["version"], outcome.doc["target"]) == ("1.1", str(expected_root))


HOSTILE = {
    "prints forever": "exec yes patchctl",
    "prints forever on stderr": "exec yes patchctl >&2",
    "prints forever from a child": "yes patchctl &\nwait",
    "one endless line": "exec cat /dev/zero",
    "prints then forks a printer": "echo '[]'\n(yes &)\nexec yes",
}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("what", sorted(HOSTILE))
def test_a_hostile_interpreter_costs_a_capped_read_and_leaves_nothing_running(case, tmp_path, what):
    """Outside a venv, not in a bin/ folder: its layout says nothing, so it is run (it is root's)."""
    pids = tmp_path / "pids"
    python = tmp_path / "odd" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\necho $$ >> {pids}\n{HOSTILE[what]}\n")
    python.chmod(0o755)
    start = time.monotonic()
    outcome, rss_kib = _run("status", "vllm", "--python", str(python))
    case("hostile interpreter output").record(outcome)
    assert outcome.code == 3 and str(python) in outcome.message, outcome
    assert time.monotonic() - start < 20
    assert rss_kib < 150_000, f"patchctl grew to {rss_kib} KiB"
    leader = int(pids.read_text().split()[0])
    time.sleep(0.2)
    left = [int(p) for p in os.listdir("/proc") if p.isdigit() and _alive(int(p)) and _pgid(int(p)) == leader]
    assert not left, f"left running in its group: {left}"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_a_sleeping_interpreter_is_stopped_at_the_deadline(case, tmp_path):
    pids = tmp_path / "pids"
    python = tmp_path / "odd" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 1000 &\necho $! >> {pids}\nsleep 1000\n")
    python.chmod(0o755)
    start = time.monotonic()
    outcome, _ = _run("status", "vllm", "--python", str(python))
    case("hostile interpreter output").record(outcome)
    took = time.monotonic() - start
    assert outcome.code == 3 and "did not finish within" in outcome.message, outcome
    assert took < 25, took
    time.sleep(0.2)
    assert not [p for p in map(int, pids.read_text().split()) if _alive(p)]


def _foreign_file(python: Path) -> None:
    os.chown(python, SERVICE_UID, SERVICE_UID)


def _foreign_folder(python: Path) -> None:
    os.chown(python.parent, SERVICE_UID, SERVICE_UID)


def _world_writable_folder(python: Path) -> None:
    python.parent.chmod(0o777)


def _group_writable_file(python: Path) -> None:
    python.chmod(0o775)


def _link_to_foreign(python: Path) -> None:
    real = python.parent.parent / "theirs" / "python"
    real.parent.mkdir()
    python.rename(real)
    os.chown(real, SERVICE_UID, SERVICE_UID)
    python.symlink_to(real)


def _venv_without_a_layout(python: Path) -> None:
    """A venv whose files say nothing (no version, no lib/): its interpreter would read pyvenv.cfg."""
    (python.parent / "pyvenv.cfg").write_text("home = /usr/bin\n")


@root_only
@pytest.mark.parametrize(
    "how",
    [_foreign_file, _foreign_folder, _world_writable_folder, _group_writable_file, _link_to_foreign, _venv_without_a_layout],
)
def test_an_interpreter_root_does_not_own_is_not_run(case, tmp_path, how):
    marker = tmp_path / "ran-as"
    python = tmp_path / "odd" / "python"
    python.parent.mkdir()
    python.write_text(f"#!/bin/sh\nid -u > {marker}\necho '[]'\n")
    python.chmod(0o755)
    how(python)
    outcome, _ = _run("status", "vllm", "--python", str(python))
    case("foreign interpreter").record(outcome)
    assert not marker.exists(), "root ran an interpreter it does not own"
    assert outcome.code == 3 and str(python) in outcome.message, outcome


def test_run_bounded_kills_the_group_and_caps_output(tmp_path):
    """The runner itself, in process: its memory and its time bounded, nothing left in the group."""
    from patchctl.core.errors import EnvironmentProblem
    from patchctl.core.interpreter import run_bounded

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for script, expect in [
        ("yes", "printed more than"),
        ("sleep 100 & exec sleep 100", "did not finish within"),
        ("(sleep 100 &); echo done", None),
        ("cat /dev/zero", "printed more than"),
        ("exec 1>&-; sleep 100", "did not finish within"),
    ]:
        start = time.monotonic()
        pgid_file = tmp_path / "pgid"
        try:
            ran = run_bounded(["sh", "-c", f"echo $$ > {pgid_file}; {script}"], timeout=1.5, limit=1 << 16)
            assert expect is None and ran.returncode == 0 and ran.stdout == b"done\n"
        except EnvironmentProblem as exc:
            assert expect is not None and expect in str(exc), (script, exc)
        assert time.monotonic() - start < 5, script
        leader = int(pgid_file.read_text())
        time.sleep(0.1)
        assert not [int(p) for p in os.listdir("/proc") if p.isdigit() and _alive(int(p)) and _pgid(int(p)) == leader], script
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000


@pytest.mark.parametrize(
    "head, expected",
    [
        (b"\x7fELF\x02\x01" + bytes(12) + (0x3E).to_bytes(2, "little"), "x86_64"),
        (b"\x7fELF\x02\x01" + bytes(12) + (0xB7).to_bytes(2, "little"), "aarch64"),
        (b"\x7fELF\x02\x02" + bytes(12) + (0x16).to_bytes(2, "big"), "s390x"),
        (b"\x7fELF\x02\x01" + bytes(12) + (0x15).to_bytes(2, "little"), "ppc64le"),
        (b'#!/bin/sh\nexec python3 "$@"\n', None),
        (b"\x7fELF", None),
    ],
)
def test_the_targets_machine_is_read_from_its_elf_header_not_asked(tmp_path, head, expected):
    """--install's wheel choice: the interpreter is read, not run (a script or a short file: this machine's)."""
    from patchctl.core.interpreter import machine_of

    python = tmp_path / "python"
    python.write_bytes(head + bytes(64) if expected else head)
    python.chmod(0o755)
    assert machine_of(str(python)) == (expected or os.uname().machine)


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


HOSTILE_FILES = {
    "pyvenv.cfg a FIFO": lambda venv, site: _fifo(venv / "pyvenv.cfg"),
    "pyvenv.cfg huge": lambda venv, site: (venv / "pyvenv.cfg").write_bytes(b"version = 3.11\n" * 100_000),
    "pyvenv.cfg binary": lambda venv, site: (venv / "pyvenv.cfg").write_bytes(bytes(range(256)) * 10),
    "pyvenv.cfg a link out": lambda venv, site: ((venv / "pyvenv.cfg").unlink(), (venv / "pyvenv.cfg").symlink_to("/etc/passwd")),
    "version not a version": lambda venv, site: (venv / "pyvenv.cfg").write_text("version = banana\n"),
    ".pth a FIFO": lambda venv, site: _fifo(site / "a.pth"),
    ".pth huge": lambda venv, site: (site / "a.pth").write_bytes(b"/nowhere\n" * 300_000),
    ".pth binary": lambda venv, site: (site / "a.pth").write_bytes(bytes(range(256)) * 10),
    ".pth names a file, a loop": lambda venv, site: ((site / "a.pth").write_text("a.pth\n.\n..\n/\n"),),
    "METADATA a FIFO": lambda venv, site: _fifo(site / "vllm-1.0.dist-info" / "METADATA"),
    "METADATA version garbage": lambda venv, site: (site / "vllm-1.0.dist-info" / "METADATA").write_text(
        "Name: vllm\nVersion: \x00not-a-version\n"
    ),
    "dist-info a link out": lambda venv, site: (site / "vllm-2.0.dist-info").symlink_to("/etc"),
    "editable finder garbage": lambda venv, site: (
        (site / "e.pth").write_text("import __editable___x_finder\n"),
        (site / "__editable___x_finder.py").write_bytes(b"MAPPING = {("),
    ),
    "editable finder not a dict": lambda venv, site: (
        (site / "e.pth").write_text("import __editable___x_finder\n"),
        (site / "__editable___x_finder.py").write_text("MAPPING = [1, 2]\nMAPPING: int = 3\n"),
    ),
}


@pytest.mark.parametrize("what", sorted(HOSTILE_FILES))
def test_a_hostile_venv_file_is_a_clean_answer(case, tmp_path, monkeypatch, what):
    """What the venv's owner writes where patchctl reads it: an answer or exit 3, never a hang, a
    traceback or a run of anything."""
    monkeypatch.setenv("PYTHONPATH", "")  # recorded, so a layout that sets it is undone after the test
    monkeypatch.delenv("PYTHONPATH")
    venv = tmp_path / "venv"
    site = fake_venv(venv)
    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    HOSTILE_FILES[what](venv, site)
    outcome, _ = _run("status", "vllm", "--python", str(venv / "bin" / "python"), timeout=30)
    case("hostile venv files").record(outcome)
    assert outcome.code in (0, 3), outcome
