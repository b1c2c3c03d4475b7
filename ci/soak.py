#!/usr/bin/env python3
"""kill -9 soak: `apply` and `revert` killed at a random moment of their write phase must end, after
the next command, exactly pristine or exactly fully applied, with no temp file left.

Each trial: reset a real target (a tree of --files files of --file-kb KiB each, patched by a series
of 4 patches that touch all of them) to pristine (for apply) or fully applied (for revert); start
`python -m patchctl.cli.main apply|revert ...` as a subprocess; poll in a tight loop (os.path.exists)
until its journal.json appears (in the tree, <root>/.patchctl/<engine>/); sleep a random 0–--max-delay-ms (seeded RNG) and
kill -9 it; run one random follow-up (status / apply / revert / ensure: the real CLI, in the worker
process, or with --follow-up-subprocess as a process of its own); then
check that the tree is byte for byte pristine or fully applied, that the follow-up's exit code and
the bookkeeping agree with it (no journal left; a state record exactly when applied), and count the
`.patchctl-*.tmp` files left anywhere under the tree or the data dir.

Prints a table per command (trials, killed, killed inside the window — the journal still there
after the kill —, killed mid-write — a temp file there after the kill, for the follow-up to sweep —,
ended pristine, ended applied, neither, temp files left, follow-up wrong); exits 1
if any trial ends neither pristine nor applied, leaves a temp file, or has a follow-up that
contradicts the tree; 2 when the target cannot even be set up. Bounded in time: --max-seconds
(default 240) stops early and reports what ran ("stopped early"). --json prints the counts as one
document. Trials are independent and seeded per (seed, command, trial number), so a failing trial
can be re-run alone with --only COMMAND:N.

  python ci/soak.py                       # 200 trials per command
  python ci/soak.py --trials 20 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def soak_engine():
    """Any engine serves (the soak exercises the writer, not an engine): the first engines.yaml names."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from patchctl.core.engines import all_engines

    return next(iter(all_engines().values()))


ENGINE = soak_engine().name
PACKAGE = soak_engine().version_package  # the package the fake tree holds
SPEC = f"{ENGINE}@1.0"
COMMANDS = ("apply", "revert")
FOLLOW_UPS = ("status", "apply", "revert", "ensure")
PATCHES = 4


def is_temp(name: str) -> bool:
    return name.startswith(".") and ".patchctl-" in name and name.endswith(".tmp")


def pristine_files(count: int, size: int) -> dict[str, str]:
    files = {f"{PACKAGE}/__init__.py": ""}
    for n in range(count):
        lines, total, i = [], 0, 0
        while total < size:
            # long lines (~400 bytes): the engine's search for a hunk is per line, the writes per byte
            line = f"value_{n:02d}_{i:06d} = {(i * 7919) % 100003:>6}  # {'a long line of data; ' * 18}\n"
            lines.append(line)
            total += len(line)
            i += 1
        files[f"{PACKAGE}/mod_{n:02d}.py"] = "".join(lines)
    return files


def patched_file(text: str, n: int) -> str:
    lines = text.splitlines(keepends=True)
    for at in (5, len(lines) - 5):
        lines[at] = f"patched_{n:02d}_{at} = True  # the soak's patch\n"
    return "".join(lines)


class Rig:
    """One target: its tree, its data dir, the shared store, and the two reference states."""

    def __init__(self, work: Path, store: Path, pristine: dict[str, str]):
        self.work, self.store = work, store
        self.tree = work / "tree"
        self.data = work / "data"
        self.env = {k: v for k, v in os.environ.items() if k != "PATCHCTL_STORE"}
        self.env.update(
            PATCHCTL_DATA_DIR=str(self.data),
            PATCHCTL_CONFIG=str(work / "config.yaml"),
            PATCHCTL_CACHE_DIR=str(work / "cache"),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        )
        for rel, text in pristine.items():
            path = self.tree / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        books = self.tree / ".patchctl" / ENGINE
        self.journal, self.state = str(books / "journal.json"), str(books / "state.json")
        self.pristine = self.read_tree()
        rc, doc = self.cli("apply")
        if rc != 0:
            raise SystemExit(f"soak: the reference apply failed (exit {rc}): {doc}")
        self.applied = self.read_tree()
        changed = [p for p in self.pristine if self.pristine[p] != self.applied.get(p)]
        if len(changed) < len(pristine) - 1:
            raise SystemExit(f"soak: the reference apply changed only {changed}")
        self.book_applied = self.read_book()
        rc, doc = self.cli("revert")
        if rc != 0 or self.read_tree() != self.pristine:
            raise SystemExit(f"soak: the reference revert failed (exit {rc}): {doc}")
        self.book_pristine = self.read_book()

    def window_ms(self, command: str) -> float | None:
        """How long the journal exists in an uninterrupted run of `command` (the window kills aim at)."""
        self.reset("pristine" if command == "apply" else "applied")
        exists, journal = os.path.exists, self.journal
        proc = subprocess.Popen(self.argv(command), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        appeared = gone = None
        while proc.poll() is None:
            there = exists(journal)
            if there and appeared is None:
                appeared = time.perf_counter()
            elif not there and appeared is not None:
                gone = time.perf_counter()
                break
        proc.wait()
        if appeared is None:
            return None
        return round(((gone or time.perf_counter()) - appeared) * 1000, 1)

    # commands ------------------------------------------------------------------------------------
    def argv(self, command: str) -> list[str]:
        args = [sys.executable, "-m", "patchctl.cli.main", command, SPEC, "--target", str(self.tree), "--json"]
        return args + ["--store", str(self.store)] if command in ("apply", "ensure") else args

    def cli(self, command: str, *, in_process: bool = False) -> tuple[int, dict]:
        """`patchctl COMMAND ... --json`: a subprocess, or in this process (the real CLI through click's
        runner, with this target's environment: what a fresh process would run, less its start-up)."""
        if in_process:
            from click.testing import CliRunner

            from patchctl.cli.main import main

            os.environ.update(self.env)
            result = CliRunner().invoke(main, self.argv(command)[3:])
            code, out, err = result.exit_code, result.stdout, repr(result.exception or "")
        else:
            proc = subprocess.run(self.argv(command), env=self.env, capture_output=True, text=True)
            code, out, err = proc.returncode, proc.stdout, proc.stderr
        try:
            doc = json.loads(out)
        except json.JSONDecodeError:
            doc = {"stdout": out[-2000:], "stderr": err[-2000:]}
        return code, doc

    # the files -----------------------------------------------------------------------------------
    def read_tree(self) -> dict[str, bytes]:
        out = {}
        for dirpath, dirnames, filenames in os.walk(self.tree):
            dirnames[:] = [d for d in dirnames if d != ".patchctl"]
            for name in filenames:
                if not is_temp(name):
                    path = Path(dirpath) / name
                    out[path.relative_to(self.tree).as_posix()] = path.read_bytes()
        return out

    def book_dirs(self) -> list[Path]:
        return [self.tree / ".patchctl", self.data]

    def read_book(self) -> dict[str, bytes]:
        """Every file of the bookkeeping (in the tree and under the data dir) but the lock."""
        out = {}
        for base in self.book_dirs():
            for dirpath, _, filenames in os.walk(base):
                for name in filenames:
                    if name != "lock" and not is_temp(name):
                        path = Path(dirpath) / name
                        out[str(path)] = path.read_bytes()
        return out

    def temp_files(self) -> list[str]:
        found = []
        for base in (self.tree, self.data):
            for dirpath, _, filenames in os.walk(base):
                found += [os.path.join(dirpath, n) for n in filenames if is_temp(n)]
        return sorted(found)

    def reset(self, which: str) -> None:
        """Put tree and bookkeeping back exactly as the reference state `which` had them."""
        for path in self.temp_files():
            os.unlink(path)
        tree_ref = self.pristine if which == "pristine" else self.applied
        book_ref = self.book_pristine if which == "pristine" else self.book_applied
        now = self.read_tree()
        for rel in now.keys() - tree_ref.keys():
            (self.tree / rel).unlink()
        for rel, data in tree_ref.items():
            if now.get(rel) != data:
                (self.tree / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.tree / rel).write_bytes(data)
        book = self.read_book()
        for path in book.keys() - book_ref.keys():
            os.unlink(path)
        for path, data in book_ref.items():
            if book.get(path) != data:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_bytes(data)

    def end_state(self) -> str:
        now = self.read_tree()
        return "pristine" if now == self.pristine else "applied" if now == self.applied else "neither"


def trial(rig: Rig, command: str, number: int, seed: int, max_delay_ms: float, in_process: bool = True) -> dict:
    rng = random.Random(f"{seed}:{command}:{number}")
    delay = rng.uniform(0, max_delay_ms) / 1000
    follow = rng.choice(FOLLOW_UPS)
    t0 = time.perf_counter()
    rig.reset("pristine" if command == "apply" else "applied")
    t1 = time.perf_counter()
    exists, journal = os.path.exists, rig.journal
    proc = subprocess.Popen(rig.argv(command), env=rig.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    saw = False
    # A tight loop (the write phase lasts a few tens of milliseconds), that never sleeps but yields
    # the core at each turn: on two loaded cores a spinning poller would otherwise take the CPU the
    # child needs to get there (it doubled each trial's time).
    while True:
        if exists(journal):
            saw = True
            break
        if proc.poll() is not None:
            break
        os.sched_yield()
    if saw:
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)  # not sent if it has exited already
    rc = proc.wait()
    killed = rc == -signal.SIGKILL
    in_window = killed and exists(journal)
    left_by_kill = len(rig.temp_files())
    t2 = time.perf_counter()
    frc, fdoc = rig.cli(follow, in_process=in_process)
    t3 = time.perf_counter()
    end = rig.end_state()
    temps = rig.temp_files()
    has_state = exists(rig.state)
    has_journal = exists(journal)
    wrong = []
    if frc != 0:
        said = (fdoc.get("error") or {}).get("message") or fdoc.get("message") or str(fdoc)[:300]
        wrong.append(f"{follow} exited {frc}: {said}")
    elif follow in ("apply", "ensure") and end != "applied":
        wrong.append(f"{follow} exited 0 but the tree is {end}")
    elif follow == "revert" and end != "pristine":
        wrong.append(f"revert exited 0 but the tree is {end}")
    elif follow == "status" and fdoc.get("state") != {"pristine": "not-applied", "applied": "intact"}.get(end):
        wrong.append(f"status says {fdoc.get('state')} over a {end} tree")
    if has_journal:
        wrong.append("a journal is left after the follow-up")
    if end in ("pristine", "applied") and has_state != (end == "applied"):
        wrong.append(f"the tree is {end} but a state record is {'there' if has_state else 'missing'}")
    return {
        "command": command,
        "trial": number,
        "delay_ms": round(delay * 1000, 2),
        "exit": rc,
        "killed": killed,
        "in_window": in_window,
        "temp_after_kill": left_by_kill,
        "follow_up": follow,
        "end": end,
        "temp_files": temps,
        "wrong": wrong,
        "seconds": {
            "reset": round(t1 - t0, 3),
            "killed_run": round(t2 - t1, 3),
            "follow_up": round(t3 - t2, 3),
            "check": round(time.perf_counter() - t3, 3),
        },
    }


# --- workers ---------------------------------------------------------------------------------

_RIG: Rig | None = None


def _worker_init(work: str, store: str, pristine: dict[str, str]) -> None:
    global _RIG
    name = f"w{os.getpid()}"
    _RIG = Rig(Path(work) / name, Path(store), pristine)


def _run(job: tuple[str, int, int, float, float, bool]) -> dict | None:
    command, number, seed, max_delay_ms, deadline, in_process = job
    assert _RIG is not None
    if command.startswith("window:"):  # calibration: how long the journal exists when nobody kills
        return {"window": command.split(":", 1)[1], "ms": _RIG.window_ms(command.split(":", 1)[1])}
    if time.time() > deadline:
        return None
    return trial(_RIG, command, number, seed, max_delay_ms, in_process)


def build_store(work: Path, pristine: dict[str, str]) -> Path:
    sys.path.insert(0, str(ROOT))
    from support.builders import StoreBuilder

    builder = StoreBuilder(work / "store")
    mods = sorted(p for p in pristine if p.endswith(".py") and "mod_" in p)
    for k in range(PATCHES):
        part = mods[k::PATCHES]
        patched = {p: patched_file(pristine[p], int(p[-5:-3])) for p in part}
        builder.add(ENGINE, f"soak{k}", variants={"1.0": builder.variant(pristine, patched, subject=f"soak {k}")})
    return builder.root


def default_base() -> str | None:
    """/dev/shm when it has room: fsync costs nothing there, so the write phase lasts ~20–40 ms and
    kills 0–20 ms after the journal appears land all over it (on a disk it lasts 100–300 ms, and
    they would only ever hit its first files). Otherwise the system's temp dir."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
        if os.access(shm, os.W_OK) and st.f_bavail * st.f_frsize > 512 * 1024 * 1024:
            return shm
    except OSError:
        pass
    return None


# --- the report ------------------------------------------------------------------------------

COLUMNS = [
    ("trials", "trials"),
    ("killed", "killed"),
    ("in_window", "killed inside the window"),
    ("temp_after_kill", "killed mid-write (temp file)"),
    ("pristine", "ended pristine"),
    ("applied", "ended applied"),
    ("neither", "neither"),
    ("temp_files", "temp files left"),
    ("wrong", "follow-up wrong"),
]


def count(results: list[dict]) -> dict[str, dict[str, int]]:
    out = {}
    for command in COMMANDS:
        rs = [r for r in results if r["command"] == command]
        out[command] = {
            "trials": len(rs),
            "killed": sum(r["killed"] for r in rs),
            "in_window": sum(r["in_window"] for r in rs),
            "pristine": sum(r["end"] == "pristine" for r in rs),
            "applied": sum(r["end"] == "applied" for r in rs),
            "neither": sum(r["end"] == "neither" for r in rs),
            "temp_files": sum(len(r["temp_files"]) for r in rs),
            "wrong": sum(bool(r["wrong"]) for r in rs),
            "temp_after_kill": sum(r["temp_after_kill"] > 0 for r in rs),
        }
        if rs:
            out[command]["mean_seconds"] = {k: round(sum(r["seconds"][k] for r in rs) / len(rs), 3) for k in rs[0]["seconds"]}
    return out


def table(counts: dict[str, dict[str, int]]) -> str:
    width = max(len(h) for _, h in COLUMNS)
    lines = [f"{'':<{width}}  " + "  ".join(f"{c:>8}" for c in counts)]
    for key, head in COLUMNS:
        lines.append(f"{head:<{width}}  " + "  ".join(f"{counts[c][key]:>8}" for c in counts))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200, help="trials per command (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=240, help="stop early after this long (default 240)")
    parser.add_argument("--max-delay-ms", type=float, default=20, help="the kill comes 0..this after the journal appears")
    parser.add_argument("--files", type=int, default=20, help="files the series patches (default 20)")
    parser.add_argument("--file-kb", type=int, default=200, help="KiB per file (default 200)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="targets soaked side by side, one process each (default: 2, or 1 on one core)",
    )
    parser.add_argument("--workdir", help="where the targets go (default: a new temp dir, removed unless a trial fails)")
    parser.add_argument(
        "--follow-up-subprocess",
        action="store_true",
        help="run the follow-up as its own process too (default: in the worker, through the "
        "real CLI; the same code less ~0.3 s of start-up per trial)",
    )
    parser.add_argument("--only", help="run one trial: COMMAND:N")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON document")
    args = parser.parse_args(argv)

    started = time.time()
    deadline = started + args.max_seconds
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="patchctl-soak-", dir=default_base()))
    work.mkdir(parents=True, exist_ok=True)
    pristine = pristine_files(args.files, args.file_kb * 1024)
    try:
        store = build_store(work, pristine)
    except Exception as exc:  # git missing, ...
        print(f"soak: cannot build the store: {exc}", file=sys.stderr)
        return 2
    if args.only:
        command, _, n = args.only.partition(":")
        jobs = [(command, int(n), args.seed, args.max_delay_ms, deadline, not args.follow_up_subprocess)]
    else:  # interleaved, so that stopping early still covers both commands
        jobs = [
            (c, n, args.seed, args.max_delay_ms, deadline, not args.follow_up_subprocess)
            for n in range(args.trials)
            for c in COMMANDS
        ]
        jobs = [(f"window:{c}", i, 0, 0.0, deadline, False) for i in range(2) for c in COMMANDS] + jobs
    results: list[dict] = []
    windows: dict[str, list[float | None]] = {}
    try:
        with ProcessPoolExecutor(
            max_workers=max(1, args.jobs), initializer=_worker_init, initargs=(str(work), str(store), pristine)
        ) as pool:
            for r in pool.map(_run, jobs, chunksize=1):
                if r is not None and "window" in r:
                    windows.setdefault(r["window"], []).append(r["ms"])
                elif r is not None:
                    results.append(r)
    except SystemExit as exc:  # a worker could not set up its target
        print(exc, file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"soak: a worker failed: {exc!r}", file=sys.stderr)
        return 2
    elapsed = time.time() - started
    counts = count(results)
    bad = [r for r in results if r["end"] == "neither" or r["temp_files"] or r["wrong"]]
    trials_asked = sum(not j[0].startswith("window:") for j in jobs)
    stopped_early = len(results) < trials_asked
    ok = not bad and bool(results)
    if not bad and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "ok": ok,
        "seed": args.seed,
        "elapsed_s": round(elapsed, 1),
        "stopped_early": stopped_early,
        "requested_per_command": args.trials if not args.only else None,
        "config": {
            "files": args.files,
            "file_kb": args.file_kb,
            "max_delay_ms": args.max_delay_ms,
            "patches": PATCHES,
            "jobs": args.jobs,
        },
        "write_window_ms": windows,
        "counts": counts,
        "failures": bad[:20],
        "workdir": None if not bad and not args.workdir else str(work),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(
            f"kill -9 soak: seed {args.seed}, {args.files} files × {args.file_kb} KiB, kill 0–{args.max_delay_ms:g} ms "
            f"after the journal appears, {elapsed:.0f} s"
        )
        if windows:
            print(
                "write window (journal present) of an uninterrupted run: "
                + ", ".join(f"{c} {' / '.join('?' if ms is None else f'{ms:g}' for ms in v)} ms" for c, v in windows.items())
            )
        print(table(counts))
        if stopped_early:
            print(
                f"stopped early after {elapsed:.0f} s (--max-seconds {args.max_seconds:g}): "
                f"{len(results)} of {trials_asked} trials ran"
            )
        for r in bad[:10]:
            print(
                f"FAIL {r['command']}:{r['trial']} (kill at +{r['delay_ms']} ms, exit {r['exit']}, "
                f"then {r['follow_up']}): ended {r['end']}; temp files {r['temp_files']}; {'; '.join(r['wrong'])}"
            )
        if bad:
            print(f"{len(bad)} trial(s) failed; the targets are kept in {work}")
        elif not results:
            print("no trial ran: nothing was shown (exit 1)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
