"""Issue 37 item 5, the acceptance: at concurrency 128 and 256, against benchmarks/paced_server.py (an
asyncio server with known timings, TTFT 300 ms, ITL 10 ms, 64 tokens, on cores of its own), validate's
load generator reads TTFT and ITL p50 within 5% of the truth and within 2% of a minimal asyncio client
run in the same benchmark (benchmarks/validate_client_cost.py, the medians of 3 rounds).

It needs a quiet machine of 16 cores (the client on one, the server's 8 workers on 8 others): on fewer
the server itself runs late and the figures measure the machine. It guards a property rather than a
defect: issue 37 measured the thread-per-slot client (run_level before it, the benchmark's `threads`)
12% high at c=128, but on the device machine (2026-12-05, docs/benchmarks.md) with this server keeping
time the threads were within 0.4% as well; they cost 45-50 us of CPU per token there, the loop 34-38."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORES = 16
LEVELS = ("128", "256")
# A run of the benchmark already made on this machine (its --json), judged instead of running another:
# the device machine's time is short, and its one run printed the whole table.
GIVEN = "PATCHCTL_CLIENT_COST_JSON"


@pytest.mark.slow
@pytest.mark.quiet
@pytest.mark.skipif(
    (os.cpu_count() or 1) < CORES,
    reason=f"needs {CORES} cores (client on one, the paced server's 8 workers on 8 more); this machine has {os.cpu_count()}",
)
def test_the_client_is_not_the_bottleneck_at_128_and_256(tmp_path):
    given = os.environ.get(GIVEN)
    out = Path(given) if given else tmp_path / "cost.json"
    if not given:
        bench = [sys.executable, str(REPO / "benchmarks" / "validate_client_cost.py"), "--json", str(out)]
        args = ["--concurrency", ",".join(LEVELS), "--repeat", "3", "--tools", "minimal,validate"]
        proc = subprocess.run(
            [*bench, *args, "--client-cpu", "0", "--server-cpus", "2-9"], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        print(proc.stdout)
    doc = json.loads(out.read_text())
    truth = doc["truth"]
    for c in LEVELS:
        ours, ref = doc["levels"][c]["validate"], doc["levels"][c]["minimal"]
        assert ours["failed"] == 0 and ref["failed"] == 0, doc
        for key in ("ttft", "itl"):
            assert abs(ref[key] - truth[key]) <= 0.05 * truth[key], f"c={c} {key}: the server or machine did not keep time: {doc}"
            assert abs(ours[key] - truth[key]) <= 0.05 * truth[key], f"c={c} {key} against the truth: {doc}"
            assert abs(ours[key] - ref[key]) <= 0.02 * ref[key], f"c={c} {key} against the minimal client: {doc}"
