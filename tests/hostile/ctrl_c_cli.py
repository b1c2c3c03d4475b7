"""What the Ctrl-C tests share (test_ctrl_c.py, test_ctrl_c_random.py): a local package index with vllm
wheels and a store with one patch, the CLI started as a user starts it (the console script's own
text, or `python -m patchctl.cli`) in a process of its own, a SIGINT sent into it, and the checks every
interrupted run must pass. A module of its own, not conftest: hostile/conftest.py serves other tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from support.builders import StoreBuilder, build_wheel, filler_blobs, install_fake_dist
from support.fixtures import PRISTINE, loader_with

import patchctl

# What pip writes as the `patchctl` console script (its __main__ part), run with `python -c`.
CONSOLE_SCRIPT = (
    "import re\nimport sys\nfrom patchctl.cli.main import main\n"
    "if __name__ == '__main__':\n    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n"
)
HOOK = Path(__file__).with_name("ctrl_c_hook.py")
LIMIT = 10.0  # seconds a run may take after its SIGINT
# The temporary files patchctl makes in the cache: download part files, write_atomic's temp files.
TEMPORARY = re.compile(r"^\..+\.(\d+\.part|patchctl-\d+(-\d+)?\.tmp)$")


def make_index_files(root: Path, versions: tuple[str, ...] = ("1.0", "1.1"), blobs: int = 40) -> list[Path]:
    """vllm wheels of `versions` (blobs x 150 KB of incompressible filler each: a sparse read fetches
    a few KB of them, a --verify download all), and the store (root/store) with one patch."""
    builder = StoreBuilder(root / "store")
    builder.add(
        "vllm",
        "loader",
        applies_to=">=1.0",
        variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})},
    )
    files = root / "files"
    files.mkdir()
    filler = filler_blobs(blobs)
    return [build_wheel(files, "vllm", v, dict(PRISTINE, **filler)) for v in versions]


def site(root: Path) -> Path:
    """vllm 1.0 as pip leaves it."""
    install_fake_dist(root, "vllm", "1.0", PRISTINE)
    return root


class Run(NamedTuple):
    code: int | None  # None: still running LIMIT seconds after the signal (killed, its stacks in stderr)
    stdout: str
    stderr: str
    after_signal: float  # seconds from the SIGINT to the end


def launch(args: list[str], *, cache: Path, console_script: bool = True, hook: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, PATCHCTL_CACHE_DIR=str(cache), PYTHONFAULTHANDLER="1")
    if hook is not None:
        env["CTRL_C_HOOK"] = json.dumps(hook)
        argv = [sys.executable, str(HOOK), *args]
    elif console_script:
        argv = [sys.executable, "-c", CONSOLE_SCRIPT, *args]
    else:
        argv = [sys.executable, "-m", "patchctl.cli", *args]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint)


def default_sigint() -> None:
    """In the child: SIGINT as a terminal's foreground process has it, whatever this test inherited (a
    shell's background job ignores it, and so would patchctl, as Python does)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(proc: subprocess.Popen) -> Run:
    """SIGINT now, then wait LIMIT seconds; a process still running gets SIGABRT, which makes
    Python's faulthandler print every thread's stack (where it hung) before it dies."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=LIMIT)
        return Run(proc.returncode, out, err, time.monotonic() - sent)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return Run(None, out, err, time.monotonic() - sent)


def wait_for(marker: Path, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > end:
            out, err = proc.communicate()
            raise AssertionError(f"the hook's moment never came (exit {proc.returncode}):\n{err[-2000:]}")
        time.sleep(0.005)


def before_patchctl(run: Run) -> bool:
    """A SIGINT that came before patchctl's first line (patchctl/__init__.py sets a handler there):
    the interpreter's own start-up (site running other packages' .pth files: "Fatal Python error:
    init_import_site", exit 1), or the launcher's (the console script's `import re`; `python -m`
    importing runpy, "Could not import runpy module", and locating the module: Python's traceback of
    an uncaught KeyboardInterrupt). No program can guard these
    (docs/commands.md, Exit codes). Or Python's own "Exception ignored" for a SIGINT it dropped in
    importlib's lock callback there, which patchctl's first line turns into exit 130. Never one with
    a frame of patchctl's."""
    err = run.stderr.strip()
    if f'File "{package_dir()}' in err or not err.endswith("KeyboardInterrupt"):
        return False
    if run.code == 130:  # dropped by Python in importlib's lock callback: patchctl's first line ended it
        return err.startswith("Exception ignored in: <function _get_module_lock.<locals>.cb") and err.count("Traceback") == 1
    return (
        run.code in (1, -signal.SIGINT)
        and err.startswith(("Fatal Python error: init_", "Could not import runpy module", "Traceback (most recent call last):"))
        and "Exception ignored" not in err
    )


def package_dir() -> str:
    return str(Path(patchctl.__file__).parent)


def problems(run: Run, *, own: set[int], json_out: bool, cache: Path) -> list[str]:
    """What is wrong with an interrupted run; empty when it is clean."""
    found = []
    if run.code is None:
        found.append(f"still running {LIMIT:g} s after the SIGINT")
    if "Exception ignored" in run.stderr:
        found.append('"Exception ignored" on stderr')
    if "Traceback" in run.stderr:
        found.append("a traceback on stderr")
    if run.code is not None and run.code not in {130, -signal.SIGINT, *own}:
        found.append(f"exit {run.code}")
    if json_out and run.stdout.strip():
        try:
            doc = json.loads(run.stdout)
            if run.code in own and doc.get("exit_code") != run.code:
                found.append(f"exit {run.code} but the document says {doc.get('exit_code')}")
        except ValueError:
            found.append(f"stdout is not one JSON document: {run.stdout[-200:]!r}")
    if run.code in own and json_out and not run.stdout.strip():
        found.append(f"exit {run.code} (finished) without its document")
    left = leftovers(cache)
    if left:
        found.append(f"temporary files left in the cache: {left}")
    return found


def leftovers(cache: Path) -> list[str]:
    if not cache.exists():
        return []
    return sorted(str(p.relative_to(cache)) for p in cache.rglob(".*") if TEMPORARY.match(p.name))
