"""The validators of where hosts are, pure: host addresses, jump hosts, IPs, networks, bind addresses."""
from __future__ import annotations

import ipaddress
import re
from typing import Any

from bootstrap.inventory.values import _USER_RX, _list, _string
from bootstrap.inventory.yamlfile import _Loc, _quote

_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def _address(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    if _parse_ip(value, loc) is not None:
        return value  # unspecified, broadcast and multicast: in _identities, after the ip
    if "@" in value:
        loc.fail(f"{_quote(value)} is not a host: give the user in 'user', not in the address")
    if ":" in value:
        loc.fail(f"{_quote(value)} is not a host: give the port in 'port', not in the address")
    if not _HOSTNAME.fullmatch(value):
        loc.fail(f"{_quote(value)} is not a host name, an IP address or an ssh config alias")
    return value


def _jump(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    m = re.fullmatch(r"(?:([^@\s]+)@)?(\[[0-9A-Za-z:.%_]+\]|[^:@\s\[\]]+)(?::([0-9]+))?", value)
    ok = bool(m)
    if m:
        user, host, port = m.groups()
        ok = (user is None or re.fullmatch(_USER_RX, user) is not None) and (
            (host.startswith("[") and _parse_ip(host[1:-1], loc) is not None)
            or _HOSTNAME.fullmatch(host) is not None
            or _parse_ip(host, loc) is not None
        )
        ok = ok and (port is None or (len(port) <= 5 and 1 <= int(port) <= 65535))
    if not ok:
        loc.fail(f"{_quote(value)} is not a jump host: expected [user@]host[:port]")
    return value


_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
#: An IPv6 zone (the part after '%' in fe80::1%eth0) is an interface name (IFNAMSIZ - 1 long).
_ZONE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def _parse_ip(text: str, loc: _Loc | None = None) -> _IP | None:
    """The IP address `text` is, else None. Python takes anything after '%' as an IPv6 zone, and
    it would reach ssh and docker command lines as it is: it must be an interface name (with loc,
    another zone is an error there; without, the text is not an address)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    zone = getattr(ip, "scope_id", None)
    if zone is not None and not _ZONE.fullmatch(zone):
        if loc is not None:
            loc.fail(
                f"{_quote(text)} has the zone {_quote(zone)}: after '%' comes an interface name"
                " (letters, digits, '_', '.', ':', '-'; at most 15)"
            )
        return None
    return ip


def _canonical_ip(ip: _IP) -> _IP:
    """The address to compare: an IPv4-mapped IPv6 address (::ffff:10.0.0.1) is the IPv4 one."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _not_one_host(ip: _IP) -> str | None:
    """Why `ip` cannot be the address of one host (it is every host's or a group's), or None."""
    plain = _canonical_ip(ip)
    if plain.is_unspecified:
        return "the unspecified address"
    if plain == _BROADCAST:
        return "the broadcast address"
    if plain.is_multicast:
        return "a multicast address"
    return None


def _ip(value: Any, loc: _Loc) -> str:
    """A host's data-plane IP, canonical: compressed IPv6, IPv4 for an IPv4-mapped address."""
    value = _string(value, loc)
    ip = _parse_ip(value, loc)
    if ip is None:
        loc.fail(f"{_quote(value)} is not an IPv4 or IPv6 address")
    plain = _canonical_ip(ip)
    if plain.is_loopback:
        loc.fail(
            f"{value} is a loopback address: Ray and NCCL would advertise it to the other nodes;"
            " give the address the other nodes reach this host on"
        )
    why = _not_one_host(ip)
    if why:
        loc.fail(f"{value} is {why}; give the address of this host")
    return str(plain)


def _network(value: Any, loc: _Loc) -> str:
    """An address or a network (CIDR) the fence admits, canonical; one that would not admit what it
    says (host bits, IPv4-mapped, a zone, multicast, loopback: bootstrap.cluster.guard.allow) is refused."""
    from bootstrap.cluster.guard.allow import entry_problem

    value = _string(value, loc)
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        loc.fail(f"{_quote(value)} is not an IP address or a network such as 10.0.0.0/24")
    net, why = entry_problem(value)
    if why:
        loc.fail(why)
    return str(net)


def _fence_allow(value: Any, loc: _Loc) -> tuple[str, ...]:
    """cluster.fence_allow: each entry a _network, and all of them together, per IP version after
    collapsing, within the fence's bound (bootstrap.cluster.guard.allow.BOUND)."""
    from bootstrap.cluster.guard.allow import union_problem

    entries = _list(_network)(value, loc)
    found = union_problem([ipaddress.ip_network(e) for e in entries])
    if found:
        loc.item(value, found[0]).fail(found[1])
    return entries


_DASHBOARD_HOSTS = ("data-plane", "localhost", "all")


def _dashboard_host(value: Any, loc: _Loc) -> str:
    """data-plane, localhost, all, or a literal IP (normalised) the head's dashboard binds."""
    value = _string(value, loc)
    if value in _DASHBOARD_HOSTS:
        return value
    ip = _parse_ip(value, loc)
    if ip is None:
        loc.fail(
            f"expected {', '.join(_DASHBOARD_HOSTS[:-1])} or {_DASHBOARD_HOSTS[-1]}"
            f" or an IP address, got {_quote(value)}"
        )
    why = _not_one_host(ip)
    if why and not ip.is_unspecified:  # 0.0.0.0 / :: bind every address of the head
        loc.fail(f"{value} is {why}; give an address of the head")
    return str(ip)


# What the plain validators take, in words (the inventory reference; see `accepts`).
for _fn, _text in (
    (_address, "a host name, an IP address or a Host alias of ~/.ssh/config, without user or port"),
    (_jump, "a bastion, `[user@]host[:port]`"),
    (_ip, "an IPv4 or IPv6 address of this host (not the unspecified, broadcast or a multicast address)"),
    (_dashboard_host, "`localhost`, `data-plane`, `all` or an IP address"),
):
    _fn.accepts = _text
