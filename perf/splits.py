#!/usr/bin/env python3
"""Serving splits side by side: TP vs PP on the same nodes, with the same load, in one run.

For each configuration: `bootstrap serve` (the split given, or the planner's choice), then
`bootstrap bench` (the same bounded load for every row), then `bootstrap serve --stop`. One table,
ratios against the first row, so that TP and PP (and any vLLM flag) are compared in one run on one
machine rather than across days.

Configurations are `NODES:TP:PP[:EXTRA VLLM FLAGS]` (TP/PP `-` for the planner's choice), e.g.
    2:2:1       two nodes, tensor parallel across them
    2:1:2       two nodes, one pipeline stage each
    3:-:-       three nodes, the planner's split
    3:-:-:--max-model-len 256

Hosts: --inventory (default: the sandbox's, ~/.cache/bootstrap-sandbox/inventory.yaml, with the
cluster already up); a row with N nodes uses its first N hosts.

Example: python -m perf.splits --config 2:2:1 --config 2:1:2 --config 3:-:- --requests 24
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_INV = Path(os.environ.get("BOOTSTRAP_SANDBOX_DIR", Path.home() / ".cache/bootstrap-sandbox")) / "inventory.yaml"
MODEL = "/opt/models/tiny-llama"


@dataclass
class Row:
    label: str
    nodes: int
    tp: int | None = None
    pp: int | None = None
    ready_s: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    ttft_p50: float | None = None
    tok_s: float | None = None
    ok: int = 0
    failed: int = 0
    error: str = ""


def bootstrap(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bootstrap", *args], capture_output=True, text=True,
                          timeout=timeout)


def parse_config(text: str) -> tuple[int, int | None, int | None, list[str]]:
    parts = text.split(":", 3)
    if len(parts) < 3:
        raise SystemExit(f"--config {text!r}: expected NODES:TP:PP[:EXTRA]")
    nodes = int(parts[0])
    tp = None if parts[1] == "-" else int(parts[1])
    pp = None if parts[2] == "-" else int(parts[2])
    return nodes, tp, pp, shlex.split(parts[3]) if len(parts) == 4 else []


def sub_inventory(src: Path, nodes: int, folder: Path) -> str:
    doc = yaml.safe_load(src.read_text())
    doc["hosts"] = doc["hosts"][:nodes]
    out = folder / f"n{nodes}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return str(out)


def run_row(inv_all: str, inv: str, tp, pp, extra, args) -> Row:
    label = f"{'TP=' + str(tp) if tp else 'TP=auto'} {'PP=' + str(pp) if pp else 'PP=auto'}"
    label += (" " + " ".join(extra)) if extra else ""
    row = Row(label, 0)
    bootstrap("serve", "-i", inv_all, "--stop")
    cmd = ["serve", "-i", inv, args.model, "--json"]
    cmd += ["--tp", str(tp)] if tp else []
    cmd += ["--pp", str(pp)] if pp else []
    r = bootstrap(*cmd, "--", *extra) if extra else bootstrap(*cmd)
    if r.returncode != 0:
        row.error = (r.stderr.strip().splitlines() or ["?"])[-1][:160]
        return row
    s = json.loads(r.stdout)
    row.tp, row.pp, row.ready_s = s["tp"], s["pp"], s["ready_seconds"]
    b = bootstrap("bench", "-i", inv, "--requests", str(args.requests), "--concurrency", str(args.concurrency),
                  "--max-tokens", str(args.max_tokens), "--ignore-eos", "--json")
    try:
        d = json.loads(b.stdout)
    except ValueError:
        row.error = (b.stderr.strip().splitlines() or ["bench failed"])[-1][:160]
        return row
    row.ok, row.failed = d["ok"], d["failed"]
    row.itl_p50, row.itl_p95 = d["itl_ms"]["p50"], d["itl_ms"]["p95"]
    row.ttft_p50, row.tok_s = d["ttft_ms"]["p50"], d["output_tokens_per_s"]
    return row


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inventory", type=Path, default=DEFAULT_INV)
    ap.add_argument("--config", action="append", required=True, help="NODES:TP:PP[:EXTRA VLLM FLAGS]")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for text in args.config:
            nodes, tp, pp, extra = parse_config(text)
            inv = sub_inventory(args.inventory, nodes, Path(tmp))
            t = time.monotonic()
            row = run_row(str(args.inventory), inv, tp, pp, extra, args)
            row.nodes = nodes
            rows.append(row)
            print(f"# {nodes} node(s) {row.label}: {time.monotonic() - t:.0f}s {row.error}",
                  file=sys.stderr, flush=True)
        bootstrap("serve", "-i", str(args.inventory), "--stop")
    base = next((r for r in rows if r.itl_p50), None)
    print(f"load: {args.requests} requests, concurrency {args.concurrency}, {args.max_tokens} tokens each "
          f"(--ignore-eos), model {args.model}")
    head = f"{'N':>2}  {'split':<34} {'ready (s)':>9} {'ok':>5} {'TTFT p50':>9} {'ITL p50':>8} {'ITL p95':>8} " \
           f"{'tok/s':>7} {'ITL/ITL[0]':>10}"
    print(head)
    for r in rows:
        split = f"TP={r.tp} PP={r.pp}" if r.tp else r.label
        extra = r.label.split(" ", 2)[2] if r.label.count(" ") >= 2 else ""
        name = (split + (" " + extra if extra else ""))[:34]
        ratio = fmt(r.itl_p50 / base.itl_p50, ".2f") if (base and r.itl_p50) else "-"
        print(f"{r.nodes:>2}  {name:<34} {fmt(r.ready_s, '.0f'):>9} {r.ok:>2}/{r.ok + r.failed:<2} "
              f"{fmt(r.ttft_p50):>9} {fmt(r.itl_p50):>8} {fmt(r.itl_p95):>8} {fmt(r.tok_s):>7} {ratio:>10}"
              + (f"  error: {r.error}" if r.error else ""))
    return 1 if any(r.error or r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
