import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patchctl.validate.process import ServerProcess, ServerStartError, group_alive, port_is_free, url_from_command

# The test server's model as a process, slow, broken or stubborn on demand (--delay, --exit, --child, --ignore-term).
SERVER = [sys.executable, "-m", "support.reasoner"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(pid: int) -> bool:
    """Alive and not a zombie (an unreaped zombie holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def server(port, tmp_path, *extra, **kw):
    kw.setdefault("ready_timeout_s", 10)
    kw.setdefault("free_timeout_s", 5)
    kw.setdefault("stop_grace_s", 2)
    return ServerProcess([*SERVER, "--port", str(port), *extra], f"http://127.0.0.1:{port}", tmp_path, **kw)


def test_start_waits_for_readiness_and_stop_frees_the_port(tmp_path):
    port = free_port()
    srv = server(port, tmp_path, "--delay", "1.0")
    with srv:
        assert srv.startup_s >= 1.0
        assert not port_is_free("127.0.0.1", port)
        assert srv.pid_file.exists()
        pgid = srv.proc.pid
    assert port_is_free("127.0.0.1", port)
    assert not group_alive(pgid)
    assert not srv.pid_file.exists()


def test_stop_escalates_to_sigkill_for_the_whole_group(tmp_path):
    port = free_port()
    child_pid_file = tmp_path / "child.pid"
    srv = server(port, tmp_path, "--ignore-term", "--child", str(child_pid_file), stop_grace_s=0.5)
    srv.start()
    child = int(child_pid_file.read_text())
    t0 = time.monotonic()
    code = srv.stop()
    assert code == -9  # the leader ignored SIGTERM, so SIGKILL ended it
    assert not group_alive(srv.proc.pid)
    assert not running(child)  # the worker that ignored SIGTERM is gone too
    assert time.monotonic() - t0 < 10


def test_server_that_dies_at_startup_reports_its_log(tmp_path):
    port = free_port()
    with pytest.raises(ServerStartError, match="(?s)exited with 3.*out of memory"):
        server(port, tmp_path, "--exit", "3").start()


def test_readiness_timeout_stops_the_server(tmp_path):
    port = free_port()
    srv = server(port, tmp_path, "--delay", "30", ready_timeout_s=1)
    with pytest.raises(ServerStartError, match="not ready"):
        srv.start()
    assert not group_alive(srv.proc.pid)


def test_start_waits_for_previous_server_process_to_be_gone(tmp_path):
    # A previous server that has closed its port but is still shutting down
    # (like vLLM releasing GPU memory): its pid file names its process group.
    port = free_port()
    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"], start_new_session=True)
    (tmp_path / f"{port}.pid").write_text(f"{dying.pid}\n")
    reaper = __import__("threading").Thread(target=dying.wait)  # exits like a real server would
    reaper.start()
    t0 = time.monotonic()
    with server(port, tmp_path):
        waited = time.monotonic() - t0
    reaper.join()
    assert waited >= 1.0, "started while the previous server was still alive"


def test_previous_server_that_never_dies_is_an_error(tmp_path):
    port = free_port()
    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / f"{port}.pid").write_text(f"{stuck.pid}\n")
        with pytest.raises(ServerStartError, match=f"pid {stuck.pid}.*still running"):
            server(port, tmp_path, free_timeout_s=0.5).start()
    finally:
        stuck.kill()
        stuck.wait()


def test_busy_port_blocks_start_until_freed(tmp_path):
    port = free_port()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        with pytest.raises(ServerStartError, match="still in use"):
            server(port, tmp_path, free_timeout_s=0.5).start()
    finally:
        holder.close()
    with server(port, tmp_path):
        pass


def test_url_from_command():
    assert url_from_command("vllm serve Qwen/Qwen3-8B") == "http://127.0.0.1:8000"
    assert url_from_command("vllm serve m --host 0.0.0.0 --port 9001") == "http://127.0.0.1:9001"
    assert (
        url_from_command(["python", "-m", "sglang.launch_server", "--port=30000", "--host=10.0.0.5"]) == "http://10.0.0.5:30000"
    )
