#!/usr/bin/env python3
"""Bring-up benchmark: `bootstrap up` and `bootstrap down` on 1, 2, 4, 8 nodes, against a floor.

For each N in --nodes, on the first N hosts of one set of hosts (the first is the head), after a
warm-up `up` + `down` that is not measured (every node already has the image, and a `ray`-ok
marker for it), --reps repetitions (the median is reported) of:

    up      `bootstrap up -i INV --json` from all-down, wall time of the process (start included)
    down    `bootstrap down -i INV`, wall time of the process

FLOOR (from the same run, out of `up --json`'s per-host times): what the cluster itself takes
on the critical path, with no tool around it. A worker cannot start joining before the head's GCS
answers (`gcs_open` in the JSON: when `up`'s head-gcs stage saw the port open), so
    floor = max(head's `docker run` (run_end - run_start) + head's Ray join (run_end -> ray_seen),
                head's `docker run` + head's GCS start (run_end -> gcs_open)
                + max over workers of their `docker run` + their Ray join)
(without gcs_open, from an `up` that waited for the head in Ray first: head's docker run + Ray
join + the slowest worker's.)
ray_seen is when the Ray poller in the head container first saw the node alive (within its
0.1 s poll interval of Ray listing it). OVERHEAD = up - floor: what the tool adds (process
start, SSH, lock, facts, preflight, the checks, gaps between stages, the final report).

CONVERGENCE: from the last node's `ray start` (its container's "Ray runtime started" log line,
`docker logs --timestamps` read over SSH after the run, or ray_seen when that is earlier: the line
comes a little after the raylet registered) to `up` knowing the cluster ready (`ready_at` in its JSON,
when the ray-ready stage ended). The last
node is the last worker to start, or the head when N = 1.

RE-RUN: at the largest N, after each measured `up`, a second `up` on the unchanged cluster (it
changes nothing), compared with that first `up`.

Times mix three clocks: this machine's (process wall, docker run, ready_at), the head
container's (ray_seen) and each node's Docker daemon's (log timestamps). Sandbox nodes share
this machine's kernel clock; on a real cluster they differ by the clock skew (NTP: ms; `up
--json` gives head_clock_offset), which enters floor and convergence as an error of that size.

Hosts come from (one of):
    default        `bootstrap sandbox up --nodes max(N)` (full nodes: sshd + dockerd), torn down at
                   the end unless --keep; smaller N use its first N nodes. (A sandbox of another
                   size is recreated with empty disks, every node pulling the 4.2 GB image
                   again: one sandbox of max(N) nodes avoids that at each N.)
    --inventory F  an existing native inventory (its first N hosts); its containers are removed

Targets (exit status 1 when one is missed, or a run fails; each printed as met, missed or not
measured, with the reason: one N only or no N=1 gives no scaling ratio, see perf/verdict.py):
    up(Nmax)/up(1) <= 1.3     overhead < 2 s at every N     convergence < 1 s at every N
    re-run up <= 20% of the first up (at Nmax)

Example: python -m perf.bringup --nodes 1,2,4,8 --reps 3 --png perf/out/bringup.png
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from bootstrap.inventory import load_inventory
from perf import verdict as V
from perf.plot import line_plot

ROOT = Path(__file__).resolve().parent.parent

TARGET_SCALING = 1.3  # up(Nmax) / up(1)
TARGET_OVERHEAD = 2.0  # seconds, up - floor, every N
TARGET_CONVERGENCE = 1.0  # seconds, every N
TARGET_RERUN = 0.20  # re-run up / first up, at Nmax
RAY_STARTED = "Ray runtime started"


def log(msg: str) -> None:
    print(f"bringup: {msg}", file=sys.stderr, flush=True)


def bootstrap_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bootstrap", *args]


# -- hosts -----------------------------------------------------------------------------------------
def sandbox_up(n: int, extra: tuple[str, ...] = ()) -> Path:
    log(f"bootstrap sandbox up --nodes {n}{''.join(' ' + x for x in extra)}")
    r = subprocess.run(bootstrap_cmd("sandbox", "up", "--nodes", str(n), *extra), cwd=ROOT, stdout=subprocess.PIPE,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"bringup: sandbox up failed (exit {r.returncode})")
    for line in r.stdout.splitlines():
        if line.startswith("inventory: "):
            return Path(line[len("inventory: "):].strip())
    raise SystemExit(f"bringup: no inventory path in the sandbox output:\n{r.stdout}")


def first_hosts(inventory: Path, n: int, workdir: Path) -> Path:
    """A copy of a native inventory with its first n hosts, the first one the head."""
    doc = yaml.safe_load(inventory.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), list):
        raise SystemExit(f"bringup: {inventory}: a native inventory (with a hosts list) is needed")
    if len(doc["hosts"]) < n:
        raise SystemExit(f"bringup: {inventory} has {len(doc['hosts'])} host(s), {n} wanted")
    hosts = [dict(h) for h in doc["hosts"][:n]]
    for h in hosts:
        h.pop("role", None)
    hosts[0]["role"] = "head"
    path = workdir / f"inventory-{n}.yaml"
    path.write_text(yaml.safe_dump(dict(doc, hosts=hosts), sort_keys=False))
    load_inventory(str(path))  # refuse a broken subset here, not in the middle of a run
    return path


# -- running ---------------------------------------------------------------------------------------
@dataclass
class Run:
    seconds: float
    code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError:
            return {}


def timed(argv: list[str]) -> Run:
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    return Run(time.perf_counter() - t0, r.returncode, r.stdout, r.stderr)


def must(run: Run, what: str) -> Run:
    if run.code != 0:
        raise SystemExit(f"bringup: {what} exited {run.code}:\n{(run.stdout + run.stderr)[-3000:]}")
    return run


def up(inv: Path) -> Run:
    return timed(bootstrap_cmd("up", "--yes", "-i", str(inv), "--json"))


def down(inv: Path) -> Run:
    return timed(bootstrap_cmd("down", "--yes", "-i", str(inv)))


def docker_time(stamp: str) -> float | None:
    """`docker logs --timestamps` time (RFC 3339, nanoseconds) -> time.time() seconds."""
    try:
        day, frac = (stamp.rstrip("Z").split(".") + ["0"])[:2]
        t = datetime.strptime(day, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
        return t + float("0." + "".join(c for c in frac if c.isdigit()) or "0")
    except ValueError:
        return None


def ray_started_at(inv: Path, container: str) -> dict[str, float]:
    """host -> time of its container's "Ray runtime started" log line (hosts without one left out)."""
    r = timed(bootstrap_cmd("exec", "-i", str(inv), "--json", "--", "docker", "logs", "--timestamps", container))
    try:
        rows = json.loads(r.stdout)
    except json.JSONDecodeError:
        log(f"could not read the containers' logs (exit {r.code}): {(r.stdout + r.stderr)[-500:]}")
        return {}
    found = {}
    for row in rows:
        for line in ((row.get("stdout") or "") + "\n" + (row.get("stderr") or "")).splitlines():
            if RAY_STARTED in line:
                t = docker_time(line.split(" ", 1)[0])
                if t is not None:
                    found[row["host"]] = min(t, found.get(row["host"], t))
    return found


# -- one measured run ------------------------------------------------------------------------------
@dataclass
class Sample:
    up: float
    floor: float | None
    convergence: float | None
    stages: dict[str, float]


def analyse(doc: dict, wall: float, started: dict[str, float]) -> Sample:
    """Floor and convergence of one `up --json` document (see the module docstring)."""
    hosts = doc.get("hosts") or []

    def path(h: dict) -> float | None:
        if h.get("run_start") is None or h.get("run_end") is None or h.get("ray_seen") is None:
            return None
        return (h["run_end"] - h["run_start"]) + max(0.0, h["ray_seen"] - h["run_end"])

    head = [h for h in hosts if h.get("role") == "head"]
    workers = [h for h in hosts if h.get("role") != "head"]
    legs = [path(h) for h in head + workers]
    floor = None
    if head and None not in legs:
        gcs = doc.get("gcs_open")
        if gcs is None or len(legs) == 1:
            floor = legs[0] + max(legs[1:], default=0.0)
        else:
            h = head[0]
            to_gcs = (h["run_end"] - h["run_start"]) + max(0.0, gcs - h["run_end"])
            floor = max(legs[0], to_gcs + max(legs[1:]))

    def join(h: dict) -> float | None:
        # the earliest evidence of the node in Ray: `ray start` logs "Ray runtime started" a
        # little after its raylet registered, so the poller may have seen it first
        times = [t for t in (started.get(h["host"]), h.get("ray_seen")) if t is not None]
        return min(times) if times else None

    last = None
    if doc.get("ready_at") is not None:
        joins = [join(h) for h in (workers or head)]
        if joins and None not in joins:
            last = doc["ready_at"] - max(joins)
    return Sample(wall, floor, last, dict(doc.get("stages") or {}))


@dataclass
class Row:
    n: int
    ups: list[Sample] = field(default_factory=list)
    downs: list[float] = field(default_factory=list)
    reruns: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @staticmethod
    def _median(xs: list[float | None]) -> float | None:
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    @property
    def up(self) -> float | None:
        return self._median([s.up for s in self.ups])

    @property
    def down(self) -> float | None:
        return self._median(self.downs)

    @property
    def floor(self) -> float | None:
        return self._median([s.floor for s in self.ups])

    @property
    def overhead(self) -> float | None:
        return self._median([s.up - s.floor for s in self.ups if s.floor is not None])

    @property
    def convergence(self) -> float | None:
        return self._median([s.convergence for s in self.ups])

    @property
    def rerun(self) -> float | None:
        return self._median(self.reruns)

    def stages(self) -> dict[str, float]:
        names = list(dict.fromkeys(k for s in self.ups for k in s.stages))
        return {k: statistics.median([s.stages.get(k, 0.0) for s in self.ups]) for k in names}


def measure(n: int, inv: Path, container: str, reps: int, rerun: bool) -> Row:
    row = Row(n)
    must(down(inv), f"N={n} down (before)")
    must(up(inv), f"N={n} warm-up up")  # image present everywhere, markers written: not counted
    must(down(inv), f"N={n} warm-up down")
    for i in range(reps):
        u = up(inv)
        if u.code != 0:
            row.failures.append(f"N={n} up #{i + 1} exited {u.code}: {(u.stderr.strip().splitlines() or [''])[-1]}")
            down(inv)
            continue
        doc = u.json()
        if rerun:
            again = up(inv)
            if again.code != 0 or again.json().get("changed"):
                row.failures.append(f"N={n} re-run up #{i + 1}: exit {again.code}, "
                                    f"changed={again.json().get('changed')}")
            row.reruns.append(again.seconds)
        row.ups.append(analyse(doc, u.seconds, ray_started_at(inv, container)))
        d = down(inv)
        if d.code != 0:
            row.failures.append(f"N={n} down #{i + 1} exited {d.code}")
        row.downs.append(d.seconds)
    log(f"N={n}: up {fmt(row.up)}s, down {fmt(row.down)}s, floor {fmt(row.floor)}s, overhead "
        f"{fmt(row.overhead)}s, convergence {fmt(row.convergence)}s"
        + (f", re-run {fmt(row.rerun)}s" if rerun else "") + "; stages "
        + ", ".join(f"{k} {v:.2f}" for k, v in row.stages().items()))
    return row


# -- report ----------------------------------------------------------------------------------------
def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def render(head: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    line = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([line.format(*head), line.format(*("-" * w for w in widths)), *(line.format(*b) for b in body)])


def table(rows: list[Row]) -> str:
    one = rows[0] if rows[0].n == 1 else None

    def ratio(x: float | None, base: float | None) -> str:
        return fmt(x / base if x and base else None)

    body = [(str(r.n), fmt(r.up), fmt(r.down), ratio(r.up, one and one.up), fmt(r.floor),
             ratio(r.floor, one and one.floor), fmt(r.overhead)) for r in rows]
    return render(("N", "up (s)", "down (s)", "up(N)/up(1)", "floor (s)", "floor(N)/floor(1)", "overhead (s)"),
                  body)


def convergence_table(rows: list[Row]) -> str:
    return render(("N", "convergence (s)", "max (s)"),
                  [(str(r.n), fmt(r.convergence),
                    fmt(max((s.convergence for s in r.ups if s.convergence is not None), default=None)))
                   for r in rows])


def stage_table(rows: list[Row]) -> str:
    names = list(dict.fromkeys(k for r in rows for k in r.stages()))
    return render(("N", *names), [(str(r.n), *(fmt(r.stages().get(k)) for k in names)) for r in rows])


def write_png(rows: list[Row], path: str, title: str) -> None:
    """Median up, down and floor vs N."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    line_plot(path, title, [r.n for r in rows],
              {label: [getattr(r, attr) for r in rows]
               for attr, label in (("up", "bootstrap up"), ("down", "bootstrap down"),
                                   ("floor", "floor (head + slowest worker: docker run + Ray join)"))},
              xlabel="nodes (N)", prefix="bringup")


def checks(rows: list[Row]) -> tuple[list[V.Check], list[str]]:
    """Each target of the module docstring checked against what the run measured (not measured,
    with the reason, where it could not be), and the runs that failed."""
    failures = [f for r in rows for f in r.failures]
    first, last = rows[0], rows[-1]
    out = []
    scaling = ("up(Nmax)/up(1)", "<=", TARGET_SCALING)
    if (why := V.no_ratio_to_one([r.n for r in rows])) is not None:
        out.append(V.not_measured(*scaling, why))
    elif first.up is None or last.up is None:
        out.append(V.not_measured(*scaling, f"no successful up at N={(last if first.up else first).n}"))
    else:
        out.append(V.Check(f"up({last.n})/up(1)", "<=", TARGET_SCALING, last.up / first.up))
    for r in rows:  # a Check's value None prints as not measured, with its why
        out.append(V.Check(f"overhead at N={r.n}", "<", TARGET_OVERHEAD, r.overhead, unit="s", why=(
            "no successful up" if not r.ups else "no floor: per-host times missing from `up --json`")))
    for r in rows:
        out.append(V.Check(f"convergence at N={r.n}", "<", TARGET_CONVERGENCE, r.convergence, unit="s", why=(
            "no successful up" if not r.ups else "no ready_at or join times in `up --json`")))
    rerun = (f"re-run up({last.n}) / first up", "<=", TARGET_RERUN)
    if last.rerun is not None and last.up:
        out.append(V.Check(*rerun, last.rerun / last.up, spec=".0%"))
    else:
        out.append(V.not_measured(*rerun, f"no re-run measured at N={last.n}", spec=".0%"))
    return out, failures


def _interrupt(signum, frame):  # noqa: ANN001 - signal handler
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1,2,4,8", help="node counts, comma-separated (default 1,2,4,8)")
    p.add_argument("--reps", type=int, default=3, help="measured up/down per N (median; default 3)")
    p.add_argument("--png", default="perf/out/bringup.png",
                   help="time vs N plot (default perf/out/bringup.png; '' for none)")
    p.add_argument("--keep", action="store_true", help="leave the sandbox up at the end")
    p.add_argument("--inventory", type=Path, help="use this native inventory's first N hosts (no sandbox)")
    a = p.parse_args(argv)
    nodes = sorted({int(x) for x in a.nodes.split(",") if x.strip()})
    if not nodes or nodes[0] < 1 or a.reps < 1:
        p.error("--nodes needs positive counts and --reps at least 1")

    work = Path(tempfile.mkdtemp(prefix="bootstrap-bringup-"))
    made_sandbox = False
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if a.inventory:
            inventory, source = a.inventory, str(a.inventory)
        else:
            made_sandbox = True
            inventory, source = sandbox_up(nodes[-1]), "sandbox (full nodes)"
        full = first_hosts(inventory, nodes[-1], work)
        container = load_inventory(str(full)).cluster.container_name
        # Every node gets the image (the first pull is the registry's time, not the tool's) and
        # its ray-ok marker, in one unmeasured round on all of them.
        log(f"warm-up on {nodes[-1]} node(s): up + down, not measured")
        must(down(full), "warm-up down (before)")
        must(up(full), "warm-up up")
        must(down(full), "warm-up down")
        rows = [measure(n, first_hosts(inventory, n, work), container, a.reps, rerun=n == nodes[-1])
                for n in nodes]
        print(f"bring-up on {source}: median of {a.reps} run(s), {os.cpu_count()} CPU(s)")
        print("floor = max(head: docker run + Ray join, head: docker run + GCS start + slowest worker: "
              "docker run + Ray join); overhead = up - floor")
        print(table(rows))
        last = rows[-1]
        if last.rerun is not None:
            print(f"\nre-run: second up on the unchanged {last.n}-node cluster {last.rerun:.2f}s = "
                  f"{last.rerun / last.up:.0%} of the first up ({last.up:.2f}s)")
        print("\nconvergence = up ready (ready_at) - the last node's `ray start` (its \"Ray runtime started\" "
              "log line, or the poller's first sight when earlier)")
        print(convergence_table(rows))
        print("\nup stages, median (s)")
        print(stage_table(rows))
        if a.png:
            write_png(rows, a.png, f"bring-up, {source}")
            print(f"plot: {a.png}")
        found, failures = checks(rows)
        for line in V.lines(found, failures):
            print(line)
        return V.exit_status(found, failures)
    finally:
        if made_sandbox and not a.keep:
            log("bootstrap sandbox down")
            subprocess.run(bootstrap_cmd("sandbox", "down"), cwd=ROOT)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
