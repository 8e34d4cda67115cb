"""Exposure: which listening ports of the cluster a public address would reach. Pure; no I/O.

Two services listen on the head: Ray's dashboard (`cluster.dashboard_host`, port
`cluster.ports.dashboard`) and vLLM's OpenAI API (`bootstrap serve --listen`, port
`cluster.ports.vllm`). Neither asks for credentials, so each warning here names the host, the
port, the public address that would reach it and the setting that closes it.

The host's addresses come from `facts.addresses_cmd()` / `facts.parse_addresses()`.
"""
from __future__ import annotations

import ipaddress
import shlex
from typing import Iterable, Mapping, Sequence

from bootstrap.model import Cluster, Host, Inventory

#: Where `ray start --head` binds the dashboard without --dashboard-host (Ray 2.x: localhost).
RAY_DASHBOARD_DEFAULT = "127.0.0.1"

#: Bind addresses that mean every interface (IPv4 only for 0.0.0.0; "" as uvicorn/vLLM read it).
_ALL_V4 = ("0.0.0.0",)
_ALL_ANY = ("::", "")

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def dashboard_address(cluster: Cluster, head: Host) -> str:
    """The address `cluster.dashboard_host` names, for `ray start --head --dashboard-host=`."""
    value = cluster.dashboard_host
    if value == "localhost":
        return RAY_DASHBOARD_DEFAULT
    if value == "data-plane":
        return head.ip
    if value == "all":
        return "0.0.0.0"
    return value


def ray_args_dashboard_host(ray_args: Sequence[str]) -> str | None:
    """The last --dashboard-host in ray_args (``--dashboard-host=X`` or ``--dashboard-host X``)."""
    found = None
    for i, arg in enumerate(ray_args):
        if arg.startswith("--dashboard-host="):
            found = arg.split("=", 1)[1]
        elif arg == "--dashboard-host" and i + 1 < len(ray_args):
            found = ray_args[i + 1]
    return found


def dashboard_bind(inv: Inventory) -> str | None:
    """Where the head's dashboard will listen (None: runtime none, no Ray, no dashboard).

    A --dashboard-host in cluster.ray_args comes after bootstrap's own on the command line, so it
    wins (the inventory refuses both at once).
    """
    c = inv.cluster
    if c.runtime != "ray":
        return None
    return ray_args_dashboard_host(c.ray_args) or dashboard_address(c, inv.head)


def _ip(text: str) -> _IP | None:
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_public(text: str) -> bool:
    """A global unicast address: not private (RFC 1918), CGNAT (100.64/10), loopback,
    link-local, ULA (fc00::/7), documentation, reserved or multicast. Not an IP: False."""
    ip = _ip(text)
    if ip is None or ip.is_multicast:
        return False
    if isinstance(ip, ipaddress.IPv4Address) and ip in ipaddress.ip_network("100.64.0.0/10"):
        return False
    return ip.is_global


def public_addresses(addrs: Iterable[str]) -> tuple[str, ...]:
    """The public addresses among addrs, normalised, in their order, each once."""
    out: list[str] = []
    for a in addrs:
        ip = _ip(a)
        if ip is not None and is_public(a) and str(ip) not in out:
            out.append(str(ip))
    return tuple(out)


def _reachable(bind: str, addrs: Sequence[str]) -> tuple[str, ...]:
    """The public addresses a socket bound to `bind` answers on (0.0.0.0: the IPv4 ones; ::,
    dual-stack: all of them; one address: itself when it is public)."""
    if bind in _ALL_V4 or bind in _ALL_ANY:
        pub = public_addresses(addrs)
        if bind in _ALL_V4:
            pub = tuple(a for a in pub if ":" not in a)
        return pub
    ip = _ip(bind)
    if ip is not None and is_public(bind):
        return (str(ip),)
    return ()


def _plural(addrs: Sequence[str]) -> str:
    return ("public address " if len(addrs) == 1 else "public addresses ") + ", ".join(addrs)


def ssh_tunnel_argv(h: Host, ip: str, port: int) -> list[str]:
    """The `ssh -L` that opens a service on `h` listening on ip:port at this machine's localhost:port,
    with the inventory's SSH port, jump host and key (an IPv6 address in brackets, as ssh reads it)."""
    who = f"{h.ssh.user}@{h.ssh.address}" if h.ssh.user else h.ssh.address
    target = f"[{ip}]" if ":" in ip else ip
    argv = ["ssh", "-L", f"{port}:{target}:{port}"]
    if h.ssh.port and h.ssh.port != 22:
        argv += ["-p", str(h.ssh.port)]
    if h.ssh.jump:
        argv += ["-J", h.ssh.jump]
    if h.ssh.key:
        argv += ["-i", h.ssh.key]
    return [*argv, who]


def _warning(host: str, what: str, bind: str, pub: Sequence[str], fix_all: str, fix_ip: str) -> str:
    if bind in _ALL_V4 or bind in _ALL_ANY:
        return f"{host}: {what} would listen on all interfaces and the host has {_plural(pub)} -- {fix_all}"
    return f"{host}: {what} would listen on {_plural(pub)} -- {fix_ip}"


def warnings(inv: Inventory, addrs_by_host: Mapping[str, Sequence[str]], *,
             vllm_listen: str | None = None) -> list[str]:
    """One line per service on the head that a public address would reach.

    addrs_by_host: host name -> its addresses (facts.parse_addresses); with the head missing
    here, only a bind to a public address itself is reported. vllm_listen: the address
    `vllm serve` binds (serve's --listen, else the head's ip); None: vLLM is not checked (`up`).
    """
    head = inv.head
    addrs = addrs_by_host.get(head.name, ())
    out: list[str] = []
    c = inv.cluster
    bind = dashboard_bind(inv)
    if bind is not None:
        pub = _reachable(bind, addrs)
        if pub:
            from_args = ray_args_dashboard_host(c.ray_args) is not None
            fix_all = ("replace --dashboard-host in cluster.ray_args with cluster.dashboard_host: data-plane"
                       if from_args else "set cluster.dashboard_host: data-plane")
            tunnel = shlex.join(ssh_tunnel_argv(head, "127.0.0.1", c.ports.dashboard))
            fix_ip = f"set cluster.dashboard_host: localhost (reach it with {tunnel}), or firewall the port"
            out.append(_warning(head.name, f"the Ray dashboard (port {c.ports.dashboard})", bind, pub,
                                fix_all, fix_ip))
    if vllm_listen is not None:
        pub = _reachable(vllm_listen, addrs)
        if pub:
            fix_all = f"pass --listen {head.ip} (the head's data-plane IP, the default)"
            fix_ip = f"serve on a private address (--listen), or firewall port {c.ports.vllm}"
            out.append(_warning(head.name, f"the vLLM API (port {c.ports.vllm})", vllm_listen, pub,
                                fix_all, fix_ip))
    return out


def monitor_warnings(inv: Inventory, addrs_by_host: Mapping[str, Sequence[str]],
                     prometheus_host: str) -> list[str]:
    """`bootstrap monitor`: Prometheus and the node exporters listen on their host's data-plane
    IP (a warning when that IP is public); Ray's metrics agent listens on every interface whatever
    bootstrap asks (a warning when the host has a public address)."""
    c = inv.cluster
    out: list[str] = []
    for h in inv.hosts:
        addrs = addrs_by_host.get(h.name, ())
        services = [(f"the node exporter (port {c.monitor.node_exporter_port})", h.ip)]
        if h.name == prometheus_host:
            services.append((f"Prometheus (port {c.monitor.port})", h.ip))
        for what, bind in services:
            pub = _reachable(bind, addrs)
            if pub:
                out.append(_warning(h.name, what, bind, pub, "",
                                    "give the host a private data-plane ip in the inventory, or firewall the port"))
        if c.runtime == "ray":
            pub = _reachable("0.0.0.0", addrs)
            if pub:
                out.append(_warning(h.name, f"Ray's metrics export (port {c.ports.ray_metrics}, Ray binds every "
                                    "interface)", "0.0.0.0", pub, f"firewall port {c.ports.ray_metrics}", ""))
    return out
