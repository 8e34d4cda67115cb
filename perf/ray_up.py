#!/usr/bin/env python3
"""`bootstrap up` side by side with Ray's cluster launcher (`ray up`) on the same sandbox nodes.

From a torn-down cluster to every node ALIVE in Ray, with the image already on every node,
alternating runs (bootstrap, ray up, bootstrap, ...), --reps each:

    bootstrap   `bootstrap up -i INV` (it returns when Ray lists every node alive): process wall time
    ray up      `ray up -y` (local provider, docker section, the same image, host network), then
                Ray's autoscaler starts the workers: from the start of `ray up` to the moment the
                poller in the head container (checks/ray_nodes.py, 0.1 s) first saw the last node
                alive. Ray's default autoscaler (v2) and the v1 one (RAY_UP_enable_autoscaler_v2=0)
                are both run with --autoscaler both; a run that does not reach every node within
                --deadline is reported as such, not timed.

Target: bootstrap <= 0.5x the fastest working `ray up`, printed as met, missed or not measured (with the
reason: a bootstrap run failed, or no `ray up` listed every node); exit status 1 when it is missed, a
bootstrap run fails, or no `ray up` works (nothing to compare with). See perf/verdict.py.

Needs Ray's CLI on this machine, the same version as in the image (`ray --version` in a node's
container), best in its own venv: python3 -m venv /tmp/rayenv && /tmp/rayenv/bin/pip install
'ray[default]==2.60.0'; and rsync (Ray copies its config to the nodes with it).

Example: python -m perf.ray_up --reps 3 --ray /tmp/rayenv/bin/ray
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from bootstrap.inventory import load_inventory
from perf import verdict as V
from perf.bringup import ROOT, bootstrap_cmd, down, must, render, sandbox_up

TARGET = 0.5  # bootstrap / ray up (the working one)
RAY_CONTAINER = "bootstrap-rayup"
CLUSTER = "bootstrap-rayup"
# Ray's docker runner copies its config into the container with `rsync -e 'docker exec -i'`, and
# the head container's autoscaler reaches the workers with `ssh`: the image needs both, and vLLM's
# images have neither (a `ray up` user adds them to theirs). The sandbox nodes and the image are both
# Debian 12: lend the node's rsync and ssh, and the two libraries of rsync the image lacks.
_LIB = "/lib/x86_64-linux-gnu"
LENT_TOOLS = [x for p in ("/usr/bin/rsync", "/usr/bin/ssh", f"{_LIB}/libpopt.so.0", f"{_LIB}/libxxhash.so.0")
              for x in ("-v", f"{p}:{p}:ro")]


def log(msg: str) -> None:
    print(f"ray_up: {msg}", file=sys.stderr, flush=True)


def launcher_config(inv_path: Path, workdir: Path) -> Path:
    """The cluster launcher's YAML for the inventory's hosts: what a user of `ray up` would write."""
    inv = load_inventory(str(inv_path))
    c = inv.cluster
    head, workers = inv.head, list(inv.workers)
    cfg = {
        "cluster_name": CLUSTER,
        "provider": {"type": "local", "head_ip": head.ip, "worker_ips": [w.ip for w in workers]},
        "auth": {"ssh_user": head.ssh.user or "root", "ssh_private_key": head.ssh.key},
        "min_workers": len(workers), "max_workers": len(workers), "upscaling_speed": 100.0,
        "idle_timeout_minutes": 60,
        "docker": {"image": c.image, "container_name": RAY_CONTAINER, "pull_before_run": False,
                   "run_options": ["--shm-size=1g", *LENT_TOOLS]},
        "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [],
        "head_start_ray_commands": [
            "ray stop",
            f"ray start --head --port={c.ports.ray_gcs} --node-ip-address={head.ip} "
            "--autoscaling-config=~/ray_bootstrap_config.yaml"],
        "worker_start_ray_commands": [
            "ray stop", f"ray start --address={head.ip}:{c.ports.ray_gcs}"],
    }
    path = workdir / "ray-cluster.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def on_node(container: str, *argv: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", container, *argv], capture_output=True, text=True, check=check,
                          timeout=timeout)


def clean_nodes(nodes: list[str], inv: Path) -> None:
    """Neither tool's containers left on any node."""
    must(down(inv), "bootstrap down")
    for n in nodes:
        on_node(n, "docker", "rm", "-f", RAY_CONTAINER)


def poll_alive(head_node: str, address: str, ips: list[str], deadline: float) -> dict:
    """Run checks/ray_nodes.py in the head's `ray up` container once it exists; its last event."""
    script = (ROOT / "checks" / "ray_nodes.py").read_bytes()
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        r = subprocess.run(["docker", "exec", "-i", head_node, "docker", "exec", "-i", RAY_CONTAINER, "python3", "-",
                            "--address", address, "--expect", ",".join(ips), "--gpus", "0",
                            "--deadline", f"{max(1.0, end - time.monotonic()):.0f}", "--tag", "perf-ray-up"],
                           input=script, capture_output=True, timeout=deadline + 60)
        events = [json.loads(ln) for ln in r.stdout.decode().splitlines() if ln.startswith("{")]
        done = [e for e in events if e.get("event") == "done"]
        if done:
            return done[-1]
        time.sleep(0.5)  # the container is not there yet
    return {"ready": False, "error": "the head container never appeared"}


def ray_up_once(ray: str, cfg: Path, head_node: str, address: str, ips: list[str], deadline: float,
                v2: bool) -> float | None:
    env = dict(os.environ, RAY_UP_enable_autoscaler_v2="1" if v2 else "0")
    got: dict = {}
    t0 = time.time()
    poller = threading.Thread(target=lambda: got.update(poll_alive(head_node, address, ips, deadline)))
    poller.start()
    r = subprocess.run([ray, "up", "-y", "--no-config-cache", str(cfg)], env=env, capture_output=True, text=True,
                       timeout=deadline + 120)
    poller.join()
    subprocess.run([ray, "down", "-y", str(cfg)], env=env, capture_output=True, timeout=300)
    if r.returncode != 0:
        log(f"ray up exited {r.returncode}:\n{(r.stdout + r.stderr)[-2000:]}")
        return None
    if not got.get("ready"):
        log(f"ray up (autoscaler {'v2' if v2 else 'v1'}): not every node alive within {deadline:g}s: "
            f"{got.get('error') or 'missing ' + ','.join(got.get('missing') or [])}")
        return None
    return max(float(t) for t in got["first_seen"].values()) - t0


def bootstrap_once(inv: Path) -> float | None:
    t0 = time.monotonic()
    r = subprocess.run(bootstrap_cmd("up", "-i", str(inv)), capture_output=True, text=True)
    took = time.monotonic() - t0
    if r.returncode != 0:
        log(f"bootstrap up exited {r.returncode}:\n{r.stderr[-2000:]}")
        return None
    return took


def median(xs: list[float | None]) -> float | None:
    """The median of a tool's runs; None unless every run finished."""
    ok = [x for x in xs if x is not None]
    return statistics.median(ok) if len(ok) == len(xs) and ok else None


def checks(times: dict[str, list[float | None]]) -> tuple[list[V.Check], list[str]]:
    """The target against the fastest `ray up` whose runs all finished, or not measured (with the
    reason); the failures: bootstrap runs that failed, or no `ray up` to compare with."""
    name = ("bootstrap / fastest working ray up", "<=", TARGET)
    ours = median(times["bootstrap"])
    working = {k: median(xs) for k, xs in times.items() if k != "bootstrap" and median(xs) is not None}
    failures = []
    if ours is None:
        bad = sum(x is None for x in times["bootstrap"])
        failures.append(f"bootstrap up failed in {bad} of {len(times['bootstrap'])} run(s)")
    if not working:
        failures.append("no `ray up` run listed every node: nothing to compare with")
    if ours is None or not working:
        why = "bootstrap up failed" if ours is None else "no `ray up` run listed every node"
        return [V.not_measured(*name, why)], failures
    best = min(working, key=working.get)
    return [V.Check(f"bootstrap / {best}", "<=", TARGET, ours / working[best])], failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--ray", default="ray", help="Ray's CLI (the image's Ray version)")
    ap.add_argument("--autoscaler", choices=("v1", "v2", "both"), default="both")
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds a `ray up` gets to list every node")
    a = ap.parse_args(argv)
    inv = sandbox_up(a.nodes)
    doc = yaml.safe_load(inv.read_text())
    nodes = [f"bootstrap-sandbox-node{i + 1}" for i in range(a.nodes)]  # the sandbox's node containers
    ips = [h["address"] for h in doc["hosts"]][: a.nodes]
    address = f"{ips[0]}:{load_inventory(str(inv)).cluster.ports.ray_gcs}"
    kinds = ["v1", "v2"] if a.autoscaler == "both" else [a.autoscaler]
    times: dict[str, list[float | None]] = {"bootstrap": [], **{f"ray up ({k})": [] for k in kinds}}
    with tempfile.TemporaryDirectory(prefix="perf-ray-up-") as tmp:
        cfg = launcher_config(inv, Path(tmp))
        clean_nodes(nodes, inv)
        must_warm = bootstrap_once(inv)  # the image present on every node, not timed
        if must_warm is None:
            return 1
        for rep in range(a.reps):
            clean_nodes(nodes, inv)
            times["bootstrap"].append(bootstrap_once(inv))
            log(f"rep {rep + 1}: bootstrap up {times['bootstrap'][-1]}")
            for k in kinds:
                clean_nodes(nodes, inv)
                t = ray_up_once(a.ray, cfg, nodes[0], address, ips, a.deadline, v2=(k == "v2"))
                times[f"ray up ({k})"].append(t)
                log(f"rep {rep + 1}: ray up ({k}) {t}")
        clean_nodes(nodes, inv)

    ours = median(times["bootstrap"])
    body = []
    for name, xs in times.items():
        m = median(xs)
        runs = ", ".join("-" if x is None else f"{x:.1f}" for x in xs)
        ratio = "-" if m is None or ours is None else f"{ours / m:.2f}"
        body.append((name, runs, "did not finish" if m is None else f"{m:.1f}", ratio))
    print(render(("tool", "runs (s)", "median (s)", "bootstrap / this"), body))
    found, failures = checks(times)
    for line in V.lines(found, failures):
        print(line)
    return V.exit_status(found, failures)


if __name__ == "__main__":
    sys.exit(main())
