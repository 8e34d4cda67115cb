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

Each configuration gets --loads bench runs in a row (default 2): the first load after `serve`
returns (what a user meets first) and the later ones, each on its own line.

Target (exit 1 when missed, or a run failed): every configuration's ITL p50 within --within (default
2) times the first configuration's, load by load (the first load against the first load).

Example: python -m perf.splits --config 2:1:2 --config 3:1:3 --requests 24
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
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from perf import verdict as V

DEFAULT_INV = Path(os.environ.get("BOOTSTRAP_SANDBOX_DIR", Path.home() / ".cache/bootstrap-sandbox")) / "inventory.yaml"
MODEL = "/opt/models/tiny-llama"


@dataclass
class Load:
    itl_p50: float | None = None
    itl_p95: float | None = None
    ttft_p50: float | None = None
    tok_s: float | None = None
    ok: int = 0
    failed: int = 0


@dataclass
class Row:
    label: str
    nodes: int
    tp: int | None = None
    pp: int | None = None
    ready_s: float | None = None
    loads: list[Load] = field(default_factory=list)
    error: str = ""

    @property
    def failed(self) -> int:
        return sum(x.failed for x in self.loads)


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
    bootstrap("serve", "-i", inv_all, "--stop", "--yes")
    cmd = ["serve", "-i", inv, args.model, "--json"]
    cmd += ["--tp", str(tp)] if tp else []
    cmd += ["--pp", str(pp)] if pp else []
    r = bootstrap(*cmd, "--", *extra) if extra else bootstrap(*cmd)
    if r.returncode != 0:
        row.error = (r.stderr.strip().splitlines() or ["?"])[-1][:160]
        return row
    s = json.loads(r.stdout)
    row.tp, row.pp, row.ready_s = s["tp"], s["pp"], s["ready_seconds"]
    for _ in range(args.loads):
        b = bootstrap("bench", "-i", inv, "--requests", str(args.requests), "--concurrency", str(args.concurrency),
                      "--max-tokens", str(args.max_tokens), "--ignore-eos", "--json")
        try:
            d = json.loads(b.stdout)
        except ValueError:
            row.error = (b.stderr.strip().splitlines() or ["bench failed"])[-1][:160]
            return row
        row.loads.append(Load(d["itl_ms"]["p50"], d["itl_ms"]["p95"], d["ttft_ms"]["p50"], d["output_tokens_per_s"],
                              d["ok"], d["failed"]))
    return row


def checks(rows: list[Row], loads: int, within: float) -> list[V.Check]:
    """ITL p50 of every row after the first against the first row's, load by load."""
    found: list[V.Check] = []
    if not rows:
        return found
    base = rows[0]
    for r in rows[1:]:
        for k in range(loads):
            name = f"ITL p50 {r.label.split(' --')[0]} / {base.label.split(' --')[0]}, load {k + 1} of {loads}"
            a = r.loads[k].itl_p50 if k < len(r.loads) else None
            b = base.loads[k].itl_p50 if k < len(base.loads) else None
            if not a or not b:
                failed = base if not b else r
                found.append(V.not_measured(name, "<=", within, f"no load {k + 1} for {failed.label}"
                                            + (f" ({failed.error})" if failed.error else "")))
            else:
                found.append(V.Check(name, "<=", within, a / b))
    return found


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
    ap.add_argument("--loads", type=int, default=2, help="bench runs per serve, the first right after it (default 2)")
    ap.add_argument("--within", type=float, default=2.0,
                    help="target: ITL p50 of each row <= this times the first row's, load by load (default 2)")
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
        bootstrap("serve", "-i", str(args.inventory), "--stop", "--yes")
    print(f"load: {args.requests} requests, concurrency {args.concurrency}, {args.max_tokens} tokens each "
          f"(--ignore-eos), model {args.model}; {args.loads} load(s) per serve")
    head = f"{'N':>2}  {'split':<34} {'ready (s)':>9} {'load':>4} {'ok':>5} {'TTFT p50':>9} {'ITL p50':>8} " \
           f"{'ITL p95':>8} {'tok/s':>7} {'ITL/ITL[0]':>10}"
    print(head)
    base = rows[0] if rows else None
    for r in rows:
        split = f"TP={r.tp} PP={r.pp}" if r.tp else r.label
        extra = r.label.split(" ", 2)[2] if r.label.count(" ") >= 2 else ""
        name = (split + (" " + extra if extra else ""))[:34]
        if not r.loads:
            print(f"{r.nodes:>2}  {name:<34} {fmt(r.ready_s, '.0f'):>9}  error: {r.error}")
        for k, x in enumerate(r.loads):
            b = base.loads[k].itl_p50 if base and k < len(base.loads) else None
            ratio = fmt(x.itl_p50 / b, ".2f") if (b and x.itl_p50) else "-"
            print(f"{r.nodes:>2}  {name:<34} {fmt(r.ready_s, '.0f'):>9} {k + 1:>4} {x.ok:>2}/{x.ok + x.failed:<2} "
                  f"{fmt(x.ttft_p50):>9} {fmt(x.itl_p50):>8} {fmt(x.itl_p95):>8} {fmt(x.tok_s):>7} {ratio:>10}"
                  + (f"  error: {r.error}" if r.error and k == len(r.loads) - 1 else ""))
    found = checks(rows, args.loads, args.within)
    failures = [f"{r.label}: {r.error or f'{r.failed} request(s) failed'}" for r in rows if r.error or r.failed]
    for line in V.lines(found, failures):
        print(line)
    return V.exit_status(found, failures)


if __name__ == "__main__":
    sys.exit(main())
