"""docs/security.md's "what the fence admits", made from the code for docs/hooks.py (pure).

The fence's port table (guard/fence.py) and the bound on cluster.fence_allow (guard/allow.py), apart
from both so that neither imports the other back."""
from __future__ import annotations

from bootstrap.cluster.guard.allow import bound_text
from bootstrap.cluster.guard.fence import DEFAULT_EPHEMERAL, port_table
from bootstrap.model import Cluster


def markdown() -> str:
    """docs/security.md's "what the fence admits" (docs/hooks.py puts it in place of
    `<!-- generated: fence -->`), from the code: who is admitted, the rules of cluster.fence_allow
    and its bound, the ports closed with the defaults (fence.port_table) and what stays open."""
    def span(lo: int, hi: int) -> str:
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    rows = [f"| {what.removeprefix('in ')} | {span(lo, hi)} |" for lo, hi, what in port_table(Cluster())]
    return "\n".join([
        "It admits new connections to the cluster's ports only from",
        "",
        "- a member: any host of the inventory (data-plane IP and SSH address; in a fleet, every replica's hosts),",
        "- this machine, as each host sees our SSH session (`SSH_CLIENT`; a jump host's address when you go "
        "through one),",
        "- loopback, or an address or network in `cluster.fence_allow`.",
        "",
        f"`cluster.fence_allow` is bounded: its entries together, per IP version after collapsing, admit at most "
        f"{bound_text(4)} and {bound_text(6)}; more is refused (exit 2), naming the entry that crosses the bound. "
        "10.0.0.0/8, the widest private block, is as wide as an operators' or a site's network gets, and a /32 "
        "is the smallest allocation a regional registry makes to an ISP (a site has a /48): two /1 halves "
        "(0.0.0.0/0 in the set) or 2000::/3 (the IPv6 Internet) would be no fence. An IPv6 entry inside a prefix "
        "where IPv4 hosts appear translated or tunnelled (NAT64's 64:ff9b::/96 and 64:ff9b:1::/48, Teredo's "
        "2001::/32, 6to4's 2002::/16) counts against IPv4's bound too, as the IPv4 addresses it stands for: "
        "64:ff9b::/96 is the whole IPv4 Internet. An entry that would not admit "
        "what it says is refused too: host bits set (`10.0.0.1/8`: did you mean 10.0.0.0/8 or 10.0.0.1/32?), "
        "IPv4-mapped IPv6 (`::ffff:10.0.0.1`: IPv4 packets never match the IPv6 set), a zone id "
        "(`fe80::1%eth0`: a set holds addresses, not interfaces), multicast, reserved (240.0.0.0/4) or the "
        "unspecified address, 0.0.0.0/8 or IPv4-compatible IPv6 (`::10.0.0.1`; no connection comes from one), "
        "loopback (admitted already).",
        "",
        "The ports it closes on every host, with the default settings (the inventory refuses an SSH port among "
        "them), and the host's ephemeral range (`net.ipv4.ip_local_port_range`, where every port opened without "
        f"a number lands; the kernel's default {span(*DEFAULT_EPHEMERAL)}):",
        "",
        "| Port | Default |",
        "|---|---|",
        *rows,
        "",
        "Never fenced: the port sshd took bootstrap's session on, as the host reports it (`SSH_CLIENT`; behind "
        "a NAT port forward the inventory's port is the NAT's, and on the host that number stays fenced; only "
        "where the host does not say, the inventory's port), and the served endpoint (the head's "
        "`ports.vllm`; in a fleet, the router's port on the router hosts).",
    ])
