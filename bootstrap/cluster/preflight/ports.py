"""The ports check's rules, pure: the ports each node listens on and dials, and what a blocked one means.

Node-to-node reachability on the ports the cluster will use, tested between the nodes themselves
(not from this machine), before `up` starts anything: a firewall that drops Ray's GCS port between
two nodes, or every port but a few, otherwise shows up later as a worker that never joins or a
collective that hangs.

The same probe sends, between every pair, a datagram of the path's MTU that may not be fragmented,
beside a small one (`payload_targets`): where the small one is echoed and the large one never is,
something on the path drops frames of that size (a switch port left at 1500 under 9000-byte hosts),
which TCP's handshake never shows; NCCL's and Gloo's sockets then hang on their first full-size send
(`payload_findings`, the check `mtu-path`).

Pure: which ports each node listens on (`planned_ports`), whom each node dials (`targets`), and the
findings from what came back (`findings`). The remote steps (checks/port_probe.py on every host,
listen then connect) are in bootstrap.cluster.preflight.run.port_reachability.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Sequence

from bootstrap.cluster.preflight.registry import Finding
from bootstrap.model import NATIVE_COORD_PORT, NATIVE_MASTER_PORT, Host, Inventory, kv_events_on

if TYPE_CHECKING:
    from bootstrap.cluster.facts import HostFacts

#: The check's name (`up --skip-check ports`).
CHECK = "ports"
#: Seconds one connection may take before it counts as dropped.
CONNECT_TIMEOUT = 2.0
#: Seconds a listener waits for its peers at most (the connect step takes CONNECT_TIMEOUT + SSH).
LISTEN_SECONDS = 15.0
#: The payload check's name (`up --skip-check mtu-path`).
PATH_CHECK = "mtu-path"
#: The datagram every path carries: it tells a path that drops large frames from one that drops UDP.
SMALL = 64
#: Of the MTU, what the IP and UDP headers take (IPv4, IPv6): the datagram's payload is the rest.
HEADERS = {4: 28, 6: 48}
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


def data_mtus(hosts: Sequence[Host], facts: Mapping[str, "HostFacts"]) -> dict[str, int]:
    """host -> the MTU of the interface holding its data-plane IP, where the facts tell."""
    out = {}
    for h in hosts:
        rack = (f := facts.get(h.name)) is not None and f.rack
        holder = next((i for i, a in rack.addrs if a == h.ip), None) if rack else None
        mtu = next((lk.mtu for lk in rack.links if lk.name == holder), None) if holder else None
        if mtu:
            out[h.name] = mtu
    return out


def _payload(ip: str, mtu: int) -> int:
    return mtu - HEADERS[6 if ":" in ip else 4]


def payload_targets(hosts: Sequence[Host], udp: Mapping[str, int], mtus: Mapping[str, int]) -> dict[str, list[str]]:
    """source host -> its payload targets (udp/SIZE/IP:PORT): to every other node whose listener has a UDP
    port, a SMALL datagram and one filling the smaller of the two data-plane MTUs (where both are known)."""
    out: dict[str, list[str]] = {}
    for src in hosts:
        mine = []
        for dst in (d for d in hosts if d.name != src.name and udp.get(d.name)):
            at = _hostport(dst.ip, int(udp[dst.name]))
            mine.append(f"udp/{SMALL}/{at}")
            if src.name in mtus and dst.name in mtus:
                mine.append(f"udp/{_payload(dst.ip, min(mtus[src.name], mtus[dst.name]))}/{at}")
        out[src.name] = mine
    return out


def payload_findings(hosts: Sequence[Host], dialled: Mapping[str, Sequence[Mapping[str, object]]]
                     ) -> list[Finding]:
    """A finding per node that full-size datagrams from other nodes never reach while small ones do (named
    on the receiving node, with the senders). A path that carries neither drops UDP, not frames of a size:
    not this check's business (NCCL and Gloo use TCP, which the ports check tests)."""
    by_ip = {h.ip: h.name for h in hosts}
    got: dict[tuple[str, str], dict[int, bool]] = {}
    for src, results in dialled.items():
        for r in results:
            target = str(r.get("target"))
            if not target.startswith("udp/"):
                continue
            _, size, hostport = target.split("/", 2)
            dst = by_ip.get(hostport.rpartition(":")[0].strip("[]"))
            if dst is not None and size.isdigit():
                got.setdefault((src, dst), {})[int(size)] = bool(r.get("ok"))
    lost: dict[str, list[tuple[str, int]]] = {}
    for (src, dst), sizes in got.items():
        big = max(sizes)
        if big > SMALL and sizes.get(SMALL) and not sizes[big]:
            ip = next(h.ip for h in hosts if h.name == dst)
            lost.setdefault(dst, []).append((src, big + HEADERS[6 if ":" in ip else 4]))
    out = []
    for h in hosts:
        if h.name not in lost:
            continue
        srcs = lost[h.name]
        mtu = max(m for _, m in srcs)
        out.append(Finding(
            PATH_CHECK, h.name,
            f"a {mtu}-byte packet (the data-plane MTU) from {', '.join(s for s, _ in srcs)} never arrives while a "
            f"small one does: the path drops frames of that size (a switch port or VLAN below the hosts' MTU), "
            "so NCCL's and Gloo's sockets would connect and then hang on their first full-size send",
            f"give every switch port between the nodes an MTU of at least {mtu} (plus headers), or set the "
            f"nodes' data-plane MTU to what the path carries (`ip link set DEV mtu 1500` on each node, and "
            "where the distribution keeps it)"))
    return out
