#!/usr/bin/env python3
"""What the rack preflight adds to `bootstrap up`, at 1, 4 and 8 GPU-shaped nodes.

For each N in --nodes, on a GPU-shaped sandbox of N nodes (8 GPUs and two InfiniBand HCAs each,
healthy: the preflight finds nothing), --reps runs each, alternating, of (a new process each run):

    checked   `bootstrap up -i GPU-INVENTORY --dry-run --skip-check memlock`: connect, lock, facts
              (with the rack facts), the per-host preflight, the rack checks and the node-to-node
              port probe, the plan; nothing is started
    unchecked the same with every rack check skipped (`--skip-check` each of them): no port probe

and prints, medians: the wall time of each, their difference, and the preflight's own span read from
the run's stage lines (from the start of `preflight` to the end of `ports-stop`; the rack facts are
read in the facts stage, in parallel with the other facts). `memlock` is skipped in both: these
nodes' Docker cannot raise it (the preflight refuses that on every node, rightly).

Target: preflight span at the largest N <= 2 s (met, missed or not measured; perf/verdict.py).

Example: python -m perf.preflight --nodes 1,4,8 --reps 3   (tears the sandbox down at the end unless --keep)
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time

from bootstrap.cluster.preflight.checks import CHECKS
from perf import verdict as V
from perf.bringup import ROOT, bootstrap_cmd, render

TARGET_S = 2.0
SHAPE = ("--gpus", "8", "--ib", "infiniband", "--hcas", "2")
#: "    0.6s node1            ports-listen   done 0.1s"
_STAGE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(\S+)\s+(\S+)\s+(\S+)\s+(\d+(?:\.\d+)?)s")
PREFLIGHT_STAGES = ("preflight", "ports-listen", "ports-connect", "ports-stop")


def log(msg: str) -> None:
    print(f"preflight: {msg}", file=sys.stderr, flush=True)


def gpu_sandbox(n: int) -> str:
    log(f"bootstrap sandbox up --nodes {n} {' '.join(SHAPE)}")
    r = subprocess.run(bootstrap_cmd("sandbox", "up", "--nodes", str(n), *SHAPE), cwd=ROOT, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"preflight: sandbox up failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    for line in r.stdout.splitlines():
        if line.startswith("GPU inventory: "):
            return line[len("GPU inventory: "):].split(" ", 1)[0]
    raise SystemExit(f"preflight: no GPU inventory in the sandbox output:\n{r.stdout}")


def span(stderr: str, stages: tuple[str, ...]) -> float | None:
    """Seconds from the first start to the last end of these stages, from the stage lines."""
    starts, ends = [], []
    for line in stderr.splitlines():
        m = _STAGE.match(line)
        if m and m[3] in stages:
            end, took = float(m[1]), float(m[5])
            starts.append(end - took)
            ends.append(end)
    return max(ends) - min(starts) if starts else None


def run(inv: str, skip: list[str]) -> tuple[float, str]:
    args = [x for name in skip for x in ("--skip-check", name)]
    t = time.monotonic()
    r = subprocess.run(bootstrap_cmd("up", "-i", inv, "--dry-run", *args), cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t
    if r.returncode != 0:
        raise SystemExit(f"preflight: up --dry-run exited {r.returncode} (a healthy sandbox must pass):\n"
                         f"{r.stderr[-3000:]}")
    return wall, r.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,4,8", help="comma-separated node counts")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="leave the sandbox up at the end")
    a = ap.parse_args(argv)
    ns = sorted({int(x) for x in a.nodes.split(",") if x.strip()})
    rows = []
    try:
        for n in ns:
            inv = gpu_sandbox(n)
            run(inv, ["memlock"])  # warm-up: known_hosts read, Python caches
            checked, unchecked, spans = [], [], []
            for _ in range(a.reps):
                w, err = run(inv, ["memlock"])
                checked.append(w)
                spans.append(span(err, PREFLIGHT_STAGES))
                unchecked.append(run(inv, sorted(CHECKS))[0])
            med = statistics.median
            sp = [s for s in spans if s is not None]
            rows.append((n, med(checked), med(unchecked), med(sp) if sp else None))
            log(f"N={n}: checked {checked}, unchecked {unchecked}, preflight spans {spans}")
    finally:
        if not a.keep:
            subprocess.run(bootstrap_cmd("sandbox", "down"), cwd=ROOT, capture_output=True)

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"
    print(render(("N", "up --dry-run (s)", "rack checks skipped (s)", "difference (s)", "preflight span (s)"),
                 [(str(n), f(c), f(u), f(c - u), f(s)) for n, c, u, s in rows]))
    n_max, *_ , s_max = rows[-1]
    check = V.Check(f"preflight span at N={n_max}", "<=", TARGET_S, s_max, unit="s",
                    why="" if s_max is not None else "no stage lines read")
    for line in V.lines([check]):
        print(line)
    return V.exit_status([check])


if __name__ == "__main__":
    sys.exit(main())
