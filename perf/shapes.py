#!/usr/bin/env python3
"""Serving shapes side by side, one run, the same model and load: one copy split over the nodes
(PP), vLLM's own data parallel (DP), replicas behind vllm-router, and prefill/decode disaggregation
against plain replicas on the same nodes.

Rows (each from a clean start: `up`, `serve`, `bench`, `down`; the sandbox's hosts, the first N):
    pp3        3 nodes, one copy, TP=1 PP=3 (`serve --tp 1 --pp 3`)
    dp3        3 nodes, DP=3 engines behind the head's API server (`serve --dp 3`)
    replicas3  3 nodes, 3 replicas of one node behind vllm-router (cluster.replicas: 3)
    replicas2  2 nodes, 2 replicas behind vllm-router
    pd         2 nodes, 1 prefill + 1 decode replica, vllm-router in PD mode (cluster.router.prefill: [0])

Prints TTFT and ITL p50/p99, requests/s and the ratio of requests/s to the first row; for pd, each
role's own latency (the engines' histograms). No target is stated for these shapes: the table is
the comparison (on the sandbox every node shares this machine's 2 cores, so more engines do not add
compute; the figures show the shapes' overheads, not a rack's scaling).

Example: python -m perf.shapes --rows pp3,dp3,replicas3 --requests 24 --concurrency 4
         python -m perf.shapes --rows replicas2,pd
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from perf.splits import DEFAULT_INV, MODEL, bootstrap, fmt

#: name -> (nodes, replicas, prefill replicas, serve options)
SHAPES = {
    "pp3": (3, 1, None, ["--tp", "1", "--pp", "3"]),
    "dp3": (3, 1, None, ["--dp", "3"]),
    "replicas3": (3, 3, None, []),
    "replicas2": (2, 2, None, []),
    "pd": (2, 2, [0], []),
}
#: compiled (not --enforce-eager: PP on CPU refuses it), short context: the sandbox's small KV cache
FLAGS = ["--max-model-len", "256"]


@dataclass
class Row:
    name: str
    ready_s: float | None = None
    ok: int = 0
    failed: int = 0
    ttft: dict = field(default_factory=dict)
    itl: dict = field(default_factory=dict)
    rps: float | None = None
    roles: str = ""
    error: str = ""


def inventory(src: Path, name: str, folder: Path) -> str:
    nodes, replicas, prefill, _ = SHAPES[name]
    doc = yaml.safe_load(src.read_text())
    doc["hosts"] = doc["hosts"][:nodes]
    doc["cluster"]["replicas"] = replicas
    doc["cluster"].pop("router", None)
    if replicas > 1:
        doc["cluster"]["router"] = {"policy": "round_robin", "health_interval": 2,
                                    **({"prefill": prefill} if prefill else {})}
    out = folder / f"{name}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return str(out)


def last_line(r) -> str:
    return ((r.stderr or r.stdout).strip().splitlines() or ["?"])[-1][:200]


def run_row(name: str, inv: str, args) -> Row:
    row = Row(name)
    up = bootstrap("up", "--yes", "-i", inv)
    if up.returncode != 0:
        row.error = f"up: {last_line(up)}"
        return row
    t = time.monotonic()
    r = bootstrap("serve", "-i", inv, args.model, *SHAPES[name][3], "--", *FLAGS)
    row.ready_s = time.monotonic() - t
    if r.returncode != 0:
        row.error = f"serve: {last_line(r)}"
        return row
    b = bootstrap("bench", "-i", inv, "--requests", str(args.requests), "--concurrency", str(args.concurrency),
                  "--max-tokens", str(args.max_tokens), "--ignore-eos", "--json")
    try:
        d = json.loads(b.stdout)
    except ValueError:
        row.error = f"bench: {last_line(b)}"
        return row
    row.ok, row.failed, row.rps = d["ok"], d["failed"], d["requests_per_s"]
    row.ttft, row.itl = d.get("ttft_ms") or {}, d.get("itl_ms") or {}
    spread = d.get("spread") or {}
    if spread.get("roles"):
        lat = spread.get("latency_ms") or {}
        row.roles = "; ".join(f"{role} (replica {k}): engine TTFT {fmt((lat.get(k) or {}).get('ttft_ms'))} ms, "
                              f"ITL {fmt((lat.get(k) or {}).get('itl_ms'))} ms"
                              for k, role in sorted(spread["roles"].items()))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inventory", type=Path, default=DEFAULT_INV, help="the sandbox's (3 nodes or more)")
    ap.add_argument("--rows", default="pp3,dp3,replicas3,replicas2,pd",
                    help=f"comma-separated, in order: {', '.join(SHAPES)}")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.rows.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        ap.error(f"unknown row {unknown[0]!r}: the rows are {', '.join(SHAPES)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            inv = inventory(args.inventory, name, Path(tmp))
            t = time.monotonic()
            try:
                rows.append(run_row(name, inv, args))
            finally:
                bootstrap("down", "--yes", "-i", inv)
            print(f"# {name}: {time.monotonic() - t:.0f}s {rows[-1].error}", file=sys.stderr, flush=True)
    base = next((r for r in rows if r.rps), None)
    print(f"load: {args.requests} requests, concurrency {args.concurrency}, {args.max_tokens} tokens each "
          f"(--ignore-eos), model {args.model}, vLLM flags {' '.join(FLAGS)}")
    print(f"{'shape':<10} {'nodes':>5} {'ready s':>7} {'ok':>5} {'TTFT p50':>8} {'TTFT p99':>8} {'ITL p50':>7} "
          f"{'ITL p99':>7} {'req/s':>6} {'req/s vs ' + (base.name if base else '-'):>14}")
    for r in rows:
        ratio = fmt(r.rps / base.rps, ".2f") if (base and r.rps) else "-"
        print(f"{r.name:<10} {SHAPES[r.name][0]:>5} {fmt(r.ready_s, '.0f'):>7} {r.ok:>2}/{r.ok + r.failed:<2} "
              f"{fmt(r.ttft.get('p50')):>8} {fmt(r.ttft.get('p99')):>8} {fmt(r.itl.get('p50')):>7} "
              f"{fmt(r.itl.get('p99')):>7} {fmt(r.rps, '.2f'):>6} {ratio:>14}"
              + (f"  error: {r.error}" if r.error else ""))
        if r.roles:
            print(f"{'':<10} per role: {r.roles}")
    print("no target: the shapes are compared side by side")
    return 1 if any(r.error or r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
