"""How patchctl runs another program and reads its answer, when running is unavoidable: in its own
session (its whole process group is killed at the deadline and after it exits, so nothing it started
outlives it), with a cap on what it may print (a hostile interpreter printing without end grew
patchctl to 22 GB) and a deadline it cannot extend. What an environment holds is read from its files
(`patchctl/core/pyenv.py`), never by running its interpreter: a `.pth` in a service user's site-packages
would otherwise run as root. Engines are never imported in-process (vLLM takes >10 s and wants CUDA).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

from patchctl.core.errors import EnvironmentProblem
from patchctl.core.yamlio import load_json

OUTPUT_LIMIT = 1 << 20  # a probe answers with one short JSON line; 1 MiB of stdout+stderr is plenty
# -I: no PYTHON* variables, no user site, no script dir on sys.path; -S: no `site`, so no `.pth` runs.
ISOLATED = ("-I", "-S", "-E")


class Ran:
    """What a bounded run gave: its exit status and its output (each at most the cap)."""

    def __init__(self, returncode: int, stdout: bytes, stderr: bytes):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_bounded(
    cmd: list[str],
    *,
    timeout: float,
    limit: int = OUTPUT_LIMIT,
    what: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> Ran:
    """cmd in a new session, stdin empty; exit 3 (naming it and the limit) when it prints more than
    `limit` bytes or runs past `timeout` seconds; either way its whole process group is killed and
    reaped first. Whatever it left running when it exited is killed too."""
    shown = what or cmd[0]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
    except OSError as exc:
        raise EnvironmentProblem(f"cannot run {shown}: {exc}") from None
    deadline = time.monotonic() + timeout
    out: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}  # type: ignore[union-attr]
    total = 0
    problem = None
    sel = selectors.DefaultSelector()
    try:
        for stream in (proc.stdout, proc.stderr):
            sel.register(stream, selectors.EVENT_READ)  # type: ignore[arg-type]
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                problem = f"{shown} did not finish within {timeout:g} s; it was stopped"
                break
            for key, _ in sel.select(min(left, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                total += len(chunk)
                if total > limit:
                    problem = f"{shown} printed more than {limit} bytes; it was stopped"
                    break
                out[key.fd].append(chunk)
            if problem:
                break
            if _exited(proc.pid):
                # What it left behind holds the pipes open: its group goes before the rest is read.
                _kill_group(proc.pid)
    finally:
        sel.close()
        _kill_group(proc.pid)  # the leader is not reaped yet, so its group id cannot be reused
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()  # type: ignore[union-attr]
    if problem:
        raise EnvironmentProblem(problem)
    stdout, stderr = out.values()  # in the order registered: stdout, then stderr
    return Ran(proc.returncode, b"".join(stdout), b"".join(stderr))


def _exited(pid: int) -> bool:
    """Whether pid has exited, without reaping it (WNOWAIT): its zombie keeps the group id reserved."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def trusted_to_run(python: str) -> str | None:
    """None when `python` may be run by this user: the file it names and every folder above it (the
    path as given and the file its links lead to) belong to root or to the running user and no one
    else may write them. Otherwise why not, in words. A venv's `pyvenv.cfg` decides where the
    interpreter finds its standard library, so an interpreter reached through a venv is never run."""
    me = os.geteuid()
    given = Path(os.path.abspath(python))
    for path in (given, Path(os.path.realpath(given))):
        for part in (path, *path.parents):
            try:
                st = os.stat(part)
            except OSError as exc:
                return f"{part} cannot be read ({exc.strerror})"
            if st.st_uid not in (0, me):
                return f"{part} belongs to uid {st.st_uid}, not to root or to you"
            writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if writable and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
                return f"{part} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
    for cfg in (given.parent / "pyvenv.cfg", given.parent.parent / "pyvenv.cfg"):
        if os.path.lexists(cfg):
            return f"it belongs to a virtual environment ({cfg})"
    return None


def probe(python: str, script: str, *args: str, timeout: float = 60, isolated: bool = True) -> Any:
    """Run `python [-I -S -E] -c script args...`, bounded as run_bounded; the script prints one JSON
    value as its last line. isolated=False only for an interpreter patchctl built and checked (a smoke
    environment: its site is needed to import torch)."""
    flags = ISOLATED if isolated else ()
    # No bytecode written: a sealed smoke venv must stay as built (smoketest/sealed.py).
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    ran = run_bounded([python, *flags, "-c", script, *args], timeout=timeout, env=env, what=f"the Python interpreter {python}")
    stdout = ran.stdout.decode(errors="replace")
    if ran.returncode != 0:
        stderr = ran.stderr.decode(errors="replace")
        raise EnvironmentProblem(f"{python} failed to answer a probe: {stderr.strip()[-300:]}")
    lines = stdout.strip().splitlines()
    try:
        return load_json(lines[-1])  # a venv's sitecustomize may print anything: bounded
    except (IndexError, json.JSONDecodeError):
        raise EnvironmentProblem(f"{python} gave no answer to a probe: {stdout.strip()[-300:]!r}") from None


_HAS_GPU = """
import json
try:
    import torch
    print(json.dumps(bool(torch.cuda.is_available())))
except Exception:
    print(json.dumps(False))
"""


def has_gpu(python: str) -> bool:
    """Asked of a smoke environment patchctl built (its site imports torch), never of a target's."""
    return bool(probe(python, _HAS_GPU, timeout=300, isolated=False))


_ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64", 0x03: "i686", 0x15: "ppc64le", 0x16: "s390x", 0xF3: "riscv64"}


def machine_of(python: str) -> str:
    """The machine an interpreter runs on, from its executable's ELF header (read, not run); where the
    header says nothing known (a script, a shim), this machine's."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.path.realpath(python), flags)
    except OSError:
        return os.uname().machine
    try:
        head = os.read(fd, 20) if stat.S_ISREG(os.fstat(fd).st_mode) else b""  # never a FIFO's read
    finally:
        os.close(fd)
    if len(head) == 20 and head[:4] == b"\x7fELF":
        code = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
        if code == 0x15 and head[5] != 1:
            return "ppc64"
        return _ELF_MACHINES.get(code, os.uname().machine)
    return os.uname().machine
