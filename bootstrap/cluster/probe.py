"""Read-only looks at the hosts over a Session, shared by every command: each host's facts, what a
public address would reach on the head, and whether the workers reach the head.

The network as each node sees it (interfaces, *_SOCKET_IFNAME) is doctor's look, in
nccl/network.py: it fills doctor's NodeNet, and the cluster layer never imports doctor."""
from __future__ import annotations

import json
from typing import Iterable, Sequence

from bootstrap import exposure
from bootstrap.cluster import facts as F
from bootstrap.cluster import reach as RC
from bootstrap.cluster import runtime as RT
from bootstrap.cluster.rack import RackFinding
from bootstrap.model import Host
from bootstrap.remote import node as N
from bootstrap.remote.session import Session


def host_facts(sess: Session, h: Host) -> F.HostFacts:
    c = sess.inv.cluster
    return F.gather(sess.ssh[h.name], container=c.container_name, image=c.image,
                    want_gpus=c.accelerator == "gpu", cluster=c.name)


def gather_hosts(sess: Session, hosts: Iterable[Host] | None = None) -> dict[str, F.HostFacts]:
    return sess.stage("facts", hosts or sess.inv.hosts, lambda h: host_facts(sess, h))


def runtime_from_containers(sess: Session) -> None:
    """cluster.runtime unset: set sess.inv's from what the node containers run (the head's, else a
    worker's; see bootstrap.cluster.runtime). Left unset when no host has one."""
    if sess.inv.cluster.runtime is not None:
        return
    name = sess.inv.cluster.container_name
    for h in sess.inv.hosts:
        if h.name not in sess.ssh:
            continue
        inv = RT.from_containers(sess.inv, {h.name: N.of(sess, h, name).inspect(timeout=20)})
        if inv.cluster.runtime is not None:
            sess.inv = inv
            return


def exposure_warnings(sess: Session, *, vllm_listen: str | None = None) -> list[str]:
    """Services on the head a public address would reach (the dashboard; vLLM when given)."""
    head = sess.inv.head
    r = N.of(sess, head).run(F.addresses_cmd(), timeout=30, check=False)
    found = exposure.warnings(sess.inv, {head.name: F.parse_addresses(r.stdout)}, vllm_listen=vllm_listen)
    if not r.ok and not F.parse_addresses(r.stdout):  # no addresses read: "no warning" would mean nothing
        why = (r.stderr or r.stdout).strip()[-200:] or f"exit {r.exit_code}"
        found.append(f"{head.name}: could not list its addresses ({why}): what a public address would reach "
                     "was not checked")
    for w in found:
        sess.reporter.event(head.name, "exposure", "warning", w)
    return found


def workers_cut_off(sess, port: int, *, timeout: float = 3.0) -> dict[str, str]:
    """Workers whose container cannot open a TCP connection to the head's data-plane IP:PORT
    (checks/reach.py inside each worker container), with the reason; {} when all can."""
    inv = sess.inv
    name = inv.cluster.container_name
    # the raw result: its exit status and a stopped container say why (_reach_error)
    reach = sess.stage("reach-head", inv.workers, lambda h: N.of(sess, h, name).ask(
        "reach.py", inv.head.ip, str(port), f"{timeout:g}", timeout=30 + timeout).result, strict=False)
    failed = reach.failed
    return {n: str(failed[n]) if n in failed else _reach_error(r, inv.head.ip, port) for n, r in reach.items()
            if n in failed or not r.ok}


def _reach_error(r, head_ip: str, port: int) -> str:
    if "is not running" in r.stderr:
        return (f"its container has stopped, so the check could not run there (a Ray worker exits when it "
                f"loses the head: likely cut off from {head_ip}:{port}; `bootstrap logs` shows why)")
    try:
        detail = json.loads(r.stdout.strip().splitlines()[-1]).get("error")
    except (ValueError, IndexError):
        detail = (r.stderr or r.stdout).strip()[-200:]
    return f"cannot reach the head {head_ip}:{port} from this node over the data network ({detail})"


def port_reachability(sess: Session, hosts: Sequence[Host]) -> tuple[list[RackFinding], list[str]]:
    """Every node listens on its planned ports (checks/port_probe.py on the host, with its python3),
    then every node dials every other's, at once (bootstrap.cluster.reach). Returns the findings and
    the hosts where the probe could not run (no python3, a failed SSH command): not checked there."""
    inv = sess.inv
    plan = RC.planned_ports(inv)

    pids: dict[str, int] = {}

    def listen(h: Host) -> dict | None:
        doc = N.of(sess, h).ask_host("port_probe.py", "listen", h.ip, f"{RC.LISTEN_SECONDS:g}",
                                     *(str(p) for p, _ in plan[h.name]), timeout=30).doc
        if not doc or not isinstance(doc.get("ports"), dict):
            return None
        if isinstance(doc.get("pid"), int):
            pids[h.name] = doc["pid"]
        return doc["ports"]

    bound = {n: v for n, v in sess.stage("ports-listen", hosts, listen, strict=False).items()
             if isinstance(v, dict)}
    listening = [h for h in hosts if h.name in bound]
    dial = RC.targets(listening, bound)

    def connect(h: Host) -> list | None:
        doc = N.of(sess, h).ask_host("port_probe.py", "connect", f"{RC.CONNECT_TIMEOUT:g}", *dial[h.name],
                                     timeout=30 + RC.CONNECT_TIMEOUT).doc
        return doc["results"] if doc and isinstance(doc.get("results"), list) else None

    try:
        dialled = {n: v for n, v in sess.stage("ports-connect", listening, connect, strict=False).items()
                   if isinstance(v, list)}
    finally:
        # free the ports for the cluster now (a listener left alone exits by itself within LISTEN_SECONDS)
        sess.stage("ports-stop", [h for h in hosts if h.name in pids], lambda h: N.of(sess, h).run(
            ("kill", str(pids[h.name])), timeout=30, check=False), strict=False)
    unchecked = [h.name for h in hosts if h.name not in bound or h.name not in dialled]
    return RC.findings(inv, listening, bound, dialled), unchecked
