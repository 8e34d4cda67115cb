"""Rack-shaped links for the sandbox: Linux traffic control (tc) on the registry's and the nodes' interfaces.

Every figure taken on the plain sandbox is limited only by this machine's cores: its registry is on
the same kernel as its nodes, so a pull costs no network. On a rack what decides a cold start is a
registry (or NFS) uplink much thinner than the node-to-node fabric. `sandbox up --registry-link
100mbit --node-link 1gbit` gives the sandbox that shape (the 1:10 of a 10 Gbit/s registry and a
100 Gbit/s fabric, scaled down so the CPU is not the limit):

- the registry's interface sends at most the registry rate, shared by every node that pulls;
- each node's interface sends at most the node rate (what a peer copy or a model copy sends).

What is shaped is what a container *sends* (a token bucket filter, `tbf`, as the root qdisc of its
interface inside its own network namespace): a node receiving from two peers at once can receive
twice the node rate. tc runs in a throw-away container of the node image that joins the shaped
container's network namespace with only NET_ADMIN, so the registry and sshd-only nodes (which have
no capabilities of their own) are shaped the same way. A node container that restarts gets a new
interface, unshaped: `sandbox up` with the same options shapes it again.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: "100mbit", "1gbit", "2.5gbit", "800kbit": tc's own units (bits per second), as `tc` writes them
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)\s*$", re.IGNORECASE)
_UNIT = {"kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
#: the slowest and fastest link the sandbox takes (below, a pull of the image would take hours; above,
#: the CPU is the limit on any machine this runs on)
MIN_BITS = 1_000_000
MAX_BITS = 100_000_000_000
#: the longest a packet waits in the bucket's queue before it is dropped (TCP then backs off)
LATENCY = "50ms"


@dataclass(frozen=True)
class LinkShape:
    """Send rates in bits per second; None: that side unshaped."""

    registry_bits: int | None = None
    node_bits: int | None = None

    @property
    def shaped(self) -> bool:
        return self.registry_bits is not None or self.node_bits is not None

    def describe(self) -> str:
        if not self.shaped:
            return "links unshaped"
        return (f"registry link {human_rate(self.registry_bits) if self.registry_bits else 'unshaped'}, "
                f"node links {human_rate(self.node_bits) if self.node_bits else 'unshaped'}")

    def to_dict(self) -> dict:
        return {"registry_bits": self.registry_bits, "node_bits": self.node_bits}

    @classmethod
    def from_dict(cls, data: dict | None) -> "LinkShape":
        data = data or {}
        return cls(registry_bits=data.get("registry_bits"), node_bits=data.get("node_bits"))


NO_LINKS = LinkShape()


def parse_rate(text: str, what: str) -> int:
    """tc's rate syntax ("100mbit", "1gbit") in bits per second; ValueError naming ``what`` otherwise."""
    m = _RATE.match(text or "")
    if not m:
        raise ValueError(f"{what}: {text!r} is not a rate: write it as tc does, e.g. 100mbit or 1gbit")
    bits = int(float(m.group(1)) * _UNIT[m.group(2).lower()])
    if not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"{what}: {text!r} is outside {human_rate(MIN_BITS)}..{human_rate(MAX_BITS)}")
    return bits


def human_rate(bits: int) -> str:
    for unit, size in (("gbit", 1_000_000_000), ("mbit", 1_000_000), ("kbit", 1_000)):
        if bits >= size:
            return f"{bits / size:g}{unit}"
    return f"{bits}bit"


def burst_bytes(bits: int) -> int:
    """The bucket: 10 ms of the rate, at least 256 KiB (a bucket smaller than rate/HZ or than one
    64 KiB segmentation-offloaded packet cannot reach the rate)."""
    return max(bits // 8 // 100, 256 * 1024)


def shape_script(ip: str, bits: int | None) -> str:
    """sh run in the container's network namespace: find the interface that holds ``ip``, then set
    its root qdisc to a token bucket of ``bits`` per second (None: back to the default), and print
    `tc qdisc show` of it. Exits 3 when no interface holds ``ip``."""
    find = (f"dev=$(ip -o -4 addr show | awk -v ip='{ip}/' 'index($4, ip) == 1 {{print $2; exit}}'); "
            f"[ -n \"$dev\" ] || {{ echo 'no interface holds {ip}' >&2; exit 3; }}; ")
    if bits is None:
        change = 'if tc qdisc show dev "$dev" root | grep -q "^qdisc tbf "; then tc qdisc del dev "$dev" root; fi'
    else:
        change = (f'tc qdisc replace dev "$dev" root tbf rate {bits}bit burst {burst_bytes(bits)} '
                  f"latency {LATENCY}")
    return f'set -e; {find}{change}; echo "$dev: $(tc qdisc show dev "$dev" root)"'


def shaped_line_ok(line: str, bits: int | None) -> bool:
    """Whether `shape_script`'s last line shows the wanted qdisc."""
    has_tbf = " qdisc tbf " in f" {line.split(':', 1)[-1]}"
    if bits is None:
        return not has_tbf
    m = re.search(r"\brate (\d+(?:\.\d+)?)([KMG]?)bit\b", line)
    if not has_tbf or not m:
        return False
    got = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]
    return abs(got - bits) <= 0.01 * bits
