"""The fabric as real hosts show it (issue 64): AWS EFA devices recognised by their driver and kept out of
NCCL_IB_HCA, refused with what NCCL needs (its EFA plugin) where the inventory says infiniband; GPUDirect
RDMA read from the peer-memory modules and /proc/driver/nvidia/version (recorded lines: tests/data/fabric),
refused where the HCAs are used and neither nvidia-peermem nor DMA-BUF can carry it. The sandbox makes a
node's HCAs EFA devices (tests/sandbox/test_sandbox_infra.py)."""
from pathlib import Path

import pytest

from bootstrap.cluster import fabric as FB
from bootstrap.cluster import facts as F
from bootstrap.cluster.plan import derived_env
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import registry as PR
from tests.support.plan_fixtures import cpu_inventory

DATA = Path(__file__).resolve().parents[1] / "data" / "fabric"
OPEN = (DATA / "nvidia-version-open-565.txt").read_text().splitlines()[0]
JETSON = (DATA / "nvidia-version-open-aarch64-jetson.txt").read_text().splitlines()[0]
PROPRIETARY = (DATA / "nvidia-version-proprietary-580.txt").read_text().splitlines()[0]


def rack(ib_lines, gdr_lines=None, ip="10.0.0.1"):
    gdr = "" if gdr_lines is None else "== gdr\n" + "".join(x + "\n" for x in gdr_lines)
    return F.parse_rack(f"== addr\n2: eth0    inet {ip}/24 scope global eth0\n== ib\npresent\n"
                        + "".join(x + "\n" for x in ib_lines) + gdr)


EFA = ["hca rdmap16s27 efa", "hca rdmap32s27 efa", "rdmap16s27 1 Unknown - 4: ACTIVE",
       "rdmap32s27 1 Unknown - 4: ACTIVE"]
MLX = ["hca mlx5_0 mlx5_core", "mlx5_0 1 InfiniBand - 4: ACTIVE"]


def test_efa_devices_are_told_by_their_driver_and_left_out_of_ncclib_hca():
    f = rack(EFA + MLX)
    assert [(p.hca, p.driver, p.efa) for p in f.ib] == [("rdmap16s27", "efa", True), ("rdmap32s27", "efa", True),
                                                        ("mlx5_0", "mlx5_core", False)]
    # a driver not read, and "Unknown" alone, is not EFA
    assert not rack(["rdmap16s27 1 Unknown - 4: ACTIVE"]).ib[0].efa
    inv = cpu_inventory(2)
    import dataclasses
    ib = dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, infiniband=True))
    h = ib.hosts[0]
    facts = F.HostFacts("28.1.1", rack=rack(EFA + MLX, ip=h.ip))
    assert derived_env(ib, h, facts)["NCCL_IB_HCA"] == "mlx5_0"
    assert "NCCL_IB_HCA" not in derived_env(ib, h, F.HostFacts("28.1.1", rack=rack(EFA, ip=h.ip)))


def test_efa_where_the_inventory_says_infiniband_is_refused_with_what_nccl_needs():
    node = PR.RackNode("p4d-1", "10.0.0.1", rack(EFA))
    (f,) = [f for f in CK.check_rack([node], infiniband=True) if f.check == "efa"]
    assert f.what.startswith("its RDMA devices rdmap16s27, rdmap32s27 are AWS EFA, which NCCL reaches only through "
                             "its EFA plugin (aws-ofi-nccl with libfabric)")
    assert "up --skip-check efa" in f.fix and "infiniband: false" in f.fix
    assert [f for f in CK.check_rack([node], infiniband=False) if f.check == "efa"] == []
    assert [f for f in CK.check_rack([node], infiniband=True, skip=frozenset({"efa"})) if f.check == "efa"] == []


@pytest.mark.parametrize("lines,usable,how", [
    (["module nvidia_peermem", f"driver {PROPRIETARY}", "kernel 5.15.0-1063-nvidia"], True, "through nvidia_peermem"),
    ([f"driver {OPEN}", "kernel 6.8.0-45-generic"], True, "through DMA-BUF"),
    ([f"driver {JETSON}", "kernel 5.10.120-tegra"], False, "the open kernel module on Linux 5.10.120-tegra"),
    ([f"driver {PROPRIETARY}", "kernel 6.8.0-45-generic"], False, "the proprietary kernel module"),
])
def test_gpudirect_rdma_from_the_modules_and_the_drivers_own_words(lines, usable, how):
    g = FB.parse_gdr(lines)
    assert g.known and g.usable is usable and how in g.describe(), g.describe()


def test_no_gpudirect_on_a_gpu_rack_with_hcas_is_refused_and_an_unknown_driver_is_not():
    bad = rack(MLX, [f"driver {PROPRIETARY}", "kernel 6.8.0-45-generic"])
    node = PR.RackNode("h100-1", "10.0.0.1", bad)
    (f,) = [f for f in CK.check_rack([node], infiniband=True, want_gpus=8) if f.check == "gpudirect"]
    assert f.what.startswith("no GPUDirect RDMA: nvidia-peermem is not loaded and the proprietary kernel module")
    assert "modprobe nvidia-peermem" in f.fix and "up --skip-check gpudirect" in f.fix
    # a CPU cluster, no infiniband, or a driver that said nothing (the sandbox's fake GPUs): nothing to say
    assert [f for f in CK.check_rack([node], infiniband=True) if f.check == "gpudirect"] == []
    assert [f for f in CK.check_rack([node], infiniband=False, want_gpus=8) if f.check == "gpudirect"] == []
    quiet = PR.RackNode("h100-1", "10.0.0.1", rack(MLX, ["kernel 6.8.0-45-generic"]))
    assert [f for f in CK.check_rack([quiet], infiniband=True, want_gpus=8) if f.check == "gpudirect"] == []
    assert rack(MLX).gdr is None  # an older script printed no section


def test_the_script_prints_what_the_parsers_read():
    script = F.RACK_FACTS[2]
    for part in ("device/driver", "== gdr", "/sys/module/$m", "/proc/driver/nvidia/version", "uname -r"):
        assert part in script


def test_the_dry_run_says_what_the_fabric_gave_nccl_and_why():
    """`up --dry-run` (plan_up with the nodes' facts): the GID index chosen and the link-local ones left out, an
    index the env sets, indexes that differ (left unset), EFA left out, GPUDirect's way; nothing offline."""
    import dataclasses

    from bootstrap.cluster.plan import fabric_notes, plan_up

    inv = cpu_inventory(2)
    ib = dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, infiniband=True))
    h = ib.hosts[0]
    fe80, v4 = "fe80:0000:0000:0000:0c42:a1ff:fe00:0001", "0000:0000:0000:0000:0000:ffff:0a0a:0001"
    table = [f"gid mlx5_0 1 {i} {g} ens1f0np0 {t}" for i, (g, t) in enumerate((
        (fe80, "IB/RoCE v1"), (fe80, "RoCE v2"), (v4, "IB/RoCE v1"), (v4, "RoCE v2")))]
    roce = ["hca mlx5_0 mlx5_core", "mlx5_0 1 Ethernet - 4: ACTIVE", *table]
    gdr = ["module nvidia_peermem", f"driver {PROPRIETARY}", "kernel 5.15.0-1063-nvidia"]
    facts = F.HostFacts("28.1.1", rack=rack(roce, gdr, ip=h.ip))
    notes = fabric_notes(ib, h, facts)
    assert notes == ("NCCL_IB_GID_INDEX=3: the RoCE v2 GID of mlx5_0 (10.10.0.1 on ens1f0np0); link-local fe80:: "
                     "RoCE v2 at 1 left out (no router forwards it)", "GPUDirect RDMA through nvidia_peermem"), notes
    assert fabric_notes(inv, h, facts) == () and fabric_notes(ib, h, None) == ()  # no infiniband, no facts
    own = dataclasses.replace(h, env={**dict(h.env), "NCCL_IB_GID_INDEX": "1"})
    assert fabric_notes(ib, own, facts)[0] == "NCCL_IB_GID_INDEX=1 as its env sets it (the routable RoCE v2 GIDs are " \
                                               "at mlx5_0: 3)"
    two = roce + ["hca mlx5_1 mlx5_core", "mlx5_1 1 Ethernet - 4: ACTIVE",
                  "gid mlx5_1 1 5 0000:0000:0000:0000:0000:ffff:0a0b:0001 ens2f0np0 RoCE v2"]
    split = fabric_notes(ib, h, F.HostFacts("28.1.1", rack=rack(two, ip=h.ip)))
    assert split == ("NCCL_IB_GID_INDEX left unset: the ports' routable RoCE v2 GIDs are at different indexes "
                     "(mlx5_0: 3, mlx5_1: 5), and NCCL 2.21+ picks each port's routable one itself",), split
    assert fabric_notes(ib, h, F.HostFacts("28.1.1", rack=rack(EFA, ip=h.ip))) == (
        "rdmap16s27, rdmap32s27: AWS EFA, left out of NCCL_IB_HCA (NCCL's EFA plugin, aws-ofi-nccl, uses them)",)
    actions = plan_up(ib, {h.name: facts})
    assert actions[0].fabric == notes and actions[1].fabric == ()
    # as `up --dry-run` prints them, and in its JSON
    import io

    from rich.console import Console

    from bootstrap.cli import render_cluster as RC
    from bootstrap.face.docs import plan_doc
    buf = io.StringIO()
    saved, RC.out = RC.out, Console(file=buf, width=400, no_color=True)
    try:
        RC.plan_rows(actions, False, live=True)
    finally:
        RC.out = saved
    assert f"fabric: {h.name}: NCCL_IB_GID_INDEX=3: the RoCE v2 GID of mlx5_0" in buf.getvalue(), buf.getvalue()
    assert plan_doc(actions)["replicas"][0]["hosts"][0]["fabric"] == list(notes)
