#!/usr/bin/env python3
"""A pool model's policy changed in place in vllm-router's multi-model mode: how many requests fail.

vllm-router (0.1.17) keeps a model's policy from its first worker until its last worker leaves
(src/policies/registry.rs). `serve` changes a model's policy in place by taking all its workers out and
adding them back with the new policy (checks/fleet_probe.py `repolicy`). This measures what clients of
that model meet meanwhile: one vllm-router started as bootstrap's pool router is (`--enable-igw`,
workers added by `POST /workers` with a `labels.policy`), two stub workers on loopback, --clients
threads sending completions of the model without pause, and --changes policy changes; with --widen S
the workers stay out S seconds on purpose, to find how long a gap the router's retries cover.
Prints the requests sent, those that failed and how, the gaps, and the policy the router assigned last
(its own log).

Example: python -m perf.router_repolicy --router /tmp/vr/bin/vllm-router --changes 20 --widen 0,0.2,0.5
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, METRICS = 18100, 18191
WORKERS = (18201, 18202)
POLICIES = ("cache_aware", "power_of_two")


class _Worker(BaseHTTPRequestHandler):
    """A stub vLLM: /health, and a completion after 10 ms."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a) -> None:
        pass

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(b'{"status":"ok"}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(0.01)
        self._send(json.dumps({"choices": [{"text": "x"}]}).encode())


def http(method: str, url: str, body=None, timeout: float = 10) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def run(router_bin: str, changes: int, widen: float, clients: int) -> dict:
    base = f"http://127.0.0.1:{PORT}"
    urls = [f"http://127.0.0.1:{p}" for p in WORKERS]
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        proc = subprocess.Popen([router_bin, "--enable-igw", "--host", "127.0.0.1", "--port", str(PORT), "--policy",
                                 "round_robin", "--prometheus-port", str(METRICS), "--log-level", "info"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(120):
                try:
                    if http("GET", base + "/workers")[0] == 200:
                        break
                except OSError:
                    time.sleep(0.25)
            for u in urls:
                http("POST", base + "/workers", {"url": u, "model_id": "chat", "labels": {"policy": "round_robin"}})
            stop, results = threading.Event(), []

            def load() -> None:
                while not stop.is_set():
                    try:
                        code = http("POST", base + "/v1/completions",
                                    {"model": "chat", "prompt": "x", "max_tokens": 1})[0]
                    except OSError as exc:
                        code = type(exc).__name__
                    results.append(code)
            threads = [threading.Thread(target=load) for _ in range(clients)]
            for t in threads:
                t.start()
            time.sleep(1)
            gaps = []
            for i in range(changes):
                t0 = time.monotonic()
                for u in urls:
                    http("DELETE", base + "/workers/" + urllib.parse.quote(u, safe=""))
                time.sleep(widen)
                for u in urls:
                    http("POST", base + "/workers", {"url": u, "model_id": "chat",
                                                     "labels": {"policy": POLICIES[i % 2]}})
                gaps.append(1000 * (time.monotonic() - t0))
                time.sleep(0.5)
            time.sleep(1)
            stop.set()
            for t in threads:
                t.join()
        finally:
            proc.terminate()
            proc.wait()
        log.seek(0)
        assigned = [ln for ln in (re.sub(r"\x1b\[[0-9;]*m", "", x) for x in log) if "Assigning policy" in ln]
    failed = Counter(c for c in results if c != 200)
    last = assigned[-1].split("Assigning policy ")[-1].split()[0] if assigned else None
    return {"widen_s": widen, "requests": len(results), "failed": sum(failed.values()), "by_answer": dict(failed),
            "gap_ms": [round(g, 1) for g in gaps], "last_assigned": last,
            "expected": POLICIES[(changes - 1) % 2] if changes else "round_robin"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", default="vllm-router", help="the vllm-router binary")
    ap.add_argument("--changes", type=int, default=20)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--widen", default="0", help="comma-separated seconds the workers stay out on purpose")
    args = ap.parse_args(argv)
    servers = [ThreadingHTTPServer(("127.0.0.1", p), _Worker) for p in WORKERS]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(f"{'widen s':>7}  {'requests':>8}  {'failed':>6}  {'gap ms (median)':>15}  last policy assigned")
    ok = True
    for w in (float(x) for x in args.widen.split(",")):
        r = run(args.router, args.changes, w, args.clients)
        gaps = sorted(r["gap_ms"])
        print(f"{w:7.2f}  {r['requests']:8d}  {r['failed']:6d}  {gaps[len(gaps) // 2] if gaps else 0:15.1f}  "
              f"{r['last_assigned']} (expected {r['expected']}){'  ' + str(r['by_answer']) if r['failed'] else ''}")
        ok = ok and (w > 0 or r["failed"] == 0) and r["last_assigned"] == r["expected"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
