"""The GPU-shaped sandbox: what makes a sandbox node a GPU host as far as SSH and Docker can tell.

For a node of shape `GpuShape(gpus=G, ib=...)` the node's /sandbox/gpu (a directory of this machine,
mounted read-only, so a test changes a node by writing here) holds:

- state.json: the node's GPUs (H100 80GB HBM3 as recorded in ../shared/gpu/, per-node UUIDs and bus
  ids), driver and CUDA version, memory used and utilisation. The node's `nvidia-smi`
  (fake_nvidia_smi.py) answers from it at each call.
- nvidia-smi and nvidia-container-runtime-hook (fake_gpu_hook.py): node-init installs both on the
  node's PATH before its dockerd starts, and daemon.json names the `nvidia` runtime, so `docker info`
  lists it and `docker run --gpus all` starts a container that sees the node's GPUs.
- class/infiniband/<hca>/ports/1/...: the InfiniBand (or RoCE) ports as the kernel shows them under
  /sys/class/infiniband; node-init mounts class/ over /sys/class for the node's sshd (its own mount
  namespace: dockerd keeps the real /sys/class) and makes /dev/infiniband/uverbs<N>.

A node whose GPUs come through CDI (the odd node of a mixed rack, layout.MIXED_HOST) gets no hook on
PATH and no `nvidia` runtime: cdi.yaml is a CDI spec for nvidia.com/gpu (one device per GPU and `all`,
each a device node /dev/nvidia<N> and NVIDIA_VISIBLE_DEVICES, and the same fake hook as the spec's
prestart hook, at CDI_HOOK, off PATH); node-init puts it in /etc/cdi, and daemon.json turns Docker's
CDI on, so `docker run --device nvidia.com/gpu=all` gives a container the node's GPUs and `--gpus` fails.

Nothing here talks to Docker; cluster.py writes these files when it prepares a node.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from bootstrap.remote import docker as DK

#: ../shared/gpu/h100-nvidia-smi-query.csv and h100-nvidia-smi.txt
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_MIB = 81559
DRIVER = "580.159.04"
CUDA = "13.0"
IB_KINDS = ("infiniband", "roce")
RATE = {"infiniband": "400 Gb/sec (4X NDR)", "roce": "200 Gb/sec (4X HDR)"}
HERE = Path(__file__).resolve().parent
SCRIPTS = {"nvidia-smi": HERE / "fake_nvidia_smi.py", "nvidia-container-runtime-hook": HERE / "fake_gpu_hook.py"}


@dataclass(frozen=True)
class GpuShape:
    """What every node of a GPU-shaped sandbox looks like (a test may then change one node)."""

    gpus: int = 0
    #: "infiniband", "roce" or None (no HCA)
    ib: str | None = None
    #: HCAs per node (mlx5_0, mlx5_1, ...), one port each
    hcas: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.gpus <= 16:
            raise ValueError(f"gpus per node must be 0 to 16, not {self.gpus}")
        if self.ib is not None and self.ib not in IB_KINDS:
            raise ValueError(f"ib must be one of {', '.join(IB_KINDS)}, not {self.ib!r}")
        if not 1 <= self.hcas <= 8:
            raise ValueError(f"hcas per node must be 1 to 8, not {self.hcas}")

    @property
    def shaped(self) -> bool:
        return self.gpus > 0 or self.ib is not None

    def to_dict(self) -> dict:
        return {"gpus": self.gpus, "ib": self.ib, "hcas": self.hcas}

    @classmethod
    def from_dict(cls, d: dict | None) -> "GpuShape":
        d = d or {}
        return cls(int(d.get("gpus", 0)), d.get("ib"), int(d.get("hcas", 1)))

    def describe(self) -> str:
        if not self.shaped:
            return "CPU nodes"
        ib = f", {self.hcas} {'InfiniBand' if self.ib == 'infiniband' else 'RoCE'} HCA(s)" if self.ib else ""
        return f"{self.gpus} GPU(s) per node{ib}"


#: a CPU sandbox (the default)
NO_GPU = GpuShape()


def gpu_state(node: int, shape: GpuShape) -> dict:
    """nvidia-smi's state for node number `node` (1-based): distinct UUIDs and bus ids per node."""
    return {"driver": DRIVER, "cuda": CUDA, "gpus": [
        {"index": i, "name": GPU_NAME, "uuid": f"GPU-5a{node:06x}-{i:04x}-4b1e-9c2d-00000000{node:02x}{i:02x}",
         "bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0", "memory_total": GPU_MEMORY_MIB, "memory_used": 0,
         "utilization": 0}
        for i in range(shape.gpus)]}


def ib_port_files(node: int, hca: int, kind: str) -> dict[str, str]:
    """The files of port 1 of HCA `hca` (relative to ports/1), as the kernel writes them."""
    guid = f"fe80:0000:0000:0000:0c42:a1ff:fe{node:02x}:{hca:04x}"
    files = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": RATE[kind],
             "link_layer": "InfiniBand" if kind == "infiniband" else "Ethernet",
             "gids/0": guid, "gid_attrs/types/0": "IB/RoCE v1" if kind == "roce" else ""}
    if kind == "roce":  # as a ConnectX port's table is (show_gids): fe80:: v1 and v2, then the IPv4 address v1 and v2
        ndev = f"ens{hca + 1}f0np0"
        ipv4 = f"0000:0000:0000:0000:0000:ffff:0a0a:{node:02x}{hca:02x}"
        for i, (gid, kind_) in enumerate(((guid, "IB/RoCE v1"), (guid, "RoCE v2"), (ipv4, "IB/RoCE v1"),
                                          (ipv4, "RoCE v2"))):
            files |= {f"gids/{i}": gid, f"gid_attrs/types/{i}": kind_, f"gid_attrs/ndevs/{i}": ndev}
    return files


def write_node(src: Path, node: int, shape: GpuShape, cdi: bool = False) -> None:
    """Make (or clear) the GPU shape of the node whose /sandbox is `src` (`cdi`: its GPUs through CDI)."""
    gpu = src / "gpu"
    if gpu.exists():
        shutil.rmtree(gpu)
    if not shape.shaped:
        return
    gpu.mkdir(parents=True)
    for name, path in SCRIPTS.items():
        shutil.copyfile(path, gpu / name)
        (gpu / name).chmod(0o755)
    (gpu / "state.json").write_text(json.dumps(gpu_state(node, shape), indent=1) + "\n")
    if cdi and shape.gpus:
        (gpu / "cdi.yaml").write_text(yaml.safe_dump(cdi_spec(shape.gpus), sort_keys=False))
    if shape.ib:
        for h in range(shape.hcas):
            port = gpu / "class" / "infiniband" / f"mlx5_{h}" / "ports" / "1"
            for rel, text in ib_port_files(node, h, shape.ib).items():
                (port / rel).parent.mkdir(parents=True, exist_ok=True)
                (port / rel).write_text(text + "\n")
        (gpu / "uverbs").write_text(f"{shape.hcas}\n")


def daemon_runtimes(shape: GpuShape, cdi: bool = False) -> dict:
    """daemon.json's addition: the `nvidia` runtime the NVIDIA Container Toolkit registers, or (GPUs
    through CDI) Docker's CDI on (Docker 25-28.1: a feature flag)."""
    if not shape.gpus:
        return {}
    return {"features": {"cdi": True}} if cdi else {"runtimes": {"nvidia": {"path": "runc", "runtimeArgs": []}}}


#: Where a CDI node keeps the fake hook: off PATH, so only the CDI spec runs it.
CDI_HOOK = "/usr/local/lib/sandbox-gpu/nvidia-container-runtime-hook"


def cdi_spec(gpus: int) -> dict:
    """A CDI spec (as `nvidia-ctk cdi generate` writes one, reduced to what the sandbox fakes) for `gpus` GPUs."""
    hook = {"hookName": "prestart", "path": CDI_HOOK, "args": ["nvidia-container-runtime-hook", "prestart"],
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin"]}

    def device(name: str, indexes: list[int]) -> dict:
        return {"name": name, "containerEdits": {
            "env": [f"NVIDIA_VISIBLE_DEVICES={name}"],
            "deviceNodes": [{"path": f"/dev/nvidia{i}"} for i in indexes]}}
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "devices": [device(str(i), [i]) for i in range(gpus)] + [device("all", list(range(gpus)))],
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}], "hooks": [hook]}}


# --- changing one node (what goes wrong on a real rack) ---------------------------------------------

def node_dir(workdir: Path, name: str) -> Path:
    return Path(workdir) / "nodes" / name / "sandbox" / "gpu"


def set_gpus(workdir: Path, name: str, *, count: int | None = None, driver: str | None = None,
             utilization: int | None = None, memory_used: int | None = None, cuda_error: int | None = None) -> None:
    """Change node `name`'s GPUs as nvidia-smi reports them from now on (containers started before
    keep what they were given). `cuda_error`: what CUDA says when it initialises there (802: the
    Fabric Manager is not running, 803, 804; 0: CUDA works), read by the CUDA-shaped image's torch
    (fake_cuda_torch.py) while nvidia-smi lists the GPUs as before."""
    path = node_dir(workdir, name) / "state.json"
    state = json.loads(path.read_text())
    if cuda_error is not None:
        state["cuda_error"] = cuda_error
    if count is not None:
        state["gpus"] = state["gpus"][:count]
    if driver is not None:
        state["driver"] = driver
    for g in state["gpus"]:
        if utilization is not None:
            g["utilization"] = utilization
        if memory_used is not None:
            g["memory_used"] = memory_used
    path.write_text(json.dumps(state, indent=1) + "\n")


def set_port(workdir: Path, name: str, hca: str = "mlx5_0", *, state: str | None = None,
             link_layer: str | None = None, roce_v2: bool | None = None, address: bool | None = None) -> None:
    """Change one port of node `name` as /sys/class/infiniband shows it from now on (`address` False: its
    network device loses its IPv4 address, so only the link-local GIDs are left)."""
    port = node_dir(workdir, name) / "class" / "infiniband" / hca / "ports" / "1"
    if state is not None:
        (port / "state").write_text({"ACTIVE": "4: ACTIVE", "DOWN": "1: DOWN", "INIT": "2: INIT"}[state] + "\n")
    if link_layer is not None:
        (port / "link_layer").write_text(link_layer + "\n")
    if roce_v2 is False:
        for t in (port / "gid_attrs" / "types").iterdir():
            if t.read_text().strip() == "RoCE v2":
                t.write_text("IB/RoCE v1\n")
    if address is False:  # an entry no address fills: all zeros, and no type (the kernel answers EINVAL)
        for g in (port / "gids").iterdir():
            if "ffff" in g.read_text():
                g.write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
                (port / "gid_attrs" / "types" / g.name).unlink(missing_ok=True)


def make_efa(workdir: Path, name: str) -> list[str]:
    """Make node `name`'s HCAs AWS EFA devices as the kernel shows them (each renamed rdmap<16+N>s27, its
    port's link_layer "Unknown", only GID 0, its PCI driver `efa`): returns the new names. The test undoes it
    by removing them and writing back the files it saved."""
    root = node_dir(workdir, name) / "class" / "infiniband"
    made = []
    for h, hca in enumerate(sorted(p for p in root.iterdir() if p.name.startswith("mlx5_"))):
        new = root / f"rdmap{16 + h}s27"
        hca.rename(new)
        port = new / "ports" / "1"
        (port / "link_layer").write_text("Unknown\n")
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            for f in (port / sub).iterdir() if (port / sub).is_dir() else ():
                if f.name != "0":
                    f.unlink()
        (new / "device").mkdir(exist_ok=True)
        (new / "device" / "driver").symlink_to("../../../bus/pci/drivers/efa")
        made.append(new.name)
    return made


#: Rewrites the GPUs of a running container's nvidia-smi (the file the hook placed), as a busy GPU
#: shows to nvidia-smi at once: python3 -c CODE UTILIZATION MEMORY_USED (in the container).
_LOAD_CODE = """
import json, os, sys
p = '/usr/local/bin/nvidia-smi.json'
if os.path.exists(p):
    s = json.load(open(p))
    for g in s.get('gpus', []):
        g['utilization'] = int(sys.argv[1]); g['memory_used'] = int(sys.argv[2])
    json.dump(s, open(p, 'w'))
    print('loaded')
"""


def set_load(workdir: Path, name: str, node_container: str, *, utilization: int, memory_used: int) -> int:
    """Make node `name`'s GPUs busy (or idle) as nvidia-smi shows them from now on, on the node and in
    every running container that was given GPUs (a real GPU's load shows in every process at once).
    Returns how many containers were changed."""
    import subprocess

    set_gpus(workdir, name, utilization=utilization, memory_used=memory_used)
    loop = ('for c in $(docker ps -q); do docker exec "$c" python3 -c "$0" "$1" "$2" 2>/dev/null; done')
    r = subprocess.run(list(DK.exec_argv(node_container, "sh", "-c", loop, _LOAD_CODE, str(utilization),
                                         str(memory_used))), capture_output=True, text=True, timeout=120)
    return r.stdout.split().count("loaded")


def break_hook(workdir: Path, name: str, message: str | None) -> None:
    """Make every `--gpus` container on node `name` fail to start with `message` (None: heal)."""
    path = node_dir(workdir, name) / "hook-error"
    if message is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(message.rstrip("\n") + "\n")
