"""A RoCE port's GID table as the kernel shows it, and which entry NCCL should use (pure).

Each address on a RoCE port's network device gives the port's GID table two entries, one per RoCE
version (`show_gids`; /sys/class/infiniband/HCA/ports/N/{gids,gid_attrs/types,gid_attrs/ndevs}/INDEX).
The first two are always the link-local fe80:: address, RoCE v1 then v2; an IPv4 address A.B.C.D gives
::ffff:A.B.C.D as v1 and v2 (typically indexes 2 and 3). A link-local GID is not routed: NCCL pinned to
it (NCCL_IB_GID_INDEX=1) fails or hangs on a routed RoCE fabric (NVIDIA/nccl#769). The GID to use is a
RoCE v2 one that carries a routable address, IPv4 first (NCCL's own default, NCCL_IB_ADDR_FAMILY=AF_INET).
Unused entries read as all zeros, and their type cannot be read (EINVAL): the facts script skips them.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

ROCE_V2 = "RoCE v2"


@dataclass(frozen=True)
class Gid:
    index: int
    #: as sysfs writes it: eight groups of four hex digits
    gid: str
    #: "RoCE v2", "IB/RoCE v1"
    type: str
    #: the network device the GID belongs to ("" where not known)
    ndev: str = ""

    @property
    def address(self) -> ipaddress.IPv6Address | None:
        try:
            return ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None

    @property
    def ipv4(self) -> str | None:
        a = self.address
        return str(a.ipv4_mapped) if a is not None and a.ipv4_mapped is not None else None

    @property
    def link_local(self) -> bool:
        a = self.address
        return a is not None and a.is_link_local

    @property
    def routable_v2(self) -> bool:
        a = self.address
        return self.type == ROCE_V2 and a is not None and not a.is_unspecified and not a.is_link_local


def parse_gid_line(line: str) -> tuple[str, int, Gid] | None:
    """`gid HCA PORT INDEX GID NDEV TYPE...` as the rack facts script prints it (NDEV `-`: none)."""
    parts = line.split(None, 6)
    if len(parts) < 7 or parts[0] != "gid" or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    ndev = "" if parts[5] == "-" else parts[5]
    return parts[1], int(parts[2]), Gid(int(parts[3]), parts[4], parts[6].strip(), ndev)


def pick(gids: tuple[Gid, ...]) -> Gid | None:
    """The RoCE v2 GID NCCL should use on this port: routable, IPv4-mapped first, the lowest index first."""
    ok = sorted((g for g in gids if g.routable_v2), key=lambda g: (g.ipv4 is None, g.index))
    return ok[0] if ok else None


def link_local_only(gids: tuple[Gid, ...]) -> bool:
    """The port has RoCE v2 GIDs, all link-local: its network device has no routable address."""
    v2 = [g for g in gids if g.type == ROCE_V2 and g.address is not None and not g.address.is_unspecified]
    return bool(v2) and all(g.link_local for g in v2)
