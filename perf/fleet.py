#!/usr/bin/env python3
"""Replicas behind vllm-router, measured side by side in one run on one serving fleet.

Needs a fleet already serving (`bootstrap up` + `bootstrap serve` with cluster.replicas: 2).
Prints one table:

  1. throughput through the router with every replica in rotation vs with only replica 0 in it
     (the others taken out with the router's /remove_worker and put back after), same load;
  2. router overhead: TTFT p50/p95 of single requests (concurrency 1) to replica 0 alone in the
     router, through the router and directly, in turns;
  3. spread: requests each replica served under the full-rotation load (from their own
     vllm:request_success_total), max/min.

The load is `bootstrap bench`'s (bootstrap.serve.bench.run_bench), run from this machine, which must
reach the data-plane IPs (the sandbox's do).

Example: python -m perf.fleet -i fleet.yaml --requests 48 --concurrency 8
"""
from __future__ import annotations

import argparse
import sys

from bootstrap.fleet import names as FN
from bootstrap.fleet import routers as FRT
from bootstrap.fleet import status as FS
from bootstrap.fleet import steps as FST
from bootstrap.inventory import load_inventory
from bootstrap.remote.session import Session
from bootstrap.serve import bench as B
from bootstrap.serve import benchload as BL
from bootstrap.serve import benchstats as BS

KEY: str | None = None  # the fleet's API key (cluster.router.api_key), set in main


def load(url: str, n: int, conc: int, tokens: int, model: str | None) -> BS.BenchResult:
    return B.run_bench(BL.BenchConfig(url=url, model=model, requests=n, concurrency=conc, max_tokens=tokens,
                                     api_key=KEY))


def merge(results: list[BS.BenchResult]) -> BS.BenchResult:
    samples = [x for r in results for x in r.samples]
    return BS.summarize(samples, sum(r.wall_seconds for r in results))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-i", "--inventory", required=True)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--single", type=int, default=20, help="requests for the overhead rows (concurrency 1)")
    a = ap.parse_args(argv)
    inv = load_inventory(a.inventory)
    if inv.cluster.replicas < 2:
        print("perf/fleet.py needs cluster.replicas >= 2 in the inventory", file=sys.stderr)
        return 2
    router = FN.router_url(inv)
    direct = FN.replica_url(inv, 0)
    others = [FN.replica_url(inv, k) for k in range(1, inv.cluster.replicas)]
    global KEY
    KEY = FRT.api_key(inv)
    model = B.discover_model(router, api_key=KEY)
    rows = []

    with Session(inv) as sess:
        sess.connect()
        before = FS.fleet_state(sess)
        if not all(r.health == "healthy" for r in before.replicas):
            print(f"not every replica is healthy: {[r.health for r in before.replicas]}", file=sys.stderr)
            return 1
        full = load(router, a.requests, a.concurrency, a.max_tokens, model)
        after = FS.fleet_state(sess)
        spread = FS.spread(before, after)
        for url in others:
            FST._router_call(sess, inv, "remove", url)
        try:
            one = load(router, a.requests, a.concurrency, a.max_tokens, model)
            # overhead: the same replica, alone in the router, asked through it and directly, in turns
            # (a replica that idles between requests wakes up slower, which is not the router's cost)
            via, straight = [], []
            for _ in range(a.single):
                via += [load(router, 1, 1, a.max_tokens, model)]
                straight += [load(direct, 1, 1, a.max_tokens, model)]
            via, straight = merge(via), merge(straight)
        finally:
            for url in others:
                FST._router_call(sess, inv, "add", url)

    def ttft(r: BS.BenchResult, q: str) -> float:
        return getattr(r.ttft, q) * 1000 if r.ttft else float("nan")

    rows.append((f"{inv.cluster.replicas} replicas in rotation", full))
    rows.append(("replica 0 only (others removed)", one))
    rows.append(("replica 0 alone: single requests via router", via))
    rows.append(("replica 0 alone: single requests direct", straight))
    print(f"{'load':<44} {'ok':>5} {'req/s':>7} {'tok/s':>8} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12}")
    for name, r in rows:
        print(f"{name:<44} {r.ok:>5} {r.requests_per_s:>7.2f} {r.output_tokens_per_s:>8.1f} "
              f"{ttft(r, 'p50'):>12.1f} {ttft(r, 'p95'):>12.1f}")
    ratio = full.output_tokens_per_s / one.output_tokens_per_s if one.output_tokens_per_s else float("nan")
    print(f"throughput {inv.cluster.replicas} replicas / 1 replica: {ratio:.2f}x (output tokens/s)")
    print(f"router overhead, TTFT p50: {ttft(via, 'p50') - ttft(straight, 'p50'):+.1f} ms "
          f"(p95 {ttft(via, 'p95') - ttft(straight, 'p95'):+.1f} ms)")
    print(spread.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
