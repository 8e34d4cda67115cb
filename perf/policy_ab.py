#!/usr/bin/env python3
"""Every router policy A/B'd on one serving fleet, per workload, in one run: `bench --ab`'s tables and verdicts.

Needs a fleet already serving (`bootstrap up` + `bootstrap serve` with cluster.replicas >= 2). For each
workload asked, runs what `bootstrap bench --ab` runs (bootstrap.face.bench_ab: the routers restarted
with each policy in turn, arms interleaved over --repeats) and prints the table; then the verdicts:

  * every request of every arm answered (failed + shed = 0), per workload;
  * on the multi-turn workload, a session-sticky policy (consistent_hash, sticky_least_loaded) hits
    the engines' prefix cache more than round_robin: each turn repeats the conversation so far, which
    only the replica that served the earlier turns holds;
  * on the multi-turn workload, kv_aware (where it is among the policies: the inventory has
    cluster.router.kv_events or policy kv_aware) hits the engines' prefix cache more than round_robin
    without the session header: it routes by the engines' own KV events;
  * on the random workload (the control) no policy hits the cache beyond a few per cent: there is no
    common prefix to keep.

Example: python -m perf.policy_ab -i fleet.yaml --workloads shared-prefix,multi-turn,random -n 60
"""
from __future__ import annotations

import argparse
import json
import sys

from bootstrap import face
from bootstrap.inventory import load_inventory
from perf import verdict as V

STICKY = ("consistent_hash", "sticky_least_loaded")


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-i", "--inventory", required=True)
    ap.add_argument("--policies", default=",".join(face.ROUTER_POLICIES))
    ap.add_argument("--workloads", default="shared-prefix,multi-turn,random")
    ap.add_argument("-n", "--requests", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt-words", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    ap.add_argument("--png", default=None, help="write each workload's bars to PNG with the workload's name added")
    ap.add_argument("--json", default=None, help="write every workload's result to this file")
    return ap.parse_args(argv)


def show(res) -> None:
    print(f"\n{res.workload}: {len(res.arms)} arms")
    print(f"{'policy':<20} {'req/s':>6} {'goodput':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'failed':>6} {'shed':>5} {'hit %':>6} {'kv idx %':>8} {'per replica':<16} {'max/min':>7}")

    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)
    for r in res.rows:
        per = " ".join(f"{k}:{v}" for k, v in sorted(r.per_replica.items()))
        print(f"{r.policy:<20} {r.requests_per_s:>6.2f} {r.goodput:>8.2f} {f(r.ttft_p50_ms):>9} {f(r.ttft_p99_ms):>9} "
              f"{f(r.itl_p50_ms):>8} {f(r.itl_p99_ms):>8} {r.failed:>6} {r.shed:>5} {f(r.prefix_hit_pct):>6} "
              f"{f(r.kv_index_hit_pct):>8} "
              f"{per:<16} {f(r.spread, '.2f'):>7}")
    for measure, policy in res.best.items():
        print(f"best {measure}: {policy}")


def checks(results: dict) -> list[V.Check]:
    out = []
    for name, res in results.items():
        out.append(V.Check(f"{name}: failed + shed requests, every policy", "<=", 0,
                           sum(r.failed + r.shed for r in res.rows), spec=".0f"))
    mt = results.get("multi-turn")
    rows = {r.policy: r for r in mt.rows} if mt else {}
    sticky = [rows[p].prefix_hit_pct for p in STICKY if p in rows and rows[p].prefix_hit_pct is not None]
    rr = rows.get("round_robin")
    if sticky and rr is not None and rr.prefix_hit_pct is not None:
        out.append(V.Check("multi-turn: best sticky policy's prefix hit % - round_robin's", ">", 0,
                           max(sticky) - rr.prefix_hit_pct, spec=".1f"))
    else:
        out.append(V.Check("multi-turn: best sticky policy's prefix hit % - round_robin's", ">", 0,
                           why="the multi-turn workload with round_robin and a sticky policy was not run"))
    kv = rows.get("kv_aware")
    if kv is not None and rr is not None and kv.prefix_hit_pct is not None and rr.prefix_hit_pct is not None:
        out.append(V.Check("multi-turn: kv_aware's prefix hit % - round_robin's", ">", 0,
                           kv.prefix_hit_pct - rr.prefix_hit_pct, spec=".1f"))
    ctl = results.get("random")
    hits = [r.prefix_hit_pct for r in ctl.rows if r.prefix_hit_pct is not None] if ctl else []
    out.append(V.Check("random (control): highest prefix hit %", "<=", 5, max(hits), spec=".1f") if hits else
               V.Check("random (control): highest prefix hit %", "<=", 5, why="the random workload was not run"))
    return out


def main(argv: list[str]) -> int:
    a = parse(argv)
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    results = {}
    for workload in [w.strip() for w in a.workloads.split(",") if w.strip()]:
        png = f"{a.png.removesuffix('.png')}-{workload}.png" if a.png else None
        res = face.bench_ab(lambda check_files: load_inventory(a.inventory, check_files=check_files), policies,
                            workload=workload, repeats=a.repeats, warmup=a.warmup, prompt_words=a.prompt_words,
                            slo_ms=a.slo_ttft_ms, png=png, requests=a.requests, concurrency=a.concurrency,
                            max_tokens=a.max_tokens,
                            on_arm=lambda arm: print(f"  {arm.policy} (repeat {arm.repeat + 1}): "
                                                     f"{arm.result.ok}/{arm.result.requests} ok, "
                                                     f"{arm.result.requests_per_s:.2f} req/s", flush=True))
        results[workload] = res
        show(res)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({w: r.to_dict() for w, r in results.items()}, fh, indent=1)
    cs = checks(results)
    print()
    print("\n".join(V.lines(cs)))
    return V.exit_status(cs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
