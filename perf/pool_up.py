#!/usr/bin/env python3
"""`up` of a pool of R replica groups against `up` of one group, side by side in one run (issue 52.6).

`up` of a fleet brings every replica group's cluster up at once (fleet/lifecycle.py up_fleet), each
in its own session; before, one after the other. For each runtime (Ray, and vLLM's native mode), from
a torn-down fleet with the image on every node, runs interleaved over --reps (R=1, R=2, ..., R=1, ...):

    up(R)        `bootstrap up -i INV --json` of R groups of --group-size nodes: process wall time
    CPU s        busy CPU seconds of this whole machine over that run (/proc/stat): the sandbox's nodes
                 share this machine's cores, so up(R) cannot be shorter than CPU s / cores here
    R x up(1)    what bringing the groups up one after the other costs

With --cold each run starts with the image removed from every node (the registry keeps it): every node
pulls it, through its group head's registry mirror.

Target: up(R)/up(1) <= 1.3 for the largest R, per runtime, printed as met, missed or not measured
(perf/verdict.py); exit status 1 when one is missed or a run fails.

Example: python -m perf.pool_up --groups 1,2 --reps 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from perf import verdict as V
from perf.bringup import Run, bootstrap_cmd, down, fmt, render, sandbox_up, timed

TARGET = 1.3  # up(R) / up(1), largest R


def log(msg: str) -> None:
    print(f"pool_up: {msg}", file=sys.stderr, flush=True)


def busy_cpu_seconds() -> float:
    """Busy CPU seconds of this machine since boot (user, nice, system, irq, softirq)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / ticks


def pool_inventory(base: Path, groups: int, size: int, runtime: str, workdir: Path) -> Path:
    """The sandbox's inventory with its first groups x size hosts as `groups` replica groups."""
    doc = yaml.safe_load(base.read_text())
    hosts = [dict(h) for h in doc["hosts"][:groups * size]]
    if len(hosts) < groups * size:
        raise SystemExit(f"pool_up: {base} has {len(doc['hosts'])} host(s), {groups * size} wanted")
    for h in hosts:
        h.pop("role", None)
    doc["hosts"] = hosts
    doc["cluster"]["runtime"] = runtime
    if groups > 1:
        doc["cluster"]["replicas"] = groups
    else:
        doc["cluster"].pop("replicas", None)
    path = workdir / f"pool-{runtime}-{groups}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def forget_image(base: Path, nodes: int) -> None:
    """--cold: the image off the first `nodes` sandbox nodes (their Docker), the registry untouched."""
    doc = yaml.safe_load(base.read_text())
    image = doc["cluster"]["image"]
    for k in range(1, nodes + 1):
        subprocess.run(["docker", "exec", f"bootstrap-sandbox-node{k}", "docker", "image", "rm", "-f", image],
                       capture_output=True, text=True, timeout=120)


def one_run(inv: Path, everything: Path, base: Path, nodes: int, cold: bool) -> tuple[Run, float]:
    gone = down(everything)
    if gone.code != 0:
        raise SystemExit(f"pool_up: down exited {gone.code}:\n{gone.stderr[-2000:]}")
    if cold:
        forget_image(base, nodes)
    before = busy_cpu_seconds()
    run = timed(bootstrap_cmd("up", "--yes", "-i", str(inv), "--json"))
    return run, busy_cpu_seconds() - before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", default="1,2", help="replica group counts R, comma-separated (1 included)")
    ap.add_argument("--group-size", type=int, default=2, help="nodes per replica group")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--runtime", choices=("ray", "none", "both"), default="both")
    ap.add_argument("--cold", action="store_true", help="remove the image from every node before each run")
    a = ap.parse_args(argv)
    counts = sorted({int(x) for x in a.groups.split(",")} | {1})
    runtimes = ("ray", "none") if a.runtime == "both" else (a.runtime,)
    nodes = max(counts) * a.group_size
    base = sandbox_up(nodes)
    cores = os.cpu_count() or 1
    rows, checks, failures = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for rt in runtimes:
            invs = {r: pool_inventory(base, r, a.group_size, rt, work) for r in counts}
            walls: dict[int, list[float]] = {r: [] for r in counts}
            cpus: dict[int, list[float]] = {r: [] for r in counts}
            for rep in range(a.reps):
                for r in (counts if rep % 2 == 0 else counts[::-1]):
                    run, cpu = one_run(invs[r], invs[max(counts)], base, nodes, a.cold)
                    log(f"{rt} R={r} rep {rep + 1}: exit {run.code} in {run.seconds:.1f}s, {cpu:.1f} CPU s")
                    if run.code != 0:
                        failures.append(f"{rt} R={r} rep {rep + 1}: up exited {run.code}: {run.stderr[-400:]}")
                        continue
                    walls[r].append(run.seconds)
                    cpus[r].append(cpu)
            one = statistics.median(walls[1]) if walls[1] else None
            for r in counts:
                w = statistics.median(walls[r]) if walls[r] else None
                c = statistics.median(cpus[r]) if cpus[r] else None
                ratio = w / one if (w is not None and one) else None
                least = min(walls[r]) if walls[r] else None
                rows.append((rt, str(r), str(len(walls[r])), fmt(w, ".1f"), fmt(least, ".1f"),
                             fmt(c, ".1f"), fmt(None if c is None else c / cores, ".1f"),
                             fmt(None if one is None else r * one, ".1f"), fmt(ratio)))
            top = max(counts)
            name = f"up({top})/up(1) [{rt}]"
            if top == 1:
                checks.append(V.not_measured(name, "<=", TARGET, "one R only: --groups 1"))
            else:
                w = statistics.median(walls[top]) if walls[top] else None
                checks.append(V.Check(name, "<=", TARGET, w / one) if (w is not None and one)
                              else V.not_measured(name, "<=", TARGET, "every run failed at R=1 or R=max"))
        down(work / f"pool-{runtimes[-1]}-{max(counts)}.yaml")
    image = "the image removed from every node before each run" if a.cold else "the image on every node"
    print(f"pool up: {a.group_size} node(s) per group, {image}, "
          f"median of {a.reps}; this machine has {cores} core(s) for every sandbox node")
    print(render(("runtime", "R", "runs", "up(R) s", "min s", "CPU s", "CPU floor s", "R x up(1) s", "up(R)/up(1)"),
                 rows))
    print()
    for line in V.lines(checks, failures):
        print(line)
    return V.exit_status(checks, failures)


if __name__ == "__main__":
    sys.exit(main())
