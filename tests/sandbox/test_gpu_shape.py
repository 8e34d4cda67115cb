"""The GPU-shaped sandbox's parts without Docker: its nvidia-smi and NVIDIA hook stand-ins run as the
nodes run them (python3 subprocesses), and its /sys/class/infiniband tree read by the rack preflight's
own script. Docker's side (dockerd calling the hook for `--gpus`) is in test_sandbox_infra.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.cluster import facts as F
from bootstrap.cluster.facts import parse_nvidia_smi
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import registry as PR
from bootstrap.monitor.metrics import parse_gpus
from bootstrap.sandbox import gpu as G

SMI = G.SCRIPTS["nvidia-smi"]
HOOK = G.SCRIPTS["nvidia-container-runtime-hook"]
#: ../shared/gpu/h100-nvidia-smi-query.csv: real output of one H100 (driver 580.159.04)
RECORDED_QUERY = "NVIDIA H100 80GB HBM3, 81559, 580.159.04\n"
#: ../shared/gpu/h100-nvidia-smi.txt, the default table's fixed lines (the date line left out)
RECORDED_TABLE = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:00:06.0 Off |                    0 |
| N/A   36C    P0            125W /  700W |       0MiB /  81559MiB |      0%      Default |
|                                         |                        |             Disabled |
+-----------------------------------------+------------------------+----------------------+
"""


def smi(state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SMI), *args], capture_output=True, text=True, timeout=30,
                          env={"SANDBOX_NVIDIA_SMI_STATE": str(state), "PATH": "/usr/bin:/bin"})


@pytest.fixture
def node(tmp_path):
    """Node 1 of an 8-GPU sandbox with two RoCE HCAs per node, as its /sandbox looks."""
    src = tmp_path / "nodes" / "node1" / "sandbox"
    G.write_node(src, 1, G.GpuShape(gpus=8, ib="roce", hcas=2))
    return tmp_path, src / "gpu"


def test_the_query_bootstrap_makes_answers_as_a_real_h100_and_its_parser_reads_eight(node):
    _, gpu = node
    one = gpu.parent / "one.json"
    one.write_text(json.dumps(G.gpu_state(1, G.GpuShape(gpus=1))))
    q = ("--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits")
    assert smi(one, *q).stdout == RECORDED_QUERY
    r = smi(gpu / "state.json", *q)
    assert r.returncode == 0 and [(g.name, g.memory_mib, g.driver) for g in parse_nvidia_smi(r.stdout)] == [
        ("NVIDIA H100 80GB HBM3", 81559, "580.159.04")] * 8


def test_the_default_table_is_the_recorded_one_and_top_reads_the_load(node):
    workdir, gpu = node
    one = gpu.parent / "one.json"
    state = G.gpu_state(1, G.GpuShape(gpus=1))
    state["gpus"][0]["bus_id"] = "00000000:00:06.0"  # the recorded machine's
    one.write_text(json.dumps(state))
    table = smi(one).stdout.splitlines()
    assert "\n".join(table[1:12]) + "\n" == RECORDED_TABLE
    assert "No running processes found" in table[-2]

    G.set_gpus(workdir, "node1", utilization=100, memory_used=41843)
    r = smi(gpu / "state.json", "--query-gpu=utilization.gpu,memory.used,memory.total",
            "--format=csv,noheader,nounits")
    samples = parse_gpus(r.stdout)
    assert len(samples) == 8 and {(s.util, s.mem_used, s.mem_total) for s in samples} == {(100, 41843, 81559)}
    assert smi(gpu / "state.json", "-L").stdout.splitlines()[7].startswith("GPU 7: NVIDIA H100 80GB HBM3 (UUID: GPU-")


def test_refusals_use_the_real_tools_words(node):
    _, gpu = node
    r = smi(gpu / "state.json", "--query-gpu=name,bogus", "--format=csv")
    assert r.returncode == 2 and 'Field "bogus" is not a valid field to query.' in r.stderr
    r = smi(gpu / "state.json", "--bogus")
    assert r.returncode == 2 and "Option --bogus is not recognized" in r.stderr
    r = smi(gpu.parent / "no-such-state.json", "-L")
    assert r.returncode == 9 and "couldn't communicate with the NVIDIA driver" in r.stdout


def bundle(tmp_path: Path, env: list[str]) -> Path:
    b = tmp_path / "bundle"
    (b / "rootfs").mkdir(parents=True)
    (b / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}, "process": {"env": env}}))
    return b


def hook(gpu: Path, b: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HOOK), *args], input=json.dumps({"bundle": str(b), "pid": 1}),
                          capture_output=True, text=True, timeout=30,
                          env={"SANDBOX_GPU_DIR": str(gpu), "SANDBOX_NVIDIA_SMI": str(SMI), "PATH": "/usr/bin:/bin"})


def test_the_hook_gives_a_container_the_gpus_nvidia_visible_devices_names(node, tmp_path):
    _, gpu = node
    uuid3 = json.loads((gpu / "state.json").read_text())["gpus"][3]["uuid"]
    b = bundle(tmp_path, ["PATH=/usr/bin", f"NVIDIA_VISIBLE_DEVICES=1,{uuid3}", "NVIDIA_DRIVER_CAPABILITIES=all"])
    r = hook(gpu, b, "prestart")
    assert r.returncode == 0, r.stderr
    placed = b / "rootfs" / "usr" / "local" / "bin"
    listed = subprocess.run([str(placed / "nvidia-smi"), "-L"], capture_output=True, text=True, timeout=30).stdout
    assert [ln.split(" (UUID: ")[0] for ln in listed.splitlines()] == ["GPU 0: NVIDIA H100 80GB HBM3",
                                                                      "GPU 1: NVIDIA H100 80GB HBM3"]
    assert uuid3 in listed.splitlines()[1]

    everything = bundle(tmp_path / "all", ["NVIDIA_VISIBLE_DEVICES=all"])
    assert hook(gpu, everything, "prestart").returncode == 0
    assert len(json.loads((everything / "rootfs/usr/local/bin/nvidia-smi.json").read_text())["gpus"]) == 8


def test_the_hook_leaves_a_container_without_gpus_alone_and_fails_as_a_broken_driver_does(node, tmp_path):
    workdir, gpu = node
    plain = bundle(tmp_path / "plain", ["PATH=/usr/bin"])
    assert hook(gpu, plain, "prestart").returncode == 0
    assert not (plain / "rootfs" / "usr").exists()
    bad = hook(gpu, bundle(tmp_path / "bad", ["NVIDIA_VISIBLE_DEVICES=9"]), "prestart")
    assert bad.returncode == 1 and "unknown device id: 9" in bad.stderr
    assert hook(gpu, plain, "poststop").returncode == 0

    G.break_hook(workdir, "node1", "nvidia-container-cli: initialization error: nvml error: driver/library "
                                   "version mismatch")
    broken = hook(gpu, bundle(tmp_path / "broken", ["NVIDIA_VISIBLE_DEVICES=all"]), "prestart")
    assert broken.returncode == 1 and "driver/library version mismatch" in broken.stderr
    G.break_hook(workdir, "node1", None)
    assert hook(gpu, bundle(tmp_path / "healed", ["NVIDIA_VISIBLE_DEVICES=all"]), "prestart").returncode == 0


def rack_of(gpu: Path, host: str = "node1") -> PR.RackNode:
    """The rack preflight's own script, run against the node's class tree instead of /sys/class."""
    script = F._SCRIPT.replace("/sys/class/", f"{gpu / 'class'}/")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30).stdout
    return PR.RackNode(host, "127.0.0.1", F.parse_rack(out))


def test_the_ib_tree_reads_as_active_roce_ports_and_a_port_set_down_is_refused(node):
    workdir, gpu = node
    ports = rack_of(gpu).facts.ib
    assert [(p.hca, p.port, p.link_layer, p.rocev2, p.state) for p in ports] == [
        ("mlx5_0", 1, "Ethernet", True, "ACTIVE"), ("mlx5_1", 1, "Ethernet", True, "ACTIVE")]
    assert [f for f in CK.check_rack([rack_of(gpu)], infiniband=True) if f.check.startswith(("ib", "roce"))] == []

    # a ConnectX port's table (fe80:: v1 and v2, then the IPv4 address v1 and v2): the routable v2 one is picked
    assert [p.rocev2_index for p in ports] == [3, 3] and [g.index for g in ports[0].gids] == [0, 1, 2, 3]
    G.set_port(workdir, "node1", "mlx5_0", address=False)  # its device loses its address: fe80:: is all it has
    found = {f.check: f for f in CK.check_rack([rack_of(gpu)], infiniband=True)}
    assert "mlx5_0 port 1 has only link-local RoCE v2 GIDs" in found["roce-gid"].what, found
    assert "give ens1f0np0 an IPv4 address" in found["roce-gid"].fix, found

    G.set_port(workdir, "node1", "mlx5_1", state="DOWN")
    G.set_port(workdir, "node1", "mlx5_0", roce_v2=False)
    found = {f.check: f for f in CK.check_rack([rack_of(gpu)], infiniband=True)}
    assert "mlx5_1" in found["ib-port"].what and "mlx5_0" in found["roce-gid"].what, found


def test_hcas_made_efa_read_as_efa_devices_through_the_racks_own_script(node):
    workdir, gpu = node
    assert G.make_efa(workdir, "node1") == ["rdmap16s27", "rdmap17s27"]
    ports = rack_of(gpu).facts.ib
    assert [(p.hca, p.link_layer, p.driver, p.efa, p.gids and len(p.gids)) for p in ports] == [
        ("rdmap16s27", "Unknown", "efa", True, 1), ("rdmap17s27", "Unknown", "efa", True, 1)]
    # (memlock: this machine's dockerd, which the script reads here, is not the point)
    assert {f.check for f in CK.check_rack([rack_of(gpu)], infiniband=True)} - {"memlock"} == {"efa"}


def test_a_cpu_node_has_no_gpu_files_and_shapes_are_checked(tmp_path):
    src = tmp_path / "sandbox"
    G.write_node(src, 1, G.GpuShape(gpus=2))
    assert (src / "gpu" / "state.json").exists() and not (src / "gpu" / "class").exists()
    G.write_node(src, 1, G.NO_GPU)
    assert not (src / "gpu").exists()
    assert G.daemon_runtimes(G.NO_GPU) == {} and "nvidia" in G.daemon_runtimes(G.GpuShape(gpus=1))["runtimes"]
    with pytest.raises(ValueError, match="ib must be one of infiniband, roce"):
        G.GpuShape(gpus=1, ib="omnipath")
    assert G.GpuShape.from_dict(G.GpuShape(8, "infiniband", 4).to_dict()) == G.GpuShape(8, "infiniband", 4)


def test_a_gpu_shaped_sandbox_writes_a_gpu_inventory_that_plans_gpu_containers(tmp_path):
    from bootstrap.cluster.plan import container_spec
    from bootstrap.inventory import load_inventory
    from bootstrap.sandbox.layout import SandboxInfo, SandboxNode, gpu_inventory_path
    from bootstrap.sandbox.state import _write_inventory

    nodes = tuple(SandboxNode(f"node{i}", f"172.31.240.{10 + i}", f"bootstrap-sandbox-node{i}") for i in (1, 2))
    info = SandboxInfo(workdir=tmp_path, network="n", subnet="172.31.240.0/24", registry="172.31.240.2:5000",
                       image="172.31.240.2:5000/bootstrap/vllm-cpu:x", nodes=nodes,
                       inventory=tmp_path / "inventory.yaml",
                       key=tmp_path / "id", known_hosts=tmp_path / "kh", gpu=G.GpuShape(gpus=8, ib="infiniband"))
    _write_inventory(info, "eth0")
    inv = load_inventory(str(gpu_inventory_path(tmp_path)), {}, check_files=False)
    assert (inv.cluster.accelerator, inv.gpus_per_node, inv.cluster.infiniband) == ("gpu", 8, True)
    spec = container_spec(inv, inv.hosts[1], nofile=20000)
    assert ("--gpus", "all") in zip(spec.options, spec.options[1:]) and "/dev/infiniband" in spec.options
    assert "NCCL_SOCKET_IFNAME=eth0" in spec.options and "--num-gpus=8" in spec.command
    assert load_inventory(str(info.inventory), {}, check_files=False).cluster.accelerator == "none"

    _write_inventory(info.__class__(**{**info.__dict__, "gpu": G.NO_GPU}), "eth0")  # a CPU sandbox has none
    assert not gpu_inventory_path(tmp_path).exists()


def test_a_cdi_node_gets_a_spec_for_its_gpus_dockers_cdi_on_and_no_runtime(tmp_path):
    """The odd node of a mixed rack (layout.MIXED_HOST): its GPUs come through CDI only. The spec lists a
    device per GPU and `all`, each with its device nodes (node-init makes those it names) and the stand-in
    hook off PATH; daemon.json turns Docker's CDI on and registers no `nvidia` runtime."""
    import re

    import yaml

    src = tmp_path / "sandbox"
    G.write_node(src, 3, G.GpuShape(gpus=2), cdi=True)
    spec = yaml.safe_load((src / "gpu" / "cdi.yaml").read_text())
    assert spec["kind"] == "nvidia.com/gpu" and [d["name"] for d in spec["devices"]] == ["0", "1", "all"]
    assert spec["devices"][2]["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=all"],
                                                    "deviceNodes": [{"path": "/dev/nvidia0"}, {"path": "/dev/nvidia1"}]}
    assert [h["path"] for h in spec["containerEdits"]["hooks"]] == [G.CDI_HOOK] and "/bin/" not in G.CDI_HOOK
    init = (Path(G.__file__).parent / "node-init.sh").read_text()
    sed = re.search(r"sed -n '([^']+)' \"\$GPU/cdi.yaml\"", init).group(1)
    made = subprocess.run(["sed", "-n", sed, str(src / "gpu" / "cdi.yaml")], capture_output=True, text=True).stdout
    assert sorted(set(made.split())) == ["nvidia0", "nvidia1", "nvidiactl"]
    assert G.daemon_runtimes(G.GpuShape(gpus=2), cdi=True) == {"features": {"cdi": True}}
    assert "nvidia" in G.daemon_runtimes(G.GpuShape(gpus=2))["runtimes"] and G.daemon_runtimes(G.NO_GPU) == {}
    G.write_node(src, 1, G.GpuShape(gpus=2))  # a node of the hook's kind has no spec
    assert not (src / "gpu" / "cdi.yaml").exists()


PROBE = Path(__file__).resolve().parents[2] / "checks" / "cuda_probe.py"


@pytest.mark.parametrize("cuda_error,devices,said", [(None, 8, None), (802, 0, "Error 802: system not yet initialized"),
                                                     (803, 0, "Error 803: system has unsupported display driver")])
def test_the_cuda_shaped_torch_answers_the_probe_as_cuda_would_on_the_nodes_gpus(node, tmp_path, cuda_error, devices,
                                                                                  said):
    """checks/cuda_probe.py with the CUDA-shaped image's torch (fake_cuda_torch.py) over a node's GPUs as the hook
    placed them: all of them, or none with CUDA's own error where the node was given one (802: Fabric Manager)."""
    from bootstrap.cluster import cuda as CU

    workdir, gpu = node
    if cuda_error:
        G.set_gpus(workdir, "node1", cuda_error=cuda_error)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_bytes((G.HERE / "fake_cuda_torch.py").read_bytes())
    env = {"PYTHONPATH": str(tmp_path), "SANDBOX_NVIDIA_SMI_STATE": str(gpu / "state.json"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=60, env=env)
    doc = CU.parse_probe(r.stdout)
    assert (doc["torch"], doc["cuda"], doc["devices"]) == ("2.9.0+cu130", "13.0", devices), doc
    assert not CU.cpu_build(doc)
    if said is None:
        assert doc["error"] is None and CU.short(doc, 8) is None
    else:
        assert said in doc["error"], doc
        what, _, fix = CU.short(doc, 8)
        assert what.startswith("CUDA in the container sees 0 of the 8 GPU(s) nvidia-smi lists")
        assert ("Fabric Manager" in what and "nvidia-fabricmanager" in fix) if cuda_error == 802 else "803" in what
    env["SANDBOX_NVIDIA_SMI_STATE"] = str(tmp_path / "none.json")  # a container given no GPUs
    nodrv = CU.parse_probe(subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=60,
                                          env=env).stdout)
    assert nodrv["devices"] == 0 and "Found no NVIDIA driver" in nodrv["error"]
