#!/usr/bin/env python3
"""How long a replica takes to come back after one of its members is killed, part by part.

Needs a fleet already serving (`bootstrap up` + `bootstrap serve` with cluster.replicas >= 2), whose
replicas' data-plane URLs this machine reaches (the sandbox's do). Under a light load through the
router, it runs `docker kill` on the serve container of one member of the last replica (over SSH,
as an operator's slip would) and times, from the moment the kill returned:

  (before the kill, the victim's standby is waited for until it has vLLM imported: the column
  `standby` says whether it was)
  keeper acted                     the keeper's line on the victim: its standby took over (the
                                   standby, vLLM imported, renamed and told to serve) or it started
                                   the killed container again (no standby)
  whole group restarted            the last member of the replica started vLLM again (its survivors
                                   stop theirs and the group meets again: checks/member.py), from
                                   the members' own `starting` lines
  vLLM answers /health             first 200 from the replica's API server (polled every 0.2 s)
  back in rotation                 the replica served a request of the load through the router again
                                   (its vllm:request_success_total grew, polled every 0.5 s)

and prints each step's share, then the verdict against the target (back in rotation within 30 s).
Requests of the load that failed are counted: those in flight on the killed replica may fail,
none after (the router sends them to the others).

Example: python -m perf.heal -i fleet.yaml [--member 0] [--runs 1]
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.request

from bootstrap.fleet import names as FN
from bootstrap.fleet import routers as FRT
from bootstrap.inventory import load_inventory
from bootstrap.remote.session import Session
from bootstrap.serve import bench as B
from bootstrap.serve import benchload as BL
from perf import verdict as V
from perf.bringup import docker_time

TARGET_S = 30.0


def get(url: str, key: str | None, timeout: float = 2.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except Exception as exc:  # refused, reset, timeout, 5xx: not serving yet
        return getattr(exc, "code", 0) or 0, b""


def served(url: str, key: str | None) -> float | None:
    code, body = get(url + "/metrics", key)
    if code != 200:
        return None
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in body.decode(errors="replace").splitlines()
               if ln.startswith("vllm:request_success_total{"))


def log_lines(sess: Session, host: str, name: str, since: float, needle: str) -> list[tuple[float, str]]:
    """The container's log lines since SINCE that hold NEEDLE: (time, text)."""
    r = sess.ssh[host].run(("docker", "logs", "-t", "--since", f"{since:.3f}", name), timeout=60, check=False)
    out = []
    for ln in (r.stdout + r.stderr).splitlines():
        stamp, _, text = ln.partition(" ")
        t = docker_time(stamp)
        if t is not None and needle in text:
            out.append((t, text))
    return out


class Load:
    """Requests through the router, `concurrency` at a time, until stopped; each (start, ok)."""

    def __init__(self, url: str, model: str | None, key: str | None, concurrency: int = 2):
        self.cfg = BL.BenchConfig(url=url, model=model, requests=1, concurrency=1, max_tokens=8, api_key=key,
                                 timeout=60)
        self.samples: list[tuple[float, bool]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(concurrency)]

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.time()
            r = B.run_bench(self.cfg)
            self.samples.append((t, r.ok == 1))

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


def standby_ready(sess: Session, host: str, name: str, wait: float) -> bool:
    """Wait up to WAIT s until the host's standby has vLLM imported (its `standby: ready` line)."""
    end = time.monotonic() + wait
    while time.monotonic() < end:
        r = sess.ssh[host].run(("docker", "logs", "--tail", "3", name), timeout=30, check=False)
        if "standby: ready" in r.stdout + r.stderr:
            return True
        time.sleep(2)
    return False


def one_run(inv, sess: Session, k: int, member: int, key: str | None, model: str | None, deadline: float) -> dict:
    group = inv.replicas[k]
    victim = group[member].name
    url = FN.replica_url(inv, k).removesuffix("/v1")
    name = FN.serve_name(inv)
    marks: dict[str, float] = {}
    # the steady state the kill meets: the victim's standby has vLLM imported (a kill soon after the
    # one before meets a standby still importing; cluster.standby false: none)
    ready = standby_ready(sess, victim, FN.standby_name(inv), 180) if inv.cluster.standby else None
    with Load(FN.router_url(inv) + "/v1", model, key) as load:
        time.sleep(3)
        sess.ssh[victim].run(("docker", "kill", name), timeout=60)
        t0 = time.time()
        seen_down = False
        next_metrics = 0.0
        while time.time() - t0 < deadline and "rotation" not in marks:
            code, _ = get(url + "/health", key, timeout=1.0)
            now = time.time()
            seen_down = seen_down or code != 200
            if seen_down and code == 200 and "health" not in marks:
                marks["health"] = now
            if "health" in marks and now >= next_metrics:
                next_metrics = now + 0.5
                n = served(url, key)  # the restarted engine counts from 0: one is a request of the load
                if n is not None and n >= 1:
                    marks["rotation"] = now
            time.sleep(0.2)
        time.sleep(2)
    keeper = log_lines(sess, victim, FN.keeper_name(inv), t0 - 1, f"{name} was Exited")
    starts = [log_lines(sess, h.name, name, t0, "[bootstrap-member] starting") for h in group]
    failed = [t for t, ok in load.samples if not ok]
    how = ("took over" if "standby took over" in keeper[0][1] else "started") if keeper else "-"
    return {"victim": victim, "t0": t0, "how": how, "standby": {True: "ready", False: "not ready", None: "none"}[ready],
            "back": keeper[0][0] - t0 if keeper else None,
            "group": max(st[0][0] for st in starts) - t0 if all(starts) else None,
            "health": marks["health"] - t0 if "health" in marks else None,
            "rotation": marks["rotation"] - t0 if "rotation" in marks else None,
            "requests": len(load.samples), "failed": len(failed),
            "failed_after_2s": len([t for t in failed if t > t0 + 2])}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-i", "--inventory", required=True)
    ap.add_argument("--member", type=int, default=0, help="which member of the last replica is killed (0: its head)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds to wait for the replica per run")
    a = ap.parse_args(argv)
    inv = load_inventory(a.inventory)
    if inv.cluster.replicas < 2:
        print("perf/heal.py needs cluster.replicas >= 2 in the inventory", file=sys.stderr)
        return 2
    k = inv.cluster.replicas - 1
    key = FRT.api_key(inv)
    model = B.discover_model(FN.router_url(inv), api_key=key)
    rows = []
    with Session(inv) as sess:
        sess.connect()
        for _ in range(a.runs):
            rows.append(one_run(inv, sess, k, a.member, key, model, a.deadline))
            time.sleep(5)

    def s(v: float | None) -> str:
        return f"{v:8.1f}" if v is not None else "       -"

    print(f"replica {k}, member {a.member} killed; seconds after the kill")
    print(f"{'run':>3} {'victim':>8} {'standby':>9} {'keeper':>10} {'at':>6} {'group':>8} {'/health':>8} "
          f"{'rotation':>8} {'requests':>9} {'failed':>7} {'failed>2s':>10}")
    for i, r in enumerate(rows):
        print(f"{i:>3} {r['victim']:>8} {r['standby']:>9} {r['how']:>10} {s(r['back'])[2:]} {s(r['group'])} "
              f"{s(r['health'])} {s(r['rotation'])} {r['requests']:>9} {r['failed']:>7} {r['failed_after_2s']:>10}")
    for r in rows:
        parts = [("keeper", r["back"]), ("group restart", r["group"]), ("vLLM start", r["health"]),
                 ("router", r["rotation"])]
        prev, shown = 0.0, []
        for label, v in parts:
            if v is None:
                shown.append(f"{label} -")
                continue
            shown.append(f"{label} {v - prev:.1f}s")
            prev = v
        print("breakdown: " + ", ".join(shown))
    worst = max((r["rotation"] for r in rows if r["rotation"] is not None), default=None)
    checks = [V.Check("back in rotation after a member's kill", "<=", TARGET_S, worst, unit="s", spec=".1f")
              if worst is not None and all(r["rotation"] is not None for r in rows) else
              V.not_measured("back in rotation after a member's kill", "<=", TARGET_S,
                             f"not back within --deadline {a.deadline:g}s", unit="s")]
    checks.append(V.Check("requests failed more than 2 s after the kill", "<=", 0,
                          float(sum(r["failed_after_2s"] for r in rows)), spec=".0f"))
    for line in V.lines(checks):
        print(line)
    return V.exit_status(checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
