"""The ports of a cluster, pure: cluster.ports, and the rules every configured port is checked by."""
from __future__ import annotations

from typing import Any

from bootstrap.inventory.values import Validator, _check_mapping, _port
from bootstrap.inventory.yamlfile import _Loc
from bootstrap.model import Cluster, Ports

_PORT_FIELDS: dict[str, Validator] = {"ray_gcs": _port, "dashboard": _port, "vllm": _port, "ray_metrics": _port,
                                       "image_copy": _port, "kv_transfer": _port,
                                       "kv_events": _port}


#: Ports a cluster uses without a setting of their own (the one table every configured port is checked
#: against): (first, last, what holds them).
_FIXED_PORTS: tuple[tuple[int, int, str], ...] = (
    (22, 22, "the hosts' SSH port"),
    (10001, 10001, "Ray's client server"),
    (10002, 19999, "Ray's worker ports (10002-19999)"),
    (29500, 29899, "the range `serve` picks torch's rendezvous port from (29500-29899)"),
    (32768, 60999, "the hosts' ephemeral ports (Linux's default 32768-60999, net.ipv4.ip_local_port_range): any "
                   "outgoing connection may hold it when the container starts"),
)


def _fixed_port_clash(port: int) -> str | None:
    from bootstrap.model import NATIVE_COORD_PORT, NATIVE_MASTER_PORT

    if port in (NATIVE_MASTER_PORT, NATIVE_COORD_PORT):
        return "a fleet replica's torch rendezvous and coordination ports (29599-29600)"
    return next((what for lo, hi, what in _FIXED_PORTS if lo <= port <= hi), None)


def _check_fixed(port: int, loc: _Loc) -> None:
    what = _fixed_port_clash(port)
    if what is not None:
        loc.fail(f"{port} is taken by {what}: pick another port")


def _check_ssh_port(port: int, cluster: Cluster, loc: _Loc) -> None:
    """A host's SSH port (cluster.ssh.port, a host's port / ansible_port) is none of the ports the
    cluster uses on every host (bootstrap.cluster.guard.fence.port_table): Ray or a container would take
    it, and behind a NAT port forward the fence would keep that number open to the cluster's service."""
    from bootstrap.cluster.guard.fence import port_clash

    what = port_clash(cluster, port)
    if what is not None:
        loc.fail(f"{port} is {what}, a port the cluster uses on every host and the fence closes: SSH needs one of "
                 "its own; give sshd (or the forward to it) a port outside the cluster's (docs/security.md, The fence)")


def _check_unprivileged(port: int, loc: _Loc, who: str) -> None:
    """`who` runs with every capability dropped: it cannot bind a port below 1024."""
    if port < 1024:
        runs = "run" if who.endswith("containers") else "runs"
        loc.fail(f"{port} is below 1024: {who} {runs} with every capability dropped (no CAP_NET_BIND_SERVICE) and "
                 "could not listen there; pick a port of 1024 or above")


#: cluster.ports that containers without capabilities listen on (cluster/imagedist/: the image copy and the mirror).
_UNPRIVILEGED_PORTS = {"image_copy": "the image copy's and the registry mirror's containers"}


def _ports(value: Any, loc: _Loc) -> Ports:
    values, locs = _check_mapping(value, loc, _PORT_FIELDS)
    ports = Ports(**values)
    for name in values:
        _check_fixed(values[name], locs[name])
        if name in _UNPRIVILEGED_PORTS:
            _check_unprivileged(values[name], locs[name], _UNPRIVILEGED_PORTS[name])
    seen: dict[int, str] = {}
    for name in _PORT_FIELDS:
        port = getattr(ports, name)
        if port in seen:
            other = seen[port]
            blame, then = (name, other) if name in values else (other, name)
            where = f"cluster.ports.{then}" if then in values else f"the default {then} port"
            locs[blame].fail(f"{port} is also {where}; every port must be different")
        seen[port] = name
    return ports
