"""The sandbox's names, addresses and records: its containers and network, SandboxNode, SandboxInfo, the subnet plan."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from . import gpu as GPU
from . import links as LK
from ._util import (
    SandboxBadInput,
    SandboxError,
)
from .gpu import GpuShape

NETWORK = "bootstrap-sandbox"
DEFAULT_SUBNET = "172.31.240.0/24"
REGISTRY_CONTAINER = "bootstrap-sandbox-registry"
NODE_CONTAINER_PREFIX = "bootstrap-sandbox-node"
REGISTRY_PORT = 5000
#: Repository of the vLLM image inside the sandbox registry.
REMOTE_REPO = "bootstrap/vllm-cpu"
#: ... and of its Ray-less variant (`sandbox up --without-ray`).
RAY_LESS_REMOTE_REPO = "bootstrap/vllm-cpu-noray"
CUDA_SHAPED_REMOTE_REPO = "bootstrap/vllm-cpu-fakecuda"
#: Repository of the registry mirror's image (cluster.image_mirror) inside the sandbox registry.
MIRROR_REMOTE_REPO = "bootstrap/nginx"
KIND_LABEL = "bootstrap.sandbox.kind"
KINDS = ("full", "sshd")
#: Offsets inside the subnet: .1 gateway, .2 registry, .11.. nodes.
REGISTRY_OFFSET = 2
FIRST_NODE_OFFSET = 11
STATE_VERSION = 1
#: The odd node of a mixed rack (`sandbox up --mixed`: node3, the third node): Debian 13 and its Docker
#: (26.1) with the containerd image store on, and its GPUs (a GPU-shaped sandbox) through CDI only: a CDI
#: spec for nvidia.com/gpu in /etc/cdi and Docker's CDI on, no toolkit hook on PATH and no `nvidia` runtime.
MIXED_HOST = "debian13"
MIXED_NODE = 3
#: What the odd node's Docker is, as `sandbox up` says it.
MIXED_DOCKER = "Docker 26.1, containerd image store"
#: What every other node is as a host: Debian 12 and its Docker (20.10) with the toolkit's hook.
HOST = "debian12"


def node_host(number: int, mixed: bool) -> str:
    """What node `number` (1-based) is as a host."""
    return MIXED_HOST if mixed and number == MIXED_NODE else HOST


def mixed_refusal(nodes: int, kind: str) -> str | None:
    """Why `--mixed` cannot make a sandbox of `nodes` nodes of this kind (None: it can)."""
    if kind != "full" or nodes < MIXED_NODE:
        return (f"--mixed needs --kind full and --nodes {MIXED_NODE} or more (node{MIXED_NODE} is the "
                f"{MIXED_HOST} one)")
    return None

#: Capabilities that make docker-in-docker work where --privileged does not (no CAP_SYS_RESOURCE):
#: `--cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt
#: apparmor=unconfined -v /sys/fs/cgroup:/sys/fs/cgroup`, as Docker SDK arguments.
FULL_NODE_OPTIONS = {
    "cap_add": ["ALL"], "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
}
FULL_NODE_VOLUMES = ("/sys/fs/cgroup:/sys/fs/cgroup",)


@dataclass(frozen=True)
class SandboxNode:
    name: str
    ip: str
    container: str
    #: what the node is as a host (MIXED_HOST for the odd node of a mixed rack, `sandbox up --mixed`)
    host: str = HOST

    @property
    def odd(self) -> bool:
        """The odd node of a mixed rack (MIXED_HOST), not the usual HOST."""
        return self.host != HOST

    @property
    def docker(self) -> str:
        """Its Docker, as `sandbox up` says it."""
        return MIXED_DOCKER if self.odd else "Docker 20.10, classic image store"


@dataclass(frozen=True)
class SandboxInfo:
    workdir: Path
    network: str
    subnet: str
    #: "IP:5000", as the nodes reach the registry.
    registry: str
    #: The vLLM CPU image reference written into the inventory (nodes pull it from the registry;
    #: the same reference is tagged on this machine for `docker save`).
    image: str
    nodes: tuple[SandboxNode, ...]
    inventory: Path
    key: Path
    known_hosts: Path
    #: "full" (sshd + dockerd) or "sshd" (sshd only).
    kind: str = "full"
    #: GPUs and InfiniBand/RoCE ports each node shows (bootstrap.sandbox.gpu); none by default.
    gpu: GpuShape = GPU.NO_GPU
    #: send rates of the registry's and the nodes' interfaces (bootstrap.sandbox.links); none by default.
    links: LK.LinkShape = LK.NO_LINKS

    @property
    def mixed(self) -> bool:
        """A mixed rack: one node is not Debian 12 with Docker 20.10 (MIXED_HOST)."""
        return any(n.odd for n in self.nodes)

    @property
    def gpu_inventory(self) -> Path | None:
        """The same nodes as a GPU cluster (inventory-gpu.yaml), for a sandbox with GPUs."""
        return gpu_inventory_path(self.workdir) if self.gpu.gpus else None

    @property
    def head(self) -> SandboxNode:
        return self.nodes[0]

    @property
    def sudo_password_file(self) -> Path:
        """The password of every node's login that is not root (recipes.SUDO_USER), which its sudo asks
        for: 0600, made once per sandbox (nodes.sudo_password)."""
        return sudo_password_path(self.workdir)


def sudo_password_path(workdir: Path) -> Path:
    return workdir / "sudo-password"


# --- helpers ---------------------------------------------------------------------------------------


def subnet_from_env() -> str:
    return os.environ.get("BOOTSTRAP_SANDBOX_SUBNET", DEFAULT_SUBNET)


def registry_host_port() -> int:
    """The registry's port on this machine's loopback (env BOOTSTRAP_SANDBOX_REGISTRY_PORT)."""
    value = os.environ.get("BOOTSTRAP_SANDBOX_REGISTRY_PORT", str(REGISTRY_PORT))
    try:
        port = int(value)
    except ValueError:
        raise SandboxBadInput(f"BOOTSTRAP_SANDBOX_REGISTRY_PORT={value!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise SandboxBadInput(f"BOOTSTRAP_SANDBOX_REGISTRY_PORT={value!r} is not a port number")
    return port


#: The private ranges (RFC 1918) a sandbox network may take.
_PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")


def plan_addresses(subnet: str, nodes: int) -> tuple[str, str, list[str]]:
    """(gateway, registry IP, node IPs) for a subnet; raises when the nodes do not fit."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise SandboxBadInput(f"sandbox subnet {subnet!r} (BOOTSTRAP_SANDBOX_SUBNET) is not an IPv4 network: "
                              f"{exc}") from None
    if not any(net.subnet_of(ipaddress.IPv4Network(p)) for p in _PRIVATE):
        raise SandboxBadInput(f"sandbox subnet {subnet} (BOOTSTRAP_SANDBOX_SUBNET) is not a private network: a "
                              "Docker bridge network of its own needs one inside 10.0.0.0/8, 172.16.0.0/12 or "
                              "192.168.0.0/16 (not loopback, link-local, multicast or public addresses)")
    if nodes < 1:
        raise SandboxError(f"a sandbox needs at least one node, not {nodes}")
    usable = net.num_addresses - 1 - FIRST_NODE_OFFSET  # minus the broadcast address
    if nodes > usable:
        raise SandboxBadInput(
            f"{nodes} nodes do not fit in {subnet} (at most {max(usable, 0)}): "
            "set BOOTSTRAP_SANDBOX_SUBNET to a larger network"
        )
    ips = [str(net[FIRST_NODE_OFFSET + i]) for i in range(nodes)]
    return str(net[1]), str(net[REGISTRY_OFFSET]), ips


def node_name(i: int) -> str:
    return f"node{i}"


def gpu_inventory_path(workdir: Path) -> Path:
    """The GPU-shaped sandbox's second inventory: the same nodes as a GPU cluster."""
    return Path(workdir) / "inventory-gpu.yaml"
