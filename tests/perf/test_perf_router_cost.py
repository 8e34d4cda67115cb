"""perf/router_cost.py (issue 53.3): its stub streams a completion the way vLLM does (measured against
a real stub process on loopback), and its verdict judges the router as bootstrap runs it, not
another arm, and says "not measured" when that arm did not run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from perf import router_cost as RC

ROOT = Path(__file__).resolve().parents[2]


def arm(name, ms):
    return RC.Arm(name, 0, ttft=[x / 1e3 for x in ms], total=[x / 1e3 + 0.1 for x in ms])


def test_the_verdict_is_the_router_as_bootstrap_runs_it_minus_alone():
    alone = arm("stub alone", [1.0] * 99 + [2.0])
    fast = arm("round_robin", [1.1] * 100)
    ours = arm("router (bootstrap's)", [2.5] * 98 + [70.0, 80.0])
    found = {c.name.split()[2]: c for c in RC.checks([alone, fast, ours])}
    assert round(found["+p50"].value, 2) == 1.5 and found["+p50"].passed
    assert round(found["+p99"].value, 2) == 78.0 and found["+p99"].passed is False
    missing = RC.checks([alone, fast])
    assert all(c.value is None and "not among --settings" in c.why for c in missing)


def test_the_stub_streams_an_answer_over_loopback():
    port = RC.free_port()
    stub = subprocess.Popen([sys.executable, "-m", "perf.router_cost", "stub", str(port), "--itl-ms", "20"], cwd=ROOT)
    try:
        RC.wait_ready(port, 30)
        ttft, total = RC.one(port, None)
        # the first token at once, the other three 20 ms apart
        assert 0 < ttft < total and total - ttft >= 0.055, (ttft, total)
    finally:
        stub.terminate()
        stub.wait(10)
