"""Consistency checks across nodes: per-host values gathered by the caller (`HostReport`) in, findings
out. GPU counts, models and drivers, clocks, free disk, VLLM_HOST_IP against Ray's node IP,
*_SOCKET_IFNAME against the host's interfaces. Pure."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from bootstrap.cluster.facts import parse_ip_addrs
from bootstrap.cluster.preflight.rules import select_interfaces
from bootstrap.signatures.engine import Finding, sort_findings
from bootstrap.signatures.engine import one_line as _one_line

GIB = 1024 ** 3
#: The *_SOCKET_IFNAME variables `check_cluster` validates against a host's interfaces.
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


@dataclass(frozen=True)
class Interface:
    name: str
    #: Addresses without prefix length, IPv4 and IPv6 ("10.0.0.5", "fe80::1").
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostReport:
    """What the caller gathered on one host. None / empty: not known, the check is skipped."""

    host: str
    gpu_count: int | None = None
    gpu_names: tuple[str, ...] = ()
    driver_version: str | None = None
    #: The host's clock (Unix epoch seconds), sampled by the caller at (nearly) the same moment on every
    #: host; correct for SSH latency before passing it.
    clock_epoch: float | None = None
    #: Free bytes on the filesystem holding Docker's data root.
    disk_free_bytes: int | None = None
    #: The data-plane IP from the inventory.
    ip: str | None = None
    #: VLLM_HOST_IP as the node container has it.
    vllm_host_ip: str | None = None
    #: The IP Ray registered for this node (`ray list nodes` / `ray status`).
    ray_node_ip: str | None = None
    #: The host's interfaces (see `parse_ip_addr`); with --network host the container sees the same.
    interfaces: tuple[Interface, ...] = ()
    #: *_SOCKET_IFNAME variables as the node container gets them, e.g. (("NCCL_SOCKET_IFNAME", "eth1"),).
    socket_env: tuple[tuple[str, str], ...] = ()

    @property
    def node_ip(self) -> str | None:
        return self.ip or self.ray_node_ip or self.vllm_host_ip


def parse_ip_addr(text: str) -> tuple[Interface, ...]:
    """Interfaces and their addresses from `ip -o addr show` output (read by facts.parse_ip_addrs)."""
    addrs: dict[str, list[str]] = {}
    for name, addr in parse_ip_addrs(text):
        if name:
            addrs.setdefault(name, []).append(addr)
    return tuple(Interface(n, tuple(a)) for n, a in addrs.items())


def _select_interfaces(var: str, value: str, ifaces: Sequence[Interface]) -> list[Interface] | None:
    """The interfaces with an address that `value` selects (bootstrap.cluster.preflight.rules.select_interfaces:
    the variables' syntax); None when the value is not valid syntax for `var`."""
    usable = [i for i in ifaces if i.addresses]
    names = select_interfaces(var, value, [i.name for i in usable])
    return None if names is None else [i for i in usable if i.name in names]


def _describe(ifaces: Sequence[Interface]) -> str:
    def v4(i: Interface) -> str:
        four = [a for a in i.addresses if ":" not in a]
        return f"{i.name} ({', '.join(four)})" if four else i.name
    return ", ".join(v4(i) for i in ifaces) or "none"


def _check_ifnames(r: HostReport) -> list[Finding]:
    if not r.interfaces:
        return []
    out: list[Finding] = []
    ip = r.node_ip
    holder = next((i for i in r.interfaces if ip and ip in i.addresses), None)
    env = dict(r.socket_env)
    for var in SOCKET_IFNAME_VARS:
        value = env.get(var)
        if not value:
            continue
        propose = (f"Set {var}={holder.name} for {r.host} (the interface holding {ip}) in the "
                   "inventory's per-host env." if holder else
                   f"Set {var} for {r.host} to an interface listed by `ip -o -4 addr` on the host.")
        chosen = _select_interfaces(var, value, r.interfaces)
        if chosen is None:
            out.append(Finding(
                "socket-ifname-missing", "error", r.host,
                f"{var} uses NCCL's ^/= syntax, which Gloo and TensorPipe do not understand",
                _one_line(f"{var}={value}; interfaces: {_describe(r.interfaces)}"),
                propose + f" {var} takes plain interface names."))
        elif not chosen:
            out.append(Finding(
                "socket-ifname-missing", "error", r.host,
                f"{var} names an interface that does not exist on {r.host}",
                _one_line(f"{var}={value} matches no interface; interfaces: {_describe(r.interfaces)}"),
                propose))
        elif ip and not any(ip in i.addresses for i in chosen):
            out.append(Finding(
                "socket-ifname-wrong-ip", "warning", r.host,
                f"{var} selects an interface that does not hold the node's IP {ip}, so peers may not "
                "reach it",
                _one_line(f"{var}={value} selects {_describe(chosen)}, not the interface holding {ip}"),
                propose))
    return out


def _odd_ones(values: Mapping[str, object]) -> tuple[object | None, list[str]]:
    """(the majority value, hosts that differ from it); (None, all hosts) when there is no majority."""
    counts = Counter(values.values()).most_common()
    if len(counts) <= 1:
        return (counts[0][0] if counts else None), []
    if counts[0][1] == counts[1][1]:
        return None, list(values)
    return counts[0][0], [h for h, v in values.items() if v != counts[0][0]]


def _differs(id: str, severity: str, title: str, fix: str, values: Mapping[str, object],
             show: Callable[[object], str]) -> list[Finding]:
    majority, odd = _odd_ones(values)
    if not odd:
        return []
    everyone = "; ".join(f"{h}: {show(v)}" for h, v in values.items())
    if majority is None:
        return [Finding(id, severity, None, title, _one_line(everyone), fix)]
    return [Finding(id, severity, h, title,
                    _one_line(f"{h}: {show(values[h])}; the other nodes: {show(majority)}"), fix)
            for h in odd]


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_cluster(reports: Sequence[HostReport], *, image_size_bytes: int | None = None,
                  max_skew_s: float = 1.0) -> list[Finding]:
    """Cross-node and per-node consistency findings, ordered by severity then host.

    Clock offsets are measured against the first report that has a clock (put the head first).
    Disk needs image_size_bytes x 1.2 + 10 GiB free, or 20 GiB when the image size is not known.
    """
    out: list[Finding] = []

    counts = {r.host: r.gpu_count for r in reports if r.gpu_count is not None}
    for host, n in counts.items():
        if n == 0:
            out.append(Finding(
                "gpu-not-visible", "error", host, f"{host} reports no GPU",
                _one_line(f"{host}: 0 GPUs (nvidia-smi)"),
                "Check the NVIDIA driver (`nvidia-smi` on the host) and that the node belongs in a GPU "
                "cluster; remove it from the inventory or set accelerator: none for CPU-only clusters."))
    out += _differs(
        "gpu-count-mismatch", "warning",
        "Nodes have different GPU counts; vLLM spreads tensor/pipeline ranks evenly, so the extra GPUs "
        "sit idle or the layout does not fit",
        "Give every node the same number of GPUs (CUDA_VISIBLE_DEVICES / `--gpus '\"device=0,1\"'`), and "
        "set the inventory's per-host gpus to match; tensor_parallel_size is usually the per-node count.",
        {h: n for h, n in counts.items() if n}, lambda n: f"{n} GPUs")
    out += _differs(
        "gpu-model-mismatch", "warning",
        "Nodes have different GPU models; the slowest GPU sets the pace and memory limits",
        "Use nodes with the same GPU model, or accept that throughput follows the slowest node.",
        {r.host: tuple(sorted(set(r.gpu_names))) for r in reports if r.gpu_names},
        lambda names: " + ".join(names))
    out += _differs(
        "driver-mismatch", "warning",
        "Nodes run different NVIDIA driver versions",
        "Install the same NVIDIA driver version on every node (`nvidia-smi` shows it) so the image's "
        "CUDA and NCCL behave the same everywhere.",
        {r.host: r.driver_version for r in reports if r.driver_version}, lambda v: f"driver {v}")

    clocked = [r for r in reports if r.clock_epoch is not None]
    if clocked:
        ref = clocked[0]
        for r in clocked[1:]:
            offset = r.clock_epoch - ref.clock_epoch
            if abs(offset) > max_skew_s:
                out.append(Finding(
                    "clock-skew", "warning", r.host,
                    f"{r.host}'s clock is {abs(offset):.2f} s {'ahead of' if offset > 0 else 'behind'} "
                    f"{ref.host}'s",
                    _one_line(f"{r.host} is {offset:+.2f} s from {ref.host} (allowed ±{max_skew_s:g} s)"),
                    "Enable time sync on every node (`timedatectl set-ntp true`, or chrony: `chronyc "
                    "tracking`); skewed clocks break log correlation, timeouts and TLS/token checks."))

    need = image_size_bytes * 1.2 + 10 * GIB if image_size_bytes else 20 * GIB
    basis = (f"image {_gib(image_size_bytes)} x 1.2 + 10 GiB" if image_size_bytes
             else "20 GiB, image size unknown")
    for r in reports:
        if r.disk_free_bytes is not None and r.disk_free_bytes < need:
            out.append(Finding(
                "disk-low", "error", r.host,
                f"{r.host} has too little free disk for the image",
                _one_line(f"{r.host}: {_gib(r.disk_free_bytes)} free, needs {_gib(need)} ({basis})"),
                "Free space under Docker's data root (`docker image prune -a`, `docker system df`) or "
                "move data-root in /etc/docker/daemon.json to a larger disk."))

    for r in reports:
        if r.vllm_host_ip and r.ray_node_ip and r.vllm_host_ip != r.ray_node_ip:
            out.append(Finding(
                "ray-ip-mismatch", "error", r.host,
                "VLLM_HOST_IP differs from the IP Ray registered for this node, so vLLM's placement "
                "group can never be satisfied",
                _one_line(f"{r.host}: VLLM_HOST_IP={r.vllm_host_ip}, Ray node IP={r.ray_node_ip}"),
                f"Use one IP for both on {r.host}: `ray start --node-ip-address={r.ray_node_ip}` and "
                f"VLLM_HOST_IP={r.ray_node_ip} (or both set to the inventory's data-plane IP)."))

    for r in reports:
        out += _check_ifnames(r)
    return sort_findings(out)
