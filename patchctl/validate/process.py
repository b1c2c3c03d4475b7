"""Start, watch and stop an inference server for `--start`.

Restarting against a dying server was a real failure: vLLM closes its port
early in shutdown while the old process still holds GPU memory, so a new server
started "as soon as the port is free" died at load. Before starting we therefore
wait for both: the port free and the previous server's process gone (known
from the pid file this module writes per port, which names the
server's process group).
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from patchctl.core.errors import NetworkError, ServerStartError, UsageError
from patchctl.sources import http
from patchctl.sources.deadline import Deadline


def url_from_command(command: str | Sequence[str], default_port: int = 8000) -> str:
    """The URL a `vllm serve` / `sglang.launch_server` / llama.cpp command will listen on.

    Reads --host/--port (both `--port N` and `--port=N`); 0.0.0.0 and :: are
    reached through loopback.
    """
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    opts: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for name in ("--host", "--port"):
            if arg == name and i + 1 < len(argv):
                opts[name] = argv[i + 1]
            elif arg.startswith(name + "="):
                opts[name] = arg.split("=", 1)[1]
    host = opts.get("--host", "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{opts.get('--port', default_port)}"


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port.

    SO_REUSEADDR as servers themselves use it: a socket in TIME_WAIT from the
    previous run does not block a new server, a listening one does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in process group `pgid`.

    Zombies are excluded: they hold no memory or ports, and in a container
    whose init does not reap, waiting for them would never end.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        # After the command name: state, ppid, pgrp, ...
        if fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


class ServerProcess:
    """A server command run in its own process group, as a context manager.

    `state_dir` holds `<port>.pid` files: the only trace a previous run leaves
    of a server that may still be shutting down.
    """

    def __init__(
        self,
        command: str | Sequence[str],
        base_url: str,
        state_dir: Path,
        ready_timeout_s: float = 900.0,
        free_timeout_s: float = 120.0,
        stop_grace_s: float = 30.0,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/v1/models",
    ) -> None:
        self.argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not self.argv:
            raise UsageError("the server command is empty")
        parts = urlsplit(base_url)
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.state_dir = Path(state_dir)
        self.ready_timeout_s = ready_timeout_s
        self.free_timeout_s = free_timeout_s
        self.stop_grace_s = stop_grace_s
        self.log_path = Path(log_path) if log_path else self.state_dir / f"{self.port}.log"
        self.env = dict(env) if env is not None else None
        self.ready_path = ready_path
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def pid_file(self) -> Path:
        return self.state_dir / f"{self.port}.pid"

    # -- before start -------------------------------------------------------------

    def wait_previous_gone(self) -> None:
        previous = self._previous_pid()
        if previous is not None and not wait_until(lambda: not group_alive(previous), self.free_timeout_s):
            raise ServerStartError(
                f"previous server (pid {previous}) on port {self.port} still running after {self.free_timeout_s:.0f}s"
            )
        if not wait_until(lambda: port_is_free(self.host, self.port), self.free_timeout_s):
            raise ServerStartError(f"port {self.host}:{self.port} still in use after {self.free_timeout_s:.0f}s")
        self.pid_file.unlink(missing_ok=True)

    def _previous_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> ServerProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.wait_previous_gone()
        t0 = time.monotonic()
        log = open(self.log_path, "wb")
        try:
            # Own session: SIGTERM/SIGKILL reach the workers a server forks too.
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env,
            )
        except OSError as exc:  # no such program, not executable
            raise ServerStartError(f"cannot start {self.argv[0]!r}: {exc.strerror or exc}") from None
        finally:
            log.close()
        self.pid_file.write_text(f"{self.proc.pid}\n")
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None, "start() sets proc first"
        deadline = time.monotonic() + self.ready_timeout_s
        url = self.base_url + self.ready_path
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(f"server exited with {code} before it was ready\n{self.log_tail()}")
            try:
                with http.send("GET", url, Deadline(url, "", 5.0), retries=0) as answer:
                    if answer.status_code == 200:
                        return
            except NetworkError:
                pass
            if time.monotonic() >= deadline:
                raise ServerStartError(f"server not ready at {url} after {self.ready_timeout_s:.0f}s\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after the grace period; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        pgid = proc.pid  # == pid, since it leads its own session
        if proc.poll() is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace_s)
            except subprocess.TimeoutExpired:
                _killpg(pgid, signal.SIGKILL)
                proc.wait()
        else:
            # The leader died on its own; its workers still get the polite signal first.
            _killpg(pgid, signal.SIGTERM)
        # Workers may outlive the leader (vLLM's engine core frees GPU memory
        # after the API process is gone); give them the same grace, then kill.
        if not wait_until(lambda: not group_alive(pgid), self.stop_grace_s):
            _killpg(pgid, signal.SIGKILL)
            wait_until(lambda: not group_alive(pgid), 10.0)
        self.pid_file.unlink(missing_ok=True)
        return proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
