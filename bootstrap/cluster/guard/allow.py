"""What `cluster.fence_allow` may admit through the fence (pure; no I/O).

An entry is an address or a network (CIDR) the fence admits like a member (bootstrap.cluster.guard.fence
puts it in the nft set `members4`/`members6`, or an iptables `-s ... -j RETURN`). An entry that would
not admit what it says is refused (`entry_problem`): host bits set (10.0.0.1/8 would widen to
10.0.0.0/8 unseen), an IPv4-mapped IPv6 address (::ffff:10.0.0.1: the IPv6 set never matches an IPv4
packet), a zone id (fe80::1%eth0: a set holds addresses, not interfaces, so it would admit fe80::1
from every link), a multicast, reserved or unspecified address (no connection comes from one), or
loopback (admitted already). And the entries together are bounded per family, after collapsing
(`union_problem`): two /1 halves are 0.0.0.0/0 in the set, and 2000::/3 is the IPv6 Internet.

The bound: IPv4 at most 2^24 addresses in all (a /8: 10.0.0.0/8, the widest private block, is as
wide as an operators' or a site's network gets); IPv6 at most 2^96 (a /32: the smallest allocation a
regional registry makes to an ISP; a site has a /48, a LAN a /64). Wider than that names several
organisations' networks, and a fence that admits them is no fence (cluster.fence: false says so).
"""
from __future__ import annotations

import ipaddress
from typing import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The widest prefix the entries of cluster.fence_allow may add up to, per IP version.
BOUND_PREFIX = {4: 8, 6: 32}
#: The same as a number of addresses.
BOUND = {v: 2 ** ((32 if v == 4 else 128) - p) for v, p in BOUND_PREFIX.items()}

_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_RESERVED_V4 = ipaddress.ip_network("240.0.0.0/4")  # with 255.255.255.255, the broadcast address
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # "this host on this network" (RFC 1122): never a source
_COMPATIBLE = ipaddress.ip_network("::/96")  # IPv4-compatible IPv6 (deprecated, RFC 4291): no stack sends from it

#: IPv6 prefixes whose addresses stand for IPv4 hosts: a fenced host that receives from them receives
#: from the IPv4 Internet translated (NAT64/SIIT, RFC 6052/8215: the IPv4 address in the last 32
#: bits) or tunnelled (Teredo, RFC 4380: the client's IPv4 address in the last 32 bits, inverted;
#: 6to4, RFC 3056: the site's IPv4 address in bits 16-47). An entry inside one is counted, as the
#: IPv4 addresses it stands for, against IPv4's bound too.
TRANSLATED = (
    (ipaddress.ip_network("64:ff9b::/96"), "NAT64's well-known prefix, where IPv4 hosts appear translated", "low"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "NAT64's local-use prefix, where IPv4 hosts appear translated", "low"),
    (ipaddress.ip_network("2001::/32"), "Teredo's prefix, where IPv4 hosts appear tunnelled", "inverted"),
    (ipaddress.ip_network("2002::/16"), "6to4's prefix, where IPv4 sites appear tunnelled", "6to4"),
)

#: Address space that is not public (bootstrap.exposure.is_public): private, CGNAT, loopback,
#: link-local, ULA, documentation, benchmarking, reserved, multicast (IANA's special-purpose registries).
NOT_PUBLIC = {
    4: tuple(ipaddress.ip_network(n) for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/29", "192.0.0.170/31", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4")),
    6: tuple(ipaddress.ip_network(n) for n in (
        "::/128", "::1/128", "::ffff:0:0/96", "100::/64", "2001::/23", "2001:db8::/32", "fc00::/7",
        "fe80::/10", "ff00::/8")),
}


def entry_problem(text: str) -> tuple[Network | None, str | None]:
    """(the network, None), or (None, what is wrong with the entry and the fix)."""
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None, f"{text!r} is not an IP address or a network such as 10.0.0.0/24"
    addr, slash, plen = text.partition("/")
    if "%" in addr:
        bare = addr.split("%", 1)[0]
        given = bare if net.num_addresses == 1 else str(ipaddress.ip_network(bare + slash + plen, strict=False))
        return None, (f"{text} has a zone id (%{addr.split('%', 1)[1]}): the fence matches addresses, not "
                      f"interfaces, and would admit {given} from every link; give {given}")
    if net.prefixlen == 0:
        return None, f"{text} admits every address: that is no fence (set cluster.fence: false instead)"
    try:
        ipaddress.ip_network(text)
    except ValueError:
        return None, f"{text} has host bits set: did you mean {net} or {addr}/{net.max_prefixlen}?"
    if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(_MAPPED):
        v4 = ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
        shown = v4.network_address if v4.num_addresses == 1 else v4
        fix = (f"give {shown}" if v4.num_addresses <= BOUND[4] and _admits_nobody(v4) is None else
               f"its IPv4 form, {shown}, would not do either: give the IPv4 networks that need the cluster's ports")
        return None, (f"{text} is an IPv4-mapped IPv6 address: IPv4 packets never match the fence's IPv6 set, "
                      f"so it admits nobody; {fix}")
    why = _admits_nobody(net)
    if why:
        return None, why
    return net, None


def _admits_nobody(net: Network) -> str | None:
    text = str(net.network_address) if net.num_addresses == 1 else str(net)
    if net.num_addresses == 1 and net.network_address.is_unspecified:
        return f"{text} is the unspecified address: no connection comes from it; give the address of a host to admit"
    if net.is_multicast:
        return f"{text} is multicast: no connection comes from a multicast address; give a unicast address or network"
    if isinstance(net, ipaddress.IPv4Network) and net.subnet_of(_RESERVED_V4):
        return (f"{text} is reserved (240.0.0.0/4, the broadcast address with it): no connection comes from it; "
                "give a unicast address or network")
    if net.is_loopback:
        return f"{text} is loopback: the fence admits loopback already and no other host sends from it; remove it"
    if isinstance(net, ipaddress.IPv4Network) and net.subnet_of(_THIS_NETWORK):
        return f"{text} is \"this network\" (0.0.0.0/8): no connection comes from it; give a unicast address or network"
    if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(_COMPATIBLE):
        return (f"{text} is IPv4-compatible IPv6 (::/96, deprecated): no connection comes from it; give the IPv4 "
                "address itself")
    return None


def stands_for_v4(net: Network) -> tuple[ipaddress.IPv4Network, str] | None:
    """The IPv4 addresses an IPv6 entry inside a TRANSLATED prefix stands for, and that prefix in
    words; None for any other entry."""
    if not isinstance(net, ipaddress.IPv6Network):
        return None
    for prefix, what, form in TRANSLATED:
        if not net.subnet_of(prefix):
            continue
        bits = int(net.network_address)
        if form == "6to4":  # the IPv4 address in bits 16-47
            v4 = ipaddress.IPv4Network(((bits >> 80) & 0xFFFFFFFF, min(32, max(0, net.prefixlen - 16))))
        else:  # in the last 32 bits (Teredo's inverted: the set of inverted addresses is a prefix too)
            plen = max(0, net.prefixlen - 96)
            low = bits & 0xFFFFFFFF
            if form == "inverted":
                low = ~low & 0xFFFFFFFF
            v4 = ipaddress.IPv4Network((low & (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF, plen))
        return v4, what
    return None


def size(n: int) -> str:
    """A number of addresses as a power of two ("2^24", "more than 2^25")."""
    k = n.bit_length() - 1
    return f"2^{k}" if n == 1 << k else f"more than 2^{k}"


def bound_text(version: int) -> str:
    return f"{size(BOUND[version])} IPv{version} addresses (a /{BOUND_PREFIX[version]})"


def union_problem(nets: Sequence[Network]) -> tuple[int, str] | None:
    """(index, why) for the first entry with which the entries so far admit more than the bound of
    their IP version, after collapsing; None when they stay within it."""
    seen: dict[int, list[Network]] = {4: [], 6: []}
    for i, net in enumerate(nets):
        v4 = stands_for_v4(net)
        # (the entry, the version whose bound it counts against, how it is named)
        counts = [(net, net.version, str(net), "")]
        if v4:
            counts.append((v4[0], 4, f"{net} (in {v4[1]}: it stands for {v4[0]})", f"; {net} stands for {v4[0]}"))
        for one, version, named, note in counts:
            got = seen[version]
            got.append(one)
            union = list(ipaddress.collapse_addresses(got))  # type: ignore[arg-type]
            total = sum(n.num_addresses for n in union)
            if total <= BOUND[version]:
                continue
            shown = ", ".join(map(str, union[:3])) + (", ..." if len(union) > 3 else "")
            if one.num_addresses > BOUND[version]:
                what = f"{named} admits {size(one.num_addresses)} IPv{version} addresses"
            else:
                what = (f"with the entries before it, fence_allow admits {size(total)} IPv{version} addresses "
                        f"({shown}{note})")
            return i, (f"{what}, more than the fence's bound of {bound_text(version)}: that admits (nearly) "
                       "everyone; name only the networks that need the cluster's ports, or set cluster.fence: false")
    return None


def public_size(net: Network) -> int:
    """How many addresses of `net` are public (bootstrap.exposure.is_public): those outside NOT_PUBLIC;
    for an entry inside a TRANSLATED prefix, of the IPv4 addresses it stands for (Teredo's 2001::/32 is
    in 2001::/23, not public itself, yet its hosts are the IPv4 Internet's)."""
    v4 = stands_for_v4(net)
    if v4 is not None:
        return public_size(v4[0])
    inside = sum(min(net.num_addresses, n.num_addresses) for n in NOT_PUBLIC[net.version]
                 if net.overlaps(n))
    return max(0, net.num_addresses - inside)


def reaching(entries: Sequence[str], address: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the entries of cluster.fence_allow that reach a fenced socket bound to `address`, those of
    them with public address space): 0.0.0.0 and an IPv4 address take IPv4 ones, an IPv6 address
    IPv6 ones, `::`, `*` and anything else both (Linux's dual-stack default)."""
    try:
        version = {ipaddress.ip_address(address.split("%", 1)[0]).version}
    except ValueError:
        version = {4, 6}
    families = {4, 6} if address in ("::", "*", "") else version
    nets = [n for n in (ipaddress.ip_network(e, strict=False) for e in entries) if n.version in families]
    return tuple(map(str, nets)), tuple(str(n) for n in nets if public_size(n))

