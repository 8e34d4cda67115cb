#!/usr/bin/env python3
"""Cold bring-up and weights on rack-shaped links: `bootstrap up` on N nodes that do not have the
image, every node pulling it from the registry (`cluster.peer_copy: false`, the plain-pull baseline)
vs one node pulling it and the others copying it from peers over the data network (`peer_copy: true`,
the default); then `serve --sync-model`'s copy of a model directory from the head to the others.

The sandbox's links are shaped first (`bootstrap sandbox up --registry-link R --node-link L`, Linux
tc; default 100mbit and 1gbit: the 1:10 of a 10 Gbit/s registry uplink and a 100 Gbit/s fabric,
scaled so that this machine's CPU is not the limit). --unshaped measures the bare sandbox instead.

For each N in --nodes, on the first N sandbox nodes, one run per mode (modes alternate; each run
starts from `down` and the image removed from those N nodes):

    up          wall time of `bootstrap up -i INV --json` (process start included)
    registry    bytes the sandbox registry's container sent during the run (its eth0 tx_bytes
                counter, read before and after), in GB
    image-from  where each node got the image ("registry" or the sending peer), from `up --json`

and after the peers run, at N >= 2: a model directory (the sandbox's tiny model plus --model-mb of
random bytes, which no compression shrinks) made on the head only, copied to the others by
bootstrap.serve.modelsync.sync_model, the code `serve --sync-model` runs: wall time and, per node,
the copy's own time (its end of the pipelined copy, the commit included), so its throughput in
Mbit/s. With --sync-only --fanouts 1,4 the copy's shape side by side: 1 is serve's chain (each node
passes the stream on to the next), 4 a head serving up to four nodes at once.

Printed side by side: pull and peers per N, peers/pull, time vs N in each mode, registry bytes,
the model copy; a PNG of the three against N with --png.

Targets (exit status 1 when one is missed, or a run fails; each printed as met, missed or not
measured, with the reason; see perf/verdict.py):
    peers: registry bytes at Nmax <= 1.2 x the registry bytes at N=1 (the image crosses it once)
    peers: up(Nmax)/up(1) <= 1.3
    sync-model: the slowest node's copy throughput >= 70% of the node link, at every N >= 2

The sandbox is one per machine (fixed names): this removes the image from its nodes and reshapes
its links, so do not run it while tests use the sandbox. At the end the links are unshaped again and
the sandbox left up (with the image on every node) unless the benchmark created it and --keep is
not given.

Example: python -m perf.cold_up --nodes 1,2,4 --png docs/img/cold-up.png
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from perf import verdict as V
from perf.bringup import ROOT, bootstrap_cmd, down, first_hosts, must, render, sandbox_up, up

REGISTRY = "bootstrap-sandbox-registry"
TARGET_BYTES = 1.2
TARGET_SCALING = 1.3
TARGET_LINK_SHARE = 0.7
MODEL = "/tmp/bench-model"
TINY_MODEL = "/opt/models/tiny-llama"


def log(msg: str) -> None:
    print(f"cold_up: {msg}", file=sys.stderr, flush=True)


def registry_tx() -> int:
    r = subprocess.run(["docker", "exec", REGISTRY, "cat", "/sys/class/net/eth0/statistics/tx_bytes"],
                       capture_output=True, text=True, check=True)
    return int(r.stdout.strip())


def node_containers(inv: Path) -> list[str]:
    doc = yaml.safe_load(inv.read_text())
    return [f"bootstrap-sandbox-{h['name']}" for h in doc["hosts"]]


#: how each node without the image gets it, as the inventory says (the modes of this benchmark)
MODES = {
    "pull": {"peer_copy": False},  # every node from the registry (the plain-pull baseline)
    "peers": {"peer_copy": True, "image_mirror": False},  # the head pulls, then copies node to node
    "mirror": {"peer_copy": True},  # every node at once through the head's mirror (up's default)
}
DESCRIBE = {"pull": "every node from the registry", "peers": "registry once, then node to node",
            "mirror": "every node through the head's mirror"}


def with_mode(inv: Path, mode: str, work: Path) -> Path:
    doc = yaml.safe_load(inv.read_text())
    doc["cluster"].update(MODES[mode])
    path = work / f"{inv.stem}-{mode}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cold(inv: Path) -> dict:
    must(down(inv), "down")
    cluster = yaml.safe_load(inv.read_text())["cluster"]
    for c in node_containers(inv):
        for image in (cluster["image"], cluster.get("image_mirror") or cluster["image"]):
            subprocess.run(["docker", "exec", c, "docker", "rmi", "-f", image], capture_output=True)
        subprocess.run(["docker", "exec", c, "docker", "image", "prune", "-f"], capture_output=True)
    before = registry_tx()
    run = must(up(inv), f"up {inv.name}")
    sent = registry_tx() - before
    doc = run.json()
    return {"up": run.seconds, "registry": sent,
            "from": {h["host"]: h.get("image_from") for h in doc.get("hosts", [])}}


def in_cluster(node: str, container: str, script: str) -> str:
    """sh -c SCRIPT in the cluster container on sandbox node ``node`` (through its own Docker)."""
    r = subprocess.run(["docker", "exec", node, "docker", "exec", container, "sh", "-c", script],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"cold_up: {node}: {script!r} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return r.stdout


#: "3.1s": what a stage's "done" event says of each host (bootstrap.remote.session.Session.stage)
_SECONDS = re.compile(r"^([\d.]+)s$")


class StageTimes:
    """A reporter that keeps each host's time in one stage (its "done" event)."""

    def __init__(self, stage: str) -> None:
        self.stage, self.seconds = stage, {}

    def event(self, host: str, stage: str, status: str, detail: str = "") -> None:
        m = _SECONDS.match(detail)
        if stage == self.stage and status == "done" and m:
            self.seconds[host] = float(m.group(1))


def sync_model(inv: Path, model_mb: int, fanout: int | None = None) -> dict:
    """A model directory of ``model_mb`` MB made on the head only, then sync_model (what `serve
    --sync-model` runs) to the others: wall time, bytes, per-node seconds and sender."""
    from bootstrap.inventory import load_inventory
    from bootstrap.remote.session import Session
    from bootstrap.serve import modelsync as MS

    loaded = load_inventory(str(inv))
    name = loaded.cluster.container_name
    nodes = node_containers(inv)
    in_cluster(nodes[0], name, f"rm -rf {MODEL} && cp -r {TINY_MODEL} {MODEL} && "
                               f"head -c {model_mb}M /dev/urandom > {MODEL}/padding.dat")
    for n in nodes[1:]:
        in_cluster(n, name, f"rm -rf {MODEL}")
    size = int(in_cluster(nodes[0], name, f"du -sb {MODEL}").split()[0])
    times = StageTimes("copy-model")
    t0 = time.perf_counter()
    with Session(loaded, reporter=times) as sess:
        got = MS.sync_model(sess, MODEL, [h for h in loaded.hosts if not h.is_head],
                            **({"fanout": fanout} if fanout else {}))
    wall = time.perf_counter() - t0
    # a relayed node ("this machine") has no copy-model time: its copy went through here
    per = {host: (src, times.seconds.get(host) if src != "this machine" else None) for host, src in got.items()}
    sums = {in_cluster(n, name, f"cd {MODEL} && find . -type f | sort | xargs sha256sum") for n in nodes}
    if len(sums) != 1:
        raise SystemExit("cold_up: after sync_model the nodes' model files differ")
    for n in nodes:
        in_cluster(n, name, f"rm -rf {MODEL}")
    return {"wall": wall, "bytes": size, "per": per}


def slowest_mbit(sync: dict) -> float | None:
    """The slowest receiver's copy throughput in Mbit/s (None: one was relayed, or none measured)."""
    secs = [s for _, s in sync["per"].values()]
    if not secs or any(s is None or s <= 0 for s in secs):
        return None
    return sync["bytes"] * 8 / max(secs) / 1e6


def checks(res: dict[tuple[int, str], dict], nodes: list[int], syncs: dict[int, dict] | None = None,
           node_bits: int | None = None, mode: str = "mirror") -> list[V.Check]:
    """The targets against the runs in ``res`` ((N, mode) -> cold()'s dict) of ``mode`` (`up`'s
    default: the mirror) and the model copies in ``syncs`` (N -> sync_model()'s dict), or not
    measured (with the reason)."""
    last = nodes[-1]
    why = V.no_ratio_to_one(nodes)
    share = ("sync-model: slowest node's copy / node link, min over N>=2", ">=", TARGET_LINK_SHARE)
    found: list[V.Check]
    if why:
        found = [V.not_measured(f"{mode}: registry bytes at Nmax / at N=1", "<=", TARGET_BYTES, why),
                 V.not_measured(f"{mode}: up(Nmax)/up(1)", "<=", TARGET_SCALING, why)]
    else:
        sent = (f"{mode}: registry bytes at N={last} / at N=1", "<=", TARGET_BYTES)
        scaling = (f"{mode}: up({last})/up(1)", "<=", TARGET_SCALING)
        one, top = res[(1, mode)], res[(last, mode)]
        found = [V.Check(*sent, top["registry"] / one["registry"]) if one["registry"] > 0
                 else V.not_measured(*sent, "the registry sent 0 bytes at N=1: its counter did not move"),
                 V.Check(*scaling, top["up"] / one["up"])]
    syncs = syncs or {}
    rates = [slowest_mbit(s) for s in syncs.values()]
    if not node_bits:
        found.append(V.not_measured(*share, "node links unshaped (--unshaped): no link rate to compare with"))
    elif not syncs:
        found.append(V.not_measured(*share, "no N >= 2 in --nodes, or --no-sync: nothing was copied"))
    elif any(r is None for r in rates):
        found.append(V.not_measured(*share, "a node got the model relayed through this machine, not from a peer"))
    else:
        found.append(V.Check(*share, min(rates) * 1e6 / node_bits))
    return found


def leave_sandbox(nodes: int, keep: bool, shaped: bool) -> None:
    """The sandbox down (one this run created, without --keep), or left up with its links unshaped."""
    if not keep:
        subprocess.run(bootstrap_cmd("sandbox", "down"), cwd=ROOT)
    elif shaped:
        subprocess.run(bootstrap_cmd("sandbox", "up", "--nodes", str(nodes)), cwd=ROOT, stdout=subprocess.DEVNULL)


def sync_table(syncs: dict[tuple[int, int], dict], node_bits: int | None) -> str:
    rows = []
    for (n, f), s in syncs.items():
        rate = slowest_mbit(s)
        share = f"{rate * 1e6 / node_bits:.2f}" if rate is not None and node_bits else "-"
        secs = [x for _, x in s["per"].values() if x is not None]
        rows.append((str(n), str(f), f"{s['bytes'] / 1e6:.0f}", f"{s['wall']:.1f}",
                     f"{max(secs):.1f}" if secs else "-", f"{rate:.0f}" if rate is not None else "relayed", share))
    return render(("N", "fanout", "model MB", "sync-model s", "slowest copy s", "slowest copy Mbit/s",
                   "copy/node link"), rows)


def sync_only(nodes: list[int], inventory: Path, work: Path, a: argparse.Namespace, existed: bool,
              shape: tuple[str, ...], node_bits: int | None) -> int:
    """--sync-only: the model copy at each N >= 2 and each fanout in --fanouts, side by side."""
    from bootstrap.cluster.imagedist.plan import MODEL_FANOUT

    fanouts = [int(x) for x in a.fanouts.split(",")] if a.fanouts else [MODEL_FANOUT]
    syncs: dict[tuple[int, int], dict] = {}
    try:
        for n in [x for x in nodes if x >= 2]:
            inv = with_mode(first_hosts(inventory, n, work), "peers", work)
            must(up(inv), f"up {inv.name}")
            for f in fanouts:
                log(f"N={n}: sync-model of {a.model_mb} MB from the head, fanout {f}")
                s = syncs[(n, f)] = sync_model(inv, a.model_mb, f)
                log(f"N={n} fanout {f}: sync-model {s['wall']:.1f}s: {s['per']}")
        must(down(first_hosts(inventory, nodes[-1], work)), "final down")
    finally:
        leave_sandbox(nodes[-1], existed or a.keep, bool(shape))
    links = "links unshaped" if a.unshaped else f"registry link {a.registry_link}, node links {a.node_link}"
    print(f"serve --sync-model's copy on the sandbox ({os.cpu_count()} CPU(s); {links}): {a.model_mb} MB of random "
          f"bytes + the tiny model, from the head to the others; fanout: children per node of the pipelined "
          f"copy (serve's: {MODEL_FANOUT}, a chain)")
    print(sync_table(syncs, node_bits))
    for (n, f), s in syncs.items():
        print(f"sync-model at N={n}, fanout {f}: "
              + ", ".join(f"{h} from {src} in {sec}s" for h, (src, sec) in s["per"].items()))
    found = checks({}, [nodes[-1]], {n: s for (n, f), s in syncs.items() if f == MODEL_FANOUT}, node_bits)[2:]
    for line in V.lines(found):
        print(line)
    return V.exit_status(found)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1,2,4", help="node counts, comma-separated (default 1,2,4)")
    p.add_argument("--registry-link", default="100mbit", help="the registry's send rate (default 100mbit)")
    p.add_argument("--node-link", default="1gbit", help="each node's send rate (default 1gbit)")
    p.add_argument("--unshaped", action="store_true", help="measure the bare sandbox: no tc on any link")
    p.add_argument("--model-mb", type=int, default=300, help="random bytes in the copied model (default 300)")
    p.add_argument("--png", default="", help="write a PNG of time vs N here")
    p.add_argument("--keep", action="store_true", help="leave a sandbox this created up at the end")
    p.add_argument("--sync-only", action="store_true",
                   help="only the model copy: `up` (the image left on the nodes), then sync-model at each N>=2")
    p.add_argument("--fanouts", default="",
                   help="with --sync-only: children per node of the pipelined copy to compare, e.g. 1,4 "
                        "(default: serve's, 1: a chain)")
    p.add_argument("--modes", default="pull,peers,mirror",
                   help="how nodes without the image get it, comma-separated: pull (every node from the "
                        "registry), peers (one pull, then node to node), mirror (all at once through the "
                        "head's mirror, up's default); default all three")
    p.add_argument("--no-sync", action="store_true", help="skip the model copy")
    a = p.parse_args(argv)
    modes = [m for m in MODES if m in {x.strip() for x in a.modes.split(",")}]
    if not modes or set(x.strip() for x in a.modes.split(",")) - set(MODES):
        p.error(f"--modes takes {', '.join(MODES)}")
    nodes = sorted({int(x) for x in a.nodes.split(",") if x.strip()})
    if not nodes or nodes[0] < 1:
        p.error("--nodes needs positive counts")
    from bootstrap.sandbox.links import parse_rate

    try:
        node_bits = None if a.unshaped else parse_rate(a.node_link, "--node-link")
        shape = () if a.unshaped else ("--registry-link", a.registry_link, "--node-link", a.node_link)
        if not a.unshaped:
            parse_rate(a.registry_link, "--registry-link")
    except ValueError as exc:
        p.error(str(exc))
    work = Path(tempfile.mkdtemp(prefix="bootstrap-cold-up-"))
    existed = subprocess.run(["docker", "inspect", REGISTRY], capture_output=True).returncode == 0
    inventory = sandbox_up(nodes[-1], shape)
    res: dict[tuple[int, str], dict] = {}
    syncs: dict[int, dict] = {}
    if a.sync_only:
        return sync_only(nodes, inventory, work, a, existed, shape, node_bits)
    try:
        for n in nodes:
            base = first_hosts(inventory, n, work)
            for mode in modes:
                log(f"N={n} {mode}: down, image removed, up")
                r = res[(n, mode)] = cold(with_mode(base, mode, work))
                log(f"N={n} {mode}: {r['up']:.1f}s, registry sent {r['registry'] / 1e9:.2f} GB, from {r['from']}")
            if n >= 2 and not a.no_sync:
                log(f"N={n}: sync-model of {a.model_mb} MB from the head")
                s = syncs[n] = sync_model(with_mode(base, "peers", work), a.model_mb)
                log(f"N={n}: sync-model {s['wall']:.1f}s: {s['per']}")
        must(down(first_hosts(inventory, nodes[-1], work)), "final down")
    finally:
        leave_sandbox(nodes[-1], existed or a.keep, bool(shape))
    gb = lambda x: f"{x / 1e9:.2f}"  # noqa: E731

    def copy_cols(n: int) -> tuple[str, str, str]:
        s = syncs.get(n)
        if s is None:
            return "-", "-", "-"
        rate = slowest_mbit(s)
        share = f"{rate * 1e6 / node_bits:.2f}" if rate is not None and node_bits else "-"
        return f"{s['wall']:.1f}", f"{rate:.0f}" if rate is not None else "relayed", share

    first = nodes[0]
    rows = []
    for n in nodes:
        cells = [str(n)]
        cells += [f"{res[(n, m)]['up']:.1f}" for m in modes]
        cells += [f"{res[(n, m)]['up'] / res[(n, 'pull')]['up']:.2f}" for m in modes if m != "pull" and "pull" in modes]
        cells += [f"{res[(n, m)]['up'] / res[(first, m)]['up']:.2f}" for m in modes]
        cells += [gb(res[(n, m)]['registry']) for m in modes]
        rows.append((*cells, *copy_cols(n)))
    head = ("N", *(f"{m} s" for m in modes), *(f"{m}/pull" for m in modes if m != "pull" and "pull" in modes),
            *(f"{m}(N)/{m}({first})" for m in modes), *(f"registry GB {m}" for m in modes),
            "sync-model s", "slowest copy Mbit/s", "copy/node link")
    links = "links unshaped" if a.unshaped else f"registry link {a.registry_link}, node links {a.node_link}"
    print(f"cold up on the sandbox ({os.cpu_count()} CPU(s) shared by every node; {links}), one run per cell; "
          f"modes: {', '.join(f'{m} ({DESCRIBE[m]})' for m in modes)}; "
          f"sync-model of {a.model_mb} MB of random bytes + the tiny model")
    print(render(head, rows))
    for m in modes:
        print(f"image-from at N={nodes[-1]} ({m}): {res[(nodes[-1], m)]['from']}")
    for n, s in syncs.items():
        print(f"sync-model at N={n}: " + ", ".join(f"{h} from {src} in {sec}s" for h, (src, sec) in s["per"].items()))
    if a.png:
        from perf.plot import line_plot

        series = {f"{m}: {DESCRIBE[m]}": [res[(n, m)]["up"] for n in nodes] for m in modes}
        if syncs:
            series[f"serve --sync-model: {a.model_mb} MB head to the others"] = [
                syncs[n]["wall"] if n in syncs else None for n in nodes]
        line_plot(a.png, f"cold start on the sandbox ({links})", nodes, series, xlabel="nodes (N)", prefix="cold_up")
        print(f"plot: {a.png}")
    found = checks(res, nodes, syncs, node_bits, "mirror" if "mirror" in modes else modes[-1])
    for line in V.lines(found):
        print(line)
    return V.exit_status(found)


if __name__ == "__main__":
    sys.exit(main())
