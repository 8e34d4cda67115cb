"""The ports check's rules, pure: the ports each node listens on and dials, and what a blocked one means.

Node-to-node reachability on the ports the cluster will use, tested between the nodes themselves
(not from this machine), before `up` starts anything: a firewall that drops Ray's GCS port between
two nodes, or every port but a few, otherwise shows up later as a worker that never joins or a
collective that hangs.

Pure: which ports each node listens on (`planned_ports`), whom each node dials (`targets`), and the
findings from what came back (`findings`). The remote steps (checks/port_probe.py on every host,
listen then connect) are in bootstrap.cluster.preflight.run.port_reachability.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from bootstrap.cluster.preflight.registry import Finding
from bootstrap.model import NATIVE_COORD_PORT, NATIVE_MASTER_PORT, Host, Inventory, kv_events_on

#: The check's name (`up --skip-check ports`).
CHECK = "ports"
#: Seconds one connection may take before it counts as dropped.
CONNECT_TIMEOUT = 2.0
#: Seconds a listener waits for its peers at most (the connect step takes CONNECT_TIMEOUT + SSH).
LISTEN_SECONDS = 15.0
#: An ephemeral port stands for those NCCL, Gloo and Ray's workers open at run time.
EPHEMERAL = 0


def planned_ports(inv: Inventory) -> dict[str, list[tuple[int, str]]]:
    """host -> [(port, what uses it)]: the head's Ray GCS (Ray clusters) and vLLM API, and the
    torch.distributed master and coordination ports of vLLM's native multi-node mode (a fleet
    replica's; `serve --backend native` picks its master port at random); on every node an ephemeral
    port, and the image-copy port where peers copy the image."""
    c = inv.cluster
    out: dict[str, list[tuple[int, str]]] = {}
    for h in inv.hosts:
        mine: list[tuple[int, str]] = []
        if h.is_head:
            if c.runtime != "none":
                mine.append((c.ports.ray_gcs, "Ray's GCS"))
            mine.append((c.ports.vllm, "vLLM's API"))
            if c.runtime != "ray":
                mine.append((NATIVE_MASTER_PORT, "vLLM's torch.distributed master port"))
                mine.append((NATIVE_COORD_PORT, "the replica members' coordination"))
        if c.peer_copy:
            mine.append((c.ports.image_copy, "the image copy between peers and the head's registry mirror"))
        if c.router.prefill and c.replicas > 1:
            mine.append((c.ports.kv_transfer, "the KV cache transfer's side channel (NIXL)"))
        if h.is_head and kv_events_on(inv):
            mine.append((c.ports.kv_events, "the engine's KV cache events (the routers' kv_aware)"))
        mine.append((EPHEMERAL, "an ephemeral port (NCCL, Gloo and Ray's workers use them)"))
        out[h.name] = mine
    return out


def targets(hosts: Sequence[Host], bound: Mapping[str, Mapping[str, object]]) -> dict[str, list[str]]:
    """source host -> the IP:PORT targets it dials: every other node's planned ports as its listener
    reported them (an ephemeral port by the number it got; a busy port as it is: whatever holds it
    answers; one that failed to bind is left out, and said in findings)."""
    out: dict[str, list[str]] = {}
    for src in hosts:
        mine = []
        for dst in hosts:
            if dst.name == src.name:
                continue
            for key, got in (bound.get(dst.name) or {}).items():
                port = got if isinstance(got, int) else (int(key) if got == "busy" else None)
                if port:
                    mine.append(_hostport(dst.ip, port))
        out[src.name] = mine
    return out


def _hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def findings(inv: Inventory, hosts: Sequence[Host], bound: Mapping[str, Mapping[str, object]],
             dialled: Mapping[str, Sequence[Mapping[str, object]]], firewalld: frozenset[str] = frozenset()
             ) -> list[Finding]:
    """A finding per node and port that another node could not reach (named on the node whose port
    it is: its firewall, or the path to it, drops or rejects it), and per port a node could not
    listen on for another reason than being busy. `firewalld`: the hosts where firewalld runs (its
    zone's reject is overridden only by firewalld itself: the fix says firewall-cmd there)."""
    plan = planned_ports(inv)
    by_target: dict[str, tuple[str, int, str]] = {}
    for h in hosts:
        what = dict(plan.get(h.name, ()))
        for key, got in (bound.get(h.name) or {}).items():
            port = got if isinstance(got, int) else int(key)
            by_target[_hostport(h.ip, port)] = (h.name, port, what.get(int(key), "a cluster port"))
    out: list[Finding] = []
    for h in hosts:
        for key, got in (bound.get(h.name) or {}).items():
            if isinstance(got, str) and got.startswith("error"):
                out.append(Finding(CHECK, h.name, f"cannot listen on port {key} on {h.ip} ({got[7:]})",
                                       f"free the port on {h.name} or move it (cluster.ports)"))
    blocked: dict[tuple[str, int, str], list[tuple[str, str]]] = {}
    for src, results in dialled.items():
        for r in results:
            if r.get("ok") or str(r.get("target")) not in by_target:
                continue
            blocked.setdefault(by_target[str(r["target"])], []).append((src, str(r.get("error") or "failed")))
    for (dst, port, what), srcs in blocked.items():
        errors = sorted({e for _, e in srcs})
        how = ("no answer within %gs: a firewall drops it" % CONNECT_TIMEOUT if errors == ["timeout"] else
               "refused: a firewall rejects it" if errors == ["refused"] else ", ".join(errors))
        src_names = ", ".join(s for s, _ in srcs)
        ips = {h.name: h.ip for h in inv.hosts}
        if dst in firewalld:
            fix = (f"firewalld runs on {dst} (a ufw or iptables rule does not override its zone's reject): trust the "
                   "other nodes there, `sudo firewall-cmd --permanent --zone=trusted "
                   + " ".join(f"--add-source={ips[h.name]}" for h in inv.hosts if h.name != dst)
                   + " && sudo firewall-cmd --reload`")
        else:
            fix = (f"allow TCP from the other nodes' data-plane IPs to {dst} (`ufw allow from SUBNET`, "
                   f"`iptables -I INPUT -s SUBNET -j ACCEPT`), ports {_listed(plan.get(dst, ()))}")
        out.append(Finding(CHECK, dst, f"TCP port {port} ({what}) is not reachable from {src_names} ({how})", fix))
    order = {h.name: i for i, h in enumerate(hosts)}
    return sorted(out, key=lambda f: (order.get(f.host, 0), f.what))


def _listed(ports: Sequence[tuple[int, str]]) -> str:
    named = [str(p) for p, _ in ports if p != EPHEMERAL]
    eph = any(p == EPHEMERAL for p, _ in ports)
    return ", ".join(named) + (" and the ephemeral range" if eph else "") if named else "the ephemeral range"
