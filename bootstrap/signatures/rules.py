"""Pure rules over what doctor and check-nccl gathered: a container's args, the network picture across
nodes, free disk. No I/O."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from bootstrap import signatures as D


@dataclass(frozen=True)
class NodeNet:
    host: str
    ip: str
    container: str  # running / exited / absent
    vllm_host_ip: str | None
    ray_node_ip: str | None  # the --node-ip-address the node's `ray start` was given
    interfaces: tuple[D.Interface, ...]
    socket_env: tuple[tuple[str, str], ...]


def ray_ip_from_args(args: Sequence[str]) -> str | None:
    for a in args:
        if a.startswith("--node-ip-address="):
            return a.split("=", 1)[1]
    return None


def network_findings(nets: Sequence[NodeNet]) -> list[D.Finding]:
    reports = [D.HostReport(host=n.host, ip=n.ip, vllm_host_ip=n.vllm_host_ip, ray_node_ip=n.ray_node_ip,
                            interfaces=n.interfaces, socket_env=n.socket_env) for n in nets]
    return D.check_cluster(reports)


def parse_df_avail(out: str) -> int | None:
    lines = out.strip().splitlines()
    if len(lines) < 2:
        return None
    parts = lines[-1].split()
    return int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else None
