#!/usr/bin/env python3
"""A pool model's policy changed in place in vllm-router's multi-model mode: how many requests fail.

vllm-router (0.1.17) keeps a model's policy from its first worker until its last worker leaves
(src/policies/registry.rs), and sends a request for a model that has no worker to any worker, another
model's included (whose vLLM answers 404 "does not exist"). `serve` changes a model's policy in place by
taking all its workers out and adding them back with the new policy (checks/fleet_probe.py `repolicy`).
This measures what clients of that model meet meanwhile: one vllm-router started as bootstrap's pool
router is (`--enable-igw`, workers added by `POST /workers` with a `labels.policy`), two stub workers of
the model and one of another model on loopback (each answers 404 for a model not its own, as vLLM does),
--clients threads sending completions of the model without pause, and --changes policy changes per arm:

  serial     every DELETE, then every POST, each its own request (bootstrap before 2026-12-07)
  pipelined  fleet_probe.repolicy: the last DELETE and the first POST in one write on one connection

Prints, side by side, the requests sent, those that failed and how (404: reached the other model's
worker), the window with no worker of the model, and the policy the router assigned last (its own log).
Target: the pipelined arm fails no request.

Example (inside the sandbox's vLLM image, which holds vllm-router):
  docker run --rm -v $PWD:/w -w /w --entrypoint python3 IMAGE -m perf.router_repolicy --changes 40
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
from pathlib import Path

from perf import verdict as V

PORT, METRICS = 18100, 18191
WORKERS = (18201, 18202)
OTHER = 18203  # a worker of another model: where a request for a model with no worker may land
POLICIES = ("cache_aware", "power_of_two")
MODEL, OTHER_MODEL = "coder", "chat"
ARMS = ("serial", "pipelined")


def _probe():
    """checks/fleet_probe.py as the router's container runs it (standard library only)."""
    import importlib.util

    path = Path(__file__).parents[1] / "checks" / "fleet_probe.py"
    spec = importlib.util.spec_from_file_location("fleet_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Worker(BaseHTTPRequestHandler):
    """A stub vLLM of `model`: /health, and a completion after 10 ms; 404 for another model's name."""
    protocol_version = "HTTP/1.1"
    model = MODEL

    def log_message(self, *a) -> None:
        pass

    def _send(self, body: bytes, code: int = 200) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(b'{"status":"ok"}')

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if req.get("model") != self.model:
            self._send(json.dumps({"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                             "code": 404}}).encode(), 404)
            return
        time.sleep(0.01)
        self._send(json.dumps({"choices": [{"text": "x"}]}).encode())


class _Other(_Worker):
    model = OTHER_MODEL


def http(method: str, url: str, body=None, timeout: float = 10) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def run(router_bin: str, changes: int, arm: str, clients: int) -> dict:
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
                http("POST", base + "/workers", {"url": u, "model_id": MODEL, "labels": {"policy": "round_robin"}})
            http("POST", base + "/workers", {"url": f"http://127.0.0.1:{OTHER}", "model_id": OTHER_MODEL,
                                             "labels": {"policy": "round_robin"}})
            probe = _probe()
            stop, results = threading.Event(), []

            def load() -> None:
                while not stop.is_set():
                    try:
                        code = http("POST", base + "/v1/completions",
                                    {"model": MODEL, "prompt": "x", "max_tokens": 1})[0]
                    except OSError as exc:
                        code = type(exc).__name__
                    results.append(code)
            threads = [threading.Thread(target=load) for _ in range(clients)]
            for t in threads:
                t.start()
            time.sleep(1)
            gaps = []
            for i in range(changes):
                if arm == "pipelined":
                    doc = probe.repolicy(base, MODEL, POLICIES[i % 2], urls)
                    assert doc.get("ok"), doc
                    gaps.append(doc["gap_ms"])
                else:
                    for u in urls:
                        http("DELETE", base + "/workers/" + urllib.parse.quote(u, safe=""))
                    t0 = time.monotonic()  # the last DELETE answered: no worker of the model from here
                    for u in urls:
                        http("POST", base + "/workers", {"url": u, "model_id": MODEL,
                                                         "labels": {"policy": POLICIES[i % 2]}})
                        if u == urls[0]:
                            gaps.append(1000 * (time.monotonic() - t0))
                time.sleep(0.3)
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
    return {"arm": arm, "requests": len(results), "failed": sum(failed.values()), "by_answer": dict(failed),
            "gap_ms": [round(g, 1) for g in gaps], "last_assigned": last,
            "expected": POLICIES[(changes - 1) % 2] if changes else "round_robin"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--router", default="vllm-router", help="the vllm-router binary")
    ap.add_argument("--changes", type=int, default=40, help="policy changes per arm")
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args(argv)
    servers = [ThreadingHTTPServer(("127.0.0.1", p), _Worker) for p in WORKERS]
    servers.append(ThreadingHTTPServer(("127.0.0.1", OTHER), _Other))
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(f"{'arm':>9}  {'requests':>8}  {'failed':>6}  {'window ms (median)':>18}  last policy assigned")
    rows, failures = {}, []
    for arm in ARMS:
        r = rows[arm] = run(args.router, args.changes, arm, args.clients)
        gaps = sorted(r["gap_ms"])
        print(f"{arm:>9}  {r['requests']:8d}  {r['failed']:6d}  {gaps[len(gaps) // 2] if gaps else 0:18.1f}  "
              f"{r['last_assigned']} (expected {r['expected']}){'  ' + str(r['by_answer']) if r['failed'] else ''}")
        if r["last_assigned"] != r["expected"]:
            failures.append(f"{arm}: the router assigned {r['last_assigned']}, not {r['expected']}")
    checks = [V.Check("failed requests (pipelined)", "<=", 0, float(rows["pipelined"]["failed"]), spec=".0f")]
    for line in V.lines(checks, failures):
        print(line)
    return V.exit_status(checks, failures)


if __name__ == "__main__":
    raise SystemExit(main())
