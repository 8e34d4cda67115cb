"""The RoCE GID NCCL is given (cluster/gids.py), read from real-shaped GID tables (tests/data/gids): each
table becomes the sysfs tree the kernel shows, the rack facts' own script reads it with sh, and the plan
and the `roce-gid` check act on what it found."""
from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bootstrap.cluster import facts as F
from bootstrap.cluster.facts import HostFacts
from bootstrap.cluster.gids import Gid, pick
from bootstrap.cluster.plan import derived_env
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import registry as PR
from tests.cluster.test_cluster_plan import gpu_inventory

DATA = Path(__file__).resolve().parent.parent / "data" / "gids"
TYPES = {"v1": "IB/RoCE v1", "v2": "RoCE v2"}


def sysfs_from(table: str, root: Path, link_layer: str = "Ethernet") -> Path:
    """The /sys/class tree of the ports in a `show_gids` table (every port ACTIVE)."""
    for line in table.splitlines()[2:]:
        cols = line.split("\t")
        dev, port, index, gid, ver, ndev = cols[0], cols[1], cols[2], cols[3], cols[-2], cols[-1]
        p = root / "infiniband" / dev / "ports" / port
        for rel, text in ((f"gids/{index}", gid), (f"gid_attrs/types/{index}", TYPES[ver]),
                          *(((f"gid_attrs/ndevs/{index}", ndev),) if ndev else ()),
                          ("state", "4: ACTIVE"), ("link_layer", link_layer)):
            (p / rel).parent.mkdir(parents=True, exist_ok=True)
            (p / rel).write_text(text + "\n")
    return root


def read_ports(name: str, tmp_path: Path, link_layer: str = "Ethernet"):
    tree = sysfs_from((DATA / name).read_text(), tmp_path / "class", link_layer)
    script = F._SCRIPT.replace("/sys/class/", f"{tree}/")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30).stdout
    return F.parse_rack(out)


def env_of(rack):
    inv = gpu_inventory(infiniband=True)
    host = replace(inv.hosts[1], env=())
    return derived_env(inv, host, HostFacts("20.10", rack=rack))


@pytest.mark.parametrize("name,want", [
    ("ipv4-bond-nccl769.txt", {"mlx5_bond_0": 3}),
    ("rail-subnets-nccl1573.txt", {"mlx5_0": 7, "mlx5_1": 7}),
    ("dual-stack.txt", {"mlx5_2": 5}),
])
def test_the_routable_ipv4_rocev2_gid_is_picked_never_the_link_local_one(name, want, tmp_path):
    rack = read_ports(name, tmp_path)
    assert {p.hca: p.rocev2_index for p in rack.ib} == want
    assert all(p.rocev2 and not p.link_local_only for p in rack.ib)
    assert env_of(rack)["NCCL_IB_GID_INDEX"] == str(next(iter(want.values())))
    assert [f for f in CK.check_rack([PR.RackNode("b", "10.10.0.12", rack)], infiniband=True)
            if f.check == "roce-gid"] == []


def test_the_old_first_v2_rule_would_have_pinned_the_link_local_gid(tmp_path):
    """What the facts script took before (the first `RoCE v2` in gid_attrs/types, lexical order): index 1,
    fe80::, on the port of NVIDIA/nccl#769 where that index timed out."""
    rack = read_ports("ipv4-bond-nccl769.txt", tmp_path)
    first_v2 = next(g for g in sorted(rack.ib[0].gids, key=lambda g: str(g.index)) if g.type == "RoCE v2")
    assert (first_v2.index, first_v2.link_local) == (1, True) and rack.ib[0].rocev2_index == 3


def test_a_port_with_only_link_local_gids_is_refused_naming_its_device_and_gets_no_index(tmp_path):
    rack = read_ports("no-address.txt", tmp_path)
    port = rack.ib[0]
    assert (port.rocev2, port.rocev2_index, port.link_local_only) == (False, None, True)
    assert "NCCL_IB_GID_INDEX" not in env_of(rack)
    found = [f for f in CK.check_rack([PR.RackNode("b", "10.10.0.12", rack)], infiniband=True) if f.check == "roce-gid"]
    assert len(found) == 1 and "only link-local RoCE v2 GIDs (fe80::)" in found[0].what, found
    assert "give bond0 an IPv4 address" in found[0].fix and "show_gids mlx5_bond_0" in found[0].fix


def test_infiniband_ports_need_no_rocev2_gid(tmp_path):
    rack = read_ports("infiniband.txt", tmp_path, link_layer="InfiniBand")
    assert [(p.link_layer, p.rocev2, p.rocev2_index) for p in rack.ib] == [("InfiniBand", False, None)]
    assert "NCCL_IB_GID_INDEX" not in env_of(rack) and env_of(rack)["NCCL_IB_HCA"] == "mlx5_0"
    assert [f for f in CK.check_rack([PR.RackNode("b", "10.10.0.12", rack)], infiniband=True)
            if f.check.startswith(("roce", "ib"))] == []


def test_ports_that_pick_different_indexes_leave_nccl_to_choose():
    a = F.IBPort("mlx5_0", 1, "Ethernet", True, "ACTIVE", 3)
    b = F.IBPort("mlx5_1", 1, "Ethernet", True, "ACTIVE", 7)
    assert "NCCL_IB_GID_INDEX" not in env_of(F.RackFacts(ib=(a, b)))


def test_unused_entries_and_a_v1_only_address_are_not_picked():
    gids = (Gid(0, "fe80:0000:0000:0000:0ac0:ebff:feda:1cfb", "RoCE v2"),
            Gid(2, "0000:0000:0000:0000:0000:ffff:0a0a:0211", "IB/RoCE v1"),
            Gid(4, "0000:0000:0000:0000:0000:0000:0000:0000", "RoCE v2"))
    assert pick(gids) is None
