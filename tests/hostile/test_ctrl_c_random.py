"""Ctrl-C as a user hits it (issue 36, item 4): SIGINTs at random moments 5-600 ms into `check` (cold
and warm cache, text and --json, --verify), `status`, `apply --dry-run` and `matrix`, against a local
package index, the CLI started as the console script or `python -m patchctl.cli`. Every run ends
within 10 s of its signal, with no traceback and no "Exception ignored" line, exit 130 (or death by
SIGINT) or, when the work was done, the command's own code; with --json stdout is one document or
empty; no part or temporary file is left in the cache. The seed is printed on failure:
PATCHCTL_CTRL_C_SEED=N replays it. PATCHCTL_CTRL_C_SIGNALS=N: how many SIGINTs are sent (a run that
finished before its signal does not count)."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest
from ctrl_c_cli import before_patchctl, interrupt, launch, make_index_files, problems, site
from support.index_server import IndexServer

SIGNALS = int(os.environ.get("PATCHCTL_CTRL_C_SIGNALS", "240"))


@pytest.mark.slow
def test_ctrl_c_at_random_moments(tmp_path):
    seed = int(os.environ.get("PATCHCTL_CTRL_C_SEED") or random.SystemRandom().randrange(1 << 32))
    rng = random.Random(seed)
    wheels = make_index_files(tmp_path, versions=("1.0", "1.1", "1.2"), blobs=60)
    with IndexServer(tmp_path / "files") as server:
        for wheel in wheels:
            server.add("vllm", wheel)
        store = ["--store", str(tmp_path / "store")]
        on_index = [*store, "--index-url", server.url]
        applied = site(tmp_path / "applied")
        pristine = site(tmp_path / "pristine")
        # name: (argv, --json, the command's own exit code when it finished, needs a cold cache)
        commands = {
            "check cold": (["check", "vllm@1.0", *on_index], False, True),
            "check --json cold": (["check", "vllm@1.1", *on_index, "--json"], True, True),
            "check --verify --json cold": (["check", "vllm@1.2", *on_index, "--verify", "--json"], True, True),
            "check warm": (["check", "vllm@1.0", *on_index], False, False),
            "check --json warm": (["check", "vllm@1.1", *on_index, "--json"], True, False),
            "status --json": (["status", "vllm", "--target", str(applied), "--json"], True, False),
            "apply --dry-run": (["apply", "vllm", "--target", str(pristine), *store, "--dry-run"], False, False),
            "matrix": (["matrix", "--engine", "vllm", "--no-nightly", *on_index, "-o", str(tmp_path / "m.yaml")], False, False),
        }
        warm = tmp_path / "warm"
        for argv in (
            ["apply", "vllm", "--target", str(applied), *store],
            commands["check --json warm"][0],
            commands["check warm"][0],
        ):
            proc = subprocess.run([sys.executable, "-m", "patchctl.cli", *argv], capture_output=True, text=True, env=_env(warm))
            assert proc.returncode == 0, proc.stdout + proc.stderr

        tally: Counter = Counter()
        failures = []
        slowest = 0.0
        started = time.monotonic()
        n = 0
        while tally.total() - tally["finished before the signal"] < SIGNALS and n < 4 * SIGNALS:
            n += 1
            name = rng.choice(sorted(commands))
            argv, json_out, cold = commands[name]
            cache = tmp_path / f"cold-{n}" if cold else warm
            delay = rng.uniform(0.005, 0.6)
            proc = launch(argv, cache=cache, console_script=rng.random() < 0.5)
            time.sleep(delay)
            if proc.poll() is not None:  # finished before its signal: no Ctrl-C to judge
                proc.communicate()
                tally["finished before the signal"] += 1
                shutil.rmtree(cache, ignore_errors=True) if cold else None
                continue
            run = interrupt(proc)
            slowest = max(slowest, run.after_signal)
            if before_patchctl(run):
                outcome = "before patchctl's first line (the interpreter's start-up, the launcher)"
            else:
                found = problems(run, own={0}, json_out=json_out, cache=cache)
                outcome = "FAILED" if found else ("interrupted" if run.code in (130, -2) else "finished (work done)")
                if found:
                    failures.append(f"run {n} `{name}` SIGINT at {delay * 1000:.0f} ms: {'; '.join(found)}\n{_shown(run.stderr)}")
            tally[outcome] += 1
            if cold:
                shutil.rmtree(cache, ignore_errors=True)
        summary = (
            f"seed {seed} (PATCHCTL_CTRL_C_SEED={seed} replays it): {n} runs in {time.monotonic() - started:.0f} s, "
            f"{dict(tally)}, slowest end after its SIGINT {slowest:.2f} s"
        )
        print(summary)
        assert not failures, summary + "\n" + "\n\n".join(failures[:10])
        assert tally.total() - tally["finished before the signal"] >= SIGNALS, summary
        assert tally["interrupted"] >= SIGNALS // 2, summary  # most signals landed inside patchctl's run


def _shown(stderr: str) -> str:
    return stderr if len(stderr) < 4000 else stderr[:2000] + "\n[...]\n" + stderr[-2000:]


def _env(cache) -> dict:
    return dict(os.environ, PATCHCTL_CACHE_DIR=str(cache))
