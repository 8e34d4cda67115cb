#!/usr/bin/env python3
"""Cold bring-up: `bootstrap up` on N nodes that do not have the image, every node pulling it from
the registry (`cluster.peer_copy: false`, what `up` did before) vs one node pulling it and the others
copying it from peers over the data network (`peer_copy: true`, the default).

For each N in --nodes, on the first N sandbox nodes, one run per mode (modes alternate; each run
starts from `down` and the image removed from those N nodes):

    up          wall time of `bootstrap up -i INV --json` (process start included)
    registry    bytes the sandbox registry's container sent during the run (its eth0 tx_bytes
                counter, read before and after), in GB
    image-from  where each node got the image ("registry" or the sending peer), from `up --json`

Printed side by side: pull and peers per N, peers/pull, and time vs N in each mode (up(N)/up(1)).

Targets (exit status 1 when one is missed, or a run fails; each printed as met, missed or not
measured, with the reason: both need a run at N=1 and one at a larger N, see perf/verdict.py):
    peers: registry bytes at Nmax <= 1.2 x the registry bytes at N=1 (the image crosses it once)
    peers: up(Nmax)/up(1) <= 1.3

The sandbox is one per machine (fixed names): this removes the image from its nodes, so do not run
it while tests use the sandbox. It is left up (with the image on every node) at the end unless the
benchmark created it and --keep is not given.

Example: python -m perf.cold_up --nodes 1,2,3
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from perf import verdict as V
from perf.bringup import ROOT, bootstrap_cmd, down, first_hosts, must, render, sandbox_up, up

REGISTRY = "bootstrap-sandbox-registry"
TARGET_BYTES = 1.2
TARGET_SCALING = 1.3


def log(msg: str) -> None:
    print(f"cold_up: {msg}", file=sys.stderr, flush=True)


def registry_tx() -> int:
    r = subprocess.run(["docker", "exec", REGISTRY, "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
                       capture_output=True, text=True, check=True)
    return int(r.stdout.strip())


def node_containers(inv: Path) -> list[str]:
    doc = yaml.safe_load(inv.read_text())
    return [f"bootstrap-sandbox-{h['name']}" for h in doc["hosts"]]


def with_peer_copy(inv: Path, on: bool, work: Path) -> Path:
    doc = yaml.safe_load(inv.read_text())
    doc["cluster"]["peer_copy"] = on
    path = work / f"{inv.stem}-{'peers' if on else 'pull'}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cold(inv: Path) -> dict:
    must(down(inv), "down")
    image = yaml.safe_load(inv.read_text())["cluster"]["image"]
    for c in node_containers(inv):
        subprocess.run(["docker", "exec", c, "docker", "rmi", "-f", image], capture_output=True)
        subprocess.run(["docker", "exec", c, "docker", "image", "prune", "-f"], capture_output=True)
    before = registry_tx()
    run = must(up(inv), f"up {inv.name}")
    sent = registry_tx() - before
    doc = run.json()
    return {"up": run.seconds, "registry": sent,
            "from": {h["host"]: h.get("image_from") for h in doc.get("hosts", [])}}


def checks(res: dict[tuple[int, str], dict], nodes: list[int]) -> list[V.Check]:
    """Both targets against the peers runs in ``res`` ((N, mode) -> cold()'s dict), or not measured
    (with the reason) where the run had no N=1 or no larger N to compare it with."""
    last = nodes[-1]
    why = V.no_ratio_to_one(nodes)
    if why:
        return [V.not_measured("peers: registry bytes at Nmax / at N=1", "<=", TARGET_BYTES, why),
                V.not_measured("peers: up(Nmax)/up(1)", "<=", TARGET_SCALING, why)]
    sent = (f"peers: registry bytes at N={last} / at N=1", "<=", TARGET_BYTES)
    scaling = (f"peers: up({last})/up(1)", "<=", TARGET_SCALING)
    one, top = res[(1, "peers")], res[(last, "peers")]
    return [V.Check(*sent, top["registry"] / one["registry"]) if one["registry"] > 0
            else V.not_measured(*sent, "the registry sent 0 bytes at N=1: its counter did not move"),
            V.Check(*scaling, top["up"] / one["up"])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1,2,3", help="node counts, comma-separated (default 1,2,3)")
    p.add_argument("--keep", action="store_true", help="leave a sandbox this created up at the end")
    a = p.parse_args(argv)
    nodes = sorted({int(x) for x in a.nodes.split(",") if x.strip()})
    if not nodes or nodes[0] < 1:
        p.error("--nodes needs positive counts")
    work = Path(tempfile.mkdtemp(prefix="bootstrap-cold-up-"))
    existed = subprocess.run(["docker", "inspect", REGISTRY], capture_output=True).returncode == 0
    inventory = sandbox_up(nodes[-1])
    res: dict[tuple[int, str], dict] = {}
    try:
        for n in nodes:
            base = first_hosts(inventory, n, work)
            for mode in ("pull", "peers"):
                log(f"N={n} {mode}: down, image removed, up")
                r = res[(n, mode)] = cold(with_peer_copy(base, mode == "peers", work))
                log(f"N={n} {mode}: {r['up']:.1f}s, registry sent {r['registry'] / 1e9:.2f} GB, from {r['from']}")
        must(down(first_hosts(inventory, nodes[-1], work)), "final down")
    finally:
        if not existed and not a.keep:
            subprocess.run(bootstrap_cmd("sandbox", "down"), cwd=ROOT)
    gb = lambda x: f"{x / 1e9:.2f}"  # noqa: E731
    base_pull, base_peer = res[(nodes[0], "pull")], res[(nodes[0], "peers")]
    rows = [(str(n), f"{res[(n, 'pull')]['up']:.1f}", f"{res[(n, 'peers')]['up']:.1f}",
             f"{res[(n, 'peers')]['up'] / res[(n, 'pull')]['up']:.2f}",
             f"{res[(n, 'pull')]['up'] / base_pull['up']:.2f}", f"{res[(n, 'peers')]['up'] / base_peer['up']:.2f}",
             gb(res[(n, 'pull')]['registry']), gb(res[(n, 'peers')]['registry'])) for n in nodes]
    print(f"cold up on the sandbox ({os.cpu_count()} CPU(s) shared by every node), one run per cell")
    print(render(("N", "pull s", "peers s", "peers/pull", f"pull(N)/pull({nodes[0]})", f"peers(N)/peers({nodes[0]})",
                  "registry GB pull", "registry GB peers"), rows))
    last = res[(nodes[-1], "peers")]
    print(f"image-from at N={nodes[-1]} (peers): {last['from']}")
    found = checks(res, nodes)
    for line in V.lines(found):
        print(line)
    return V.exit_status(found)


if __name__ == "__main__":
    sys.exit(main())
