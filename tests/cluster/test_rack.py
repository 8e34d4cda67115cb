"""The rack preflight (bootstrap/cluster/rack.py): the facts command's output parsed, and each check
refusing what breaks a multi-node vLLM, naming the host and the fix; a healthy rack passes. The
sandbox runs it for real on every `up` (a healthy sandbox passes: tests/sandbox)."""
from pathlib import Path

import pytest

from bootstrap.cluster import facts as F
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import registry as PR
from bootstrap.cluster.preflight import rules as PRU
from bootstrap.cluster.preflight.run import rack_refusals

# `ip -o link` / `ip -o addr` as a GPU host with a ConnectX RoCE port prints them
LINKS = ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\"
         "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"
         "2: ens5: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu {mtu} qdisc mq state UP mode DEFAULT group default qlen 1000"
         "\\    link/ether 0a:1b:2c:3d:4e:5f brd ff:ff:ff:ff:ff:ff\n"
         "3: docker0: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 1500 qdisc noqueue state DOWN mode DEFAULT group "
         "default \\    link/ether 02:42:ac:11:00:01 brd ff:ff:ff:ff:ff:ff\n")
ADDRS = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
         "2: ens5    inet {ip}/24 brd 10.10.0.255 scope global ens5\\       valid_lft forever preferred_lft forever\n"
         "3: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever\n")


def output(ip="10.10.0.11", mtu=9000, clock="1764108000.250000000", shm="tmpfs 68719476736 0 68719476736 0% /dev/shm",
           ib=("mlx5_0 1 Ethernet 1 4: ACTIVE", "mlx5_1 1 Ethernet 1 4: ACTIVE"), cpus="224"):
    ib_part = "" if ib is None else "present\n" + "".join(x + "\n" for x in ib)
    return (f"== clock\n{clock}\n== link\n{LINKS.format(mtu=mtu)}== addr\n{ADDRS.format(ip=ip)}== shm\n{shm}\n"
            f"== cpus\n{cpus}\n== ib\n{ib_part}")


def node(name="a", ip="10.10.0.11", env=None, driver="580.159.04", nofile=1048576, sent=1764108000.0,
         received=1764108000.5, image_key=None, **kw):
    facts = F.parse_rack(output(ip=ip, **kw), sent=sent, received=received)
    return PR.RackNode(name, ip, facts, env or {}, driver, nofile, image_key)


def test_the_facts_command_output_is_parsed():
    f = F.parse_rack(output(), sent=1764108000.0, received=1764108000.5)
    assert f.clock_offset == pytest.approx(0.0)
    assert [(lk.name, lk.up, lk.mtu) for lk in f.links] == [("lo", True, 65536), ("ens5", True, 9000),
                                                           ("docker0", False, 1500)]
    assert ("ens5", "10.10.0.11") in f.addrs and f.shm_bytes == 64 << 30
    assert f.ib == (F.IBPort("mlx5_0", 1, "Ethernet", True, "ACTIVE"),
                    F.IBPort("mlx5_1", 1, "Ethernet", True, "ACTIVE"))
    assert F.parse_rack(output(ib=None)).ib is None  # no /sys/class/infiniband
    assert F.parse_rack(output(ib=())).ib == ()  # the class is there, no port
    assert F.parse_rack("").links == () and F.parse_rack("").clock_offset is None
    assert F.parse_rack(output()).cpus == 224
    assert F.parse_rack(output(cpus="")).cpus is None and F.parse_rack(output(cpus="0")).cpus is None
    assert F.parse_rack("").cpus is None


def test_the_script_reads_the_kernels_files():
    script = F.RACK_FACTS[2]
    for part in ("ip -o link show", "ip -o addr show", "/dev/shm", "/sys/class/infiniband", "gid_attrs/types",
                 "link_layer", "state", "date +%s.%N"):
        assert part in script


def test_a_healthy_rack_passes():
    nodes = [node("a", "10.10.0.11"), node("b", "10.10.0.12")]
    assert CK.check_rack(nodes, infiniband=True, ipc_host=True) == []


def checks(found):
    return [(f.check, f.host) for f in found]


def test_a_port_down_another_link_layer_and_no_rocev2_gid_are_refused():
    nodes = [node("a"), node("b", "10.10.0.12", ib=("mlx5_0 1 Ethernet 1 1: DOWN", "mlx5_1 1 Ethernet 0 4: ACTIVE")),
             node("c", "10.10.0.13", ib=("mlx5_0 1 InfiniBand 0 4: ACTIVE", "mlx5_1 1 InfiniBand 0 4: ACTIVE"))]
    found = CK.check_rack(nodes, infiniband=True)
    assert checks(found) == [("ib-port", "b"), ("roce-gid", "b"), ("ib-link-layer", "c")]
    assert "mlx5_0 port 1 is DOWN, not ACTIVE" in found[0].what and "ibstat mlx5_0" in found[0].fix
    assert "InfiniBand, the other nodes Ethernet" in found[2].what
    # without infiniband: true, none of this is looked at
    assert CK.check_rack(nodes, infiniband=False) == []


def test_nccl_ib_hca_naming_an_hca_the_node_lacks_is_refused_and_only_its_ports_count():
    env = {"NCCL_IB_HCA": "mlx5_0:1,mlx5_3"}
    found = CK.check_rack([node("a", env=env, ib=("mlx5_0 1 Ethernet 1 4: ACTIVE", "mlx5_1 1 Ethernet 1 1: DOWN"))],
                          infiniband=True)
    assert checks(found) == [("ib-hca", "a")] and "mlx5_3" in found[0].what  # mlx5_1 is DOWN but unused
    assert PRU.ib_hcas("^mlx5_2") == (True, ["mlx5_2"]) and PRU.ib_hcas("=mlx5_0:1") == (False, ["mlx5_0"])
    excluded = CK.check_rack([node("a", env={"NCCL_IB_HCA": "^mlx5_1"},
                                   ib=("mlx5_0 1 Ethernet 1 4: ACTIVE", "mlx5_1 1 Ethernet 1 1: DOWN"))],
                             infiniband=True)
    assert excluded == []


def test_the_data_interface_missing_or_down_and_mtus_that_differ_are_refused():
    found = CK.check_rack([node("a"), node("b", "10.10.0.12", mtu=1500), node("c", "10.10.0.13")])
    assert checks(found) == [("mtu", "b")] and "1500, the other nodes 9000" in found[0].what
    wrong_ip = PR.RackNode("d", "10.10.0.99", F.parse_rack(output(ip="10.10.0.14")), {}, None, None)
    assert checks(CK.check_rack([wrong_ip])) == [("data-interface", "d")]
    down = F.parse_rack(output().replace("<BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000",
                                          "<NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 9000"))
    found = CK.check_rack([PR.RackNode("e", "10.10.0.11", down, {}, None, None)])
    assert checks(found) == [("data-interface", "e")] and "ens5, which holds 10.10.0.11, is down" in found[0].what


def test_socket_ifname_that_selects_nothing_is_refused_with_the_interface_to_use():
    found = CK.check_rack([node("a", env={"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "ens5"})])
    assert checks(found) == [("socket-ifname", "a")]
    assert "NCCL_SOCKET_IFNAME=eth selects no interface" in found[0].what and "=ens5" in found[0].fix
    assert CK.check_rack([node("a", env={"NCCL_SOCKET_IFNAME": "^docker,lo"})]) == []
    assert PRU.select_interfaces("GLOO_SOCKET_IFNAME", "^eth0", ["eth0"]) is None


def test_drivers_clocks_shm_and_nofile():
    nodes = [node("a"), node("b", "10.10.0.12", driver="570.86.15", clock="1764108003.5",
                              shm="tmpfs 67108864 0 67108864 0% /dev/shm", nofile=4096), node("c", "10.10.0.13")]
    found = CK.check_rack(nodes, ipc_host=True)
    assert checks(found) == [("clock", "b"), ("gpu-driver", "b"), ("nofile", "b"), ("shm", "b")]
    assert "+3.2 s from a's" in found[0].what and "64 MiB" in found[3].what
    # two nodes, two drivers: no majority, both named
    both = CK.check_rack([node("a"), node("b", "10.10.0.12", driver="570.86.15")])
    assert checks(both) == [("gpu-driver", "a"), ("gpu-driver", "b")] and "the nodes differ" in both[0].what
    # a container of its own /dev/shm (ipc_host false) does not use the host's
    assert ("shm", "b") not in checks(CK.check_rack(nodes, ipc_host=False))


def test_a_node_whose_tag_names_another_build_of_the_image_is_refused():
    """A tag moved on one node only: that node would run another build. A node without the image
    is not a finding (`up` gives it the image)."""
    new, old = "content:" + "ab" * 32, "content:" + "cd" * 32
    nodes = [node("a", image_key=new), node("b", "10.10.0.12", image_key=old), node("c", "10.10.0.13", image_key=new),
             node("d", "10.10.0.14")]
    found = CK.check_rack(nodes)
    assert checks(found) == [("image", "b")]
    assert found[0].what == ("the image's content (layers and config): cdcdcdcdcdcd, the other nodes abababababab"
                             ) and "up --pull" in found[0].fix
    assert CK.check_rack(nodes[:1] + nodes[2:]) == []


def test_one_image_in_a_classic_and_a_containerd_image_store_is_the_same_image():
    """Docker 20.10's overlay2 store names an image by its config's digest, Docker 26's containerd store by
    its manifest's (pulled) or by one of its own (loaded from a `docker save` of the other): three IDs,
    one image (tests/data/hosts/images, recorded on sandbox nodes). Compared by content, a mixed rack's
    image check passes, and a node with another build is still refused."""
    import json

    from bootstrap.cluster import facts as F
    from bootstrap.containers import image_content_key

    images = Path(__file__).resolve().parents[1] / "data" / "hosts" / "images"
    seen = {f.stem: json.loads(f.read_text())[0] for f in images.glob("*.json")}
    assert len(seen) == 3 and len({o["Id"] for o in seen.values()}) == 3
    keys = {image_content_key(o) for o in seen.values()}
    assert len(keys) == 1 and None not in keys
    (key,) = keys
    for name, o in seen.items():  # the facts' own parser, on each store's inspect, gives the same key
        assert F.parse_image(json.dumps(o)) == (o["Id"], key), name
    nodes = [node("a", image_key=key), node("b", "10.10.0.12", image_key=key), node("c", "10.10.0.13", image_key=key)]
    assert CK.check_rack(nodes) == []
    other = dict(seen["classic-20.10-pulled"], Config={**seen["classic-20.10-pulled"]["Config"], "Cmd": ["other"]})
    assert image_content_key(other) != key
    found = CK.check_rack([*nodes, node("d", "10.10.0.14", image_key=image_content_key(other))])
    assert checks(found) == [("image", "d")]


def test_a_docker_that_cannot_raise_memlock_is_refused_where_rdma_needs_it():
    """dockerd's own hard limit and capabilities, as /proc shows them (the sandbox's nodes: 8 MiB and no
    CAP_SYS_RESOURCE, so `--ulimit memlock=-1` fails with "error setting rlimit type 8")."""
    mib8 = "Max locked memory         8388608              8388608              bytes"
    confined = (mib8, "CapEff:\t000001fffeffffff")
    root = (mib8, "CapEff:\t000001ffffffffff")
    unlimited = ("Max locked memory         unlimited            unlimited            bytes",
                 "CapEff:\t0000000000000000")
    assert F.parse_dockerd(confined) == (8388608, False) and F.parse_dockerd(root) == (8388608, True)
    assert F.parse_dockerd(unlimited) == (-1, False) and F.parse_dockerd([]) == (None, None)

    def with_dockerd(lines, name="a"):
        n = node(name)
        facts = F.parse_rack(output() + "== dockerd\n" + "\n".join(lines) + "\n")
        return PR.RackNode(n.host, n.ip, facts, n.env, n.driver, n.nofile_hard)
    found = CK.check_rack([with_dockerd(confined)], infiniband=True)
    assert checks(found) == [("memlock", "a")] and "8 MiB" in found[0].what and "LimitMEMLOCK" in found[0].fix
    assert CK.check_rack([with_dockerd(confined)], infiniband=False) == []  # memlock=-1 is asked for IB only
    assert CK.check_rack([with_dockerd(root), with_dockerd(unlimited, "b")], infiniband=True) == []


def test_a_named_check_can_be_skipped():
    nodes = [node("a"), node("b", "10.10.0.12", mtu=1500)]
    assert CK.check_rack(nodes, skip=frozenset({"mtu"})) == []
    assert set(CK.CHECKS) >= {"gpu-driver", "data-interface", "socket-ifname", "mtu", "ib-port", "ib-link-layer",
                              "roce-gid", "ib-hca", "clock", "shm", "nofile", "image", "memlock"}


def test_up_turns_the_findings_into_one_refusal_per_host():
    from bootstrap.cluster.facts import GPU, HostFacts
    from tests.support.plan_fixtures import gpu_inventory

    inv = gpu_inventory(infiniband=True)
    a, b = inv.hosts
    facts = {a.name: HostFacts("26.1", gpus=(GPU("H100", 81559, "580.159.04"),), nofile_hard=1048576,
                               rack=F.parse_rack(output(ip=a.ip))),
             b.name: HostFacts("26.1", gpus=(GPU("H100", 81559, "580.159.04"),), nofile_hard=1048576,
                               rack=F.parse_rack(output(ip=b.ip, mtu=1500, ib=("mlx5_0 1 Ethernet 1 1: DOWN",))
                                                  .replace("ens5", "ens6")))}  # its NCCL_SOCKET_IFNAME
    got = rack_refusals(inv, facts, inv.hosts)
    text = str(got[b.name])
    assert text.startswith(f"{b.name}: ") and "[ib-port]" in text and "[mtu]" in text and "--skip-check" in text
    # two nodes, two MTUs: which one is wrong is not known, so both are named
    assert str(got[a.name]) == (f"{a.name}: data-plane MTU: 9000, the nodes differ ({a.name} 9000, {b.name} 1500) "
                                "[mtu] -- give the data-plane interfaces one MTU (`ip link set DEV mtu N`, and the "
                                "switch ports) (or skip a check: up --skip-check NAME)")
    assert rack_refusals(inv, facts, inv.hosts, frozenset({"mtu"}))[a.name] is True
    assert rack_refusals(inv, facts, inv.hosts, frozenset({"ib-port", "mtu"})).failed == {}


# The H200's real values (tests/data/gpu/h200-facts.txt, h200-cuda-probe.txt): driver 580.159.04 runs
# CUDA 13.0; its image (a torch cu130 build on NVIDIA's CUDA image) says CUDA_VERSION=13.0.2 and an
# NVIDIA_REQUIRE_CUDA whose brand alternatives admit drivers 535, 550, 565, 570 and 575.
_GPU = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "gpu"
H200_FACTS = (_GPU / "h200-facts.txt").read_text()
H200_IMAGE = {"CUDA_VERSION": "13.0.2",
              "NVIDIA_REQUIRE_CUDA": H200_FACTS.split("NVIDIA_REQUIRE_CUDA=", 1)[1].splitlines()[0]}


def test_the_drivers_cuda_is_read_from_nvidia_smis_version_and_its_header():
    from bootstrap.cluster.facts import parse_driver_cuda

    probe = (_GPU / "h200-cuda-probe.txt").read_text()
    assert parse_driver_cuda(probe) == "13.0"  # `nvidia-smi --version`
    assert parse_driver_cuda(H200_FACTS) == "13.0"  # the table's header and -q say the same
    assert parse_driver_cuda('Field "cuda_version" is not a valid field to query.') is None


def test_the_images_cuda_comes_from_its_environment_in_the_inspect_output():
    import json

    from bootstrap.cluster.facts import parse_image_cuda

    container = {"Name": "/vllm-node", "State": {"Status": "running"}, "Config": {"Env": ["CUDA_VERSION=9.9"]}}
    image = {"Id": "sha256:ab", "Config": {"Env": ["PATH=/usr/bin", "CUDA_VERSION=13.0.2",
                                                   "NVIDIA_REQUIRE_CUDA=" + H200_IMAGE["NVIDIA_REQUIRE_CUDA"]]}}
    out = json.dumps(container) + "\n" + json.dumps(image) + "\n"
    assert parse_image_cuda(out) == H200_IMAGE
    assert parse_image_cuda(json.dumps(container)) == {}  # the image is not on the host
    assert PRU.image_cuda_need(H200_IMAGE) == "13.0"
    assert PRU.image_cuda_need({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8 brand=tesla,driver>=535,driver<536"}) == "12.8"
    assert PRU.image_cuda_need({}) is None


def _gpu_node(name, driver, driver_cuda, image=H200_IMAGE):
    return PR.RackNode(name, "10.10.0.11", F.RackFacts(), {}, driver, None, "sha256:ab", driver_cuda, image)


def test_a_driver_older_than_the_images_cuda_is_refused_unless_the_image_serves_it_forward_compatibly():
    assert CK.check_rack([_gpu_node("a", "580.159.04", "13.0")]) == []  # the H200 as recorded
    (f,) = CK.check_rack([_gpu_node("a", "580.159.04", "13.0"), _gpu_node("b", "560.35.03", "12.6")],
                         skip=frozenset({"gpu-driver"}))
    assert (f.check, f.host) == ("cuda-driver", "b")
    assert f.what == "its NVIDIA driver 560.35.03 runs CUDA up to 12.6, the image is built for CUDA 13.0"
    assert "install a driver for CUDA 13.0 or newer on b" in f.fix
    # 535 is one of the branches the image's compat libraries name (brand=tesla,driver>=535,driver<536)
    assert CK.check_rack([_gpu_node("a", "535.104.05", "12.2")]) == []
    assert not PRU.forward_compatible(H200_IMAGE["NVIDIA_REQUIRE_CUDA"], "536.1")
    # an image that names no forward-compatible branch
    assert [f.check for f in CK.check_rack([_gpu_node("a", "535.104.05", "12.2", {"CUDA_VERSION": "12.8.1"})])] \
        == ["cuda-driver"]
    # unknown on either side: not checked; skippable by name
    assert CK.check_rack([_gpu_node("a", "535.104.05", None)]) == []
    assert CK.check_rack([_gpu_node("a", "560.35.03", "12.6", {})]) == []
    assert CK.check_rack([_gpu_node("b", "560.35.03", "12.6")], skip=frozenset({"cuda-driver"})) == []
