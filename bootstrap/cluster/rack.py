"""The rack preflight: what breaks a multi-node vLLM later (a hung collective, a cryptic Ray or NCCL
error), checked on every node before `up` changes anything, and on demand by `doctor`.

Facts in, findings out; pure. One command per host (RACK_FACTS, read by `parse_rack`) gives the
host's clock, its links (state, MTU), its addresses, the size of /dev/shm and its InfiniBand/RoCE
ports as the kernel shows them under /sys/class/infiniband; the GPUs and the nofile limit come
from the other facts. `check_rack` compares the nodes and returns a `RackFinding` per problem: the
host, what is wrong or differs, and the fix. Each finding belongs to a named check (CHECKS) that an
expert can skip (`up --skip-check NAME`).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

# moved to bootstrap.cluster.facts (re-floor): the rack facts' command and parser
from bootstrap.cluster.facts import _SCRIPT as _SCRIPT
from bootstrap.cluster.facts import CAP_SYS_RESOURCE as CAP_SYS_RESOURCE
from bootstrap.cluster.facts import RACK_FACTS as RACK_FACTS
from bootstrap.cluster.facts import IBPort as IBPort
from bootstrap.cluster.facts import Link, RackFacts
from bootstrap.cluster.facts import parse_dockerd as parse_dockerd
from bootstrap.cluster.facts import parse_ib_port as parse_ib_port
from bootstrap.cluster.facts import parse_link as parse_link
from bootstrap.cluster.facts import parse_rack as parse_rack

if TYPE_CHECKING:
    from bootstrap.cluster.facts import HostFacts
    from bootstrap.model import Host

#: Every check, by the name `--skip-check` takes, with what it looks at.
CHECKS: dict[str, str] = {
    "gpu-driver": "the NVIDIA driver version is the same on every node",
    "cuda-driver": "the NVIDIA driver runs the CUDA version the image is built for (where the image is on the node)",
    "data-interface": "the interface holding the node's IP exists and is up",
    "socket-ifname": "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select an interface of the node",
    "mtu": "the data-plane interfaces have the same MTU on every node",
    "ib-port": "the InfiniBand/RoCE ports NCCL will use are ACTIVE",
    "ib-link-layer": "the ports' link layer (InfiniBand or Ethernet) is the same on every node",
    "roce-gid": "a RoCE port has a RoCE v2 GID",
    "ib-hca": "every HCA NCCL_IB_HCA names exists on the node",
    "clock": "the nodes' clocks agree",
    "shm": "/dev/shm is large enough where containers share the host's (ipc_host)",
    "nofile": "the open-files limit is high enough for Ray and vLLM",
    "image": "the cluster image has the same ID on every node that holds it",
    "ports": "every node opens TCP to the others' cluster ports (Ray GCS, vLLM, an ephemeral port) on the "
             "data-plane IPs, tested between the nodes",
    "memlock": "Docker can give the containers the unlimited locked memory RDMA needs (infiniband)",
}
#: Clocks further apart than this (seconds) are refused: Ray's and vLLM's timeouts, logs, tokens.
MAX_SKEW_S = 2.0
#: With --ipc host the containers use the host's /dev/shm (NCCL's SHM transport, vLLM's broadcast).
MIN_SHM_BYTES = 1 << 30
#: The open-files hard limit below which a node is refused: Ray and vLLM hold thousands of files and
#: sockets on a busy node, and the containers get the host's hard limit (bootstrap.cluster.plan). Hosts
#: left at 1024 or 4096 fail late with "Too many open files"; the sandbox's nodes have 20000
#: (../shared/TESTBED.md), a usual systemd host 524288 or more.
MIN_NOFILE = 8192

# -- selections (NCCL's and Gloo's variables) ------------------------------------------------------
def select_interfaces(var: str, value: str, names: Sequence[str]) -> list[str] | None:
    """The interface names `value` selects among `names`; None when the value is not valid syntax for
    `var`. NCCL_SOCKET_IFNAME: comma-separated prefixes; a leading ^ excludes them, a leading =
    matches names exactly. GLOO_SOCKET_IFNAME: comma-separated exact names. TP_SOCKET_IFNAME: one
    exact name."""
    spec = value.strip()
    if var == "NCCL_SOCKET_IFNAME":
        exclude = spec.startswith("^")
        spec = spec[1:] if exclude else spec
        exact = spec.startswith("=")
        spec = spec[1:] if exact else spec
        wanted = [n.strip() for n in spec.split(",") if n.strip()]

        def hit(name: str) -> bool:
            return any(name == n if exact else name.startswith(n) for n in wanted)
        return [n for n in names if hit(n) != exclude]
    if spec.startswith(("^", "=")):
        return None
    wanted = [n.strip() for n in spec.split(",") if n.strip()]
    if var == "TP_SOCKET_IFNAME":
        wanted = wanted[:1]
    return [n for n in names if n in wanted]


def ib_hcas(value: str) -> tuple[bool, list[str]]:
    """NCCL_IB_HCA: (exclusive list?, the HCA names it names). `mlx5_0:1,mlx5_1`, `=mlx5_0`,
    `^mlx5_2` (an exclusion: not a list of HCAs the node must have)."""
    spec = value.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^=")
    return exclude, [p.split(":")[0].strip() for p in spec.split(",") if p.split(":")[0].strip()]


# -- the checks -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RackNode:
    """What the checks know of one node."""

    host: str
    #: the data-plane IP (the inventory's ip)
    ip: str
    facts: RackFacts
    #: the node container's environment (the cluster's with the host's over it)
    env: Mapping[str, str] = field(default_factory=dict)
    #: NVIDIA driver version (None: not a GPU host, or unknown)
    driver: str | None = None
    nofile_hard: int | None = None
    #: ID of the cluster image on the node (None: not there yet)
    image_id: str | None = None
    #: the newest CUDA the node's driver runs (nvidia-smi --version), and the image's CUDA variables
    driver_cuda: str | None = None
    image_cuda: Mapping[str, str] = field(default_factory=dict)


def nodes_from(hosts: Sequence["Host"], facts: Mapping[str, "HostFacts"]) -> list[RackNode]:
    """A RackNode for each host whose facts hold the rack facts, in the hosts' order: its data-plane IP,
    the node container's environment (plan.node_env), the driver of its first GPU, its nofile limit."""
    from bootstrap.cluster.plan import node_env

    return [RackNode(h.name, h.ip, f.rack, node_env(h), f.gpus[0].driver if f.gpus else None, f.nofile_hard,
                     f.image_id, f.driver_cuda, f.image_cuda)
            for h in hosts if (f := facts.get(h.name)) is not None and f.rack is not None]


@dataclass(frozen=True)
class RackFinding:
    check: str
    host: str
    what: str
    fix: str


def _majority(values: Mapping[str, object]) -> object | None:
    counts = Counter(values.values()).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0] if counts else None


def _differs(check: str, values: Mapping[str, object], what: str, fix: str) -> list[RackFinding]:
    """A finding for each node whose value is not the majority's (every node when there is none)."""
    if len(set(values.values())) <= 1:
        return []
    common = _majority(values)
    listed = ", ".join(f"{h} {v}" for h, v in values.items())
    return [RackFinding(check, h, f"{what}: {v}, " + (f"the other nodes {common}" if common is not None
                                                       else f"the nodes differ ({listed})"), fix)
            for h, v in values.items() if v != common]


def _version(text: str | None) -> tuple[int, ...] | None:
    """"12.8.1" -> (12, 8, 1); None when it does not start with a number."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in m[1].split(".")) if m else None


def image_cuda_need(env: Mapping[str, str]) -> str | None:
    """The CUDA (major.minor) an image is built for: CUDA_VERSION, else NVIDIA_REQUIRE_CUDA's cuda>=X."""
    v = _version(env.get("CUDA_VERSION"))
    if v is None:
        m = re.search(r"(?:^|\s)cuda>=(\d+\.\d+)", env.get("NVIDIA_REQUIRE_CUDA", ""))
        v = _version(m[1]) if m else None
    return ".".join(map(str, v[:2])) if v else None


def forward_compatible(require: str, driver: str | None) -> bool:
    """Whether NVIDIA_REQUIRE_CUDA lets this driver run the image anyway: its space-separated
    alternatives are ORed, the comma-separated constraints of one ANDed (the NVIDIA Container
    Toolkit's rule), and `brand=...,driver>=535,driver<536` alternatives name the drivers the image's
    CUDA forward-compatibility libraries serve. The GPU brand is not compared (any brand passes)."""
    d = _version(driver)
    if d is None:
        return False
    for alt in require.split():
        conds = [c for c in alt.split(",") if c.startswith("driver")]
        if not conds or any(not c.startswith("driver") and not c.startswith("brand=") for c in alt.split(",")):
            continue
        ok = True
        for c in conds:
            m = re.match(r"driver(>=|<=|<|>|=)(\S+)", c)
            want = _version(m[2]) if m else None
            if want is None:
                ok = False
                break
            have = d[:len(want)]
            ok = {">=": have >= want, "<=": have <= want, "<": have < want, ">": have > want, "=": have == want}[m[1]]
            if not ok:
                break
        if ok:
            return True
    return False


def _cuda_check(n: RackNode) -> list[RackFinding]:
    need = image_cuda_need(n.image_cuda)
    have = _version(n.driver_cuda)
    if need is None or have is None or have[:2] >= _version(need)[:2]:
        return []
    if forward_compatible(n.image_cuda.get("NVIDIA_REQUIRE_CUDA", ""), n.driver):
        return []
    driver = f"NVIDIA driver {n.driver}" if n.driver else "NVIDIA driver"
    return [RackFinding("cuda-driver", n.host, f"its {driver} runs CUDA up to {n.driver_cuda}, "
                        f"the image is built for CUDA {need}",
                        f"install a driver for CUDA {need} or newer on {n.host} (`nvidia-smi` shows its \"CUDA "
                        f"Version\"), or use an image built for CUDA {n.driver_cuda} or older")]


def _data_link(node: RackNode) -> Link | None:
    holder = next((i for i, a in node.facts.addrs if a == node.ip), None)
    return next((lk for lk in node.facts.links if lk.name == holder), None) if holder else None


def _node_checks(n: RackNode, *, infiniband: bool, ipc_host: bool) -> list[RackFinding]:
    out: list[RackFinding] = _cuda_check(n)
    f = n.facts
    names = [lk.name for lk in f.links]
    if f.addrs:
        holder = next((i for i, a in f.addrs if a == n.ip), None)
        link = _data_link(n)
        if holder is None:
            out.append(RackFinding("data-interface", n.host, f"no interface holds its data-plane IP {n.ip}",
                                   f"set hosts[].ip of {n.host} to an address `ip -o addr` lists on it"))
        elif link is not None and not link.up:
            out.append(RackFinding("data-interface", n.host, f"{holder}, which holds {n.ip}, is down",
                                   f"bring it up on {n.host} (`ip link set {holder} up`; check the cable/switch port)"))
    if names:
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            value = n.env.get(var)
            if not value:
                continue
            chosen = select_interfaces(var, value, names)
            if not chosen:
                holder = next((i for i, a in f.addrs if a == n.ip), None)
                out.append(RackFinding(
                    "socket-ifname", n.host, f"{var}={value} selects no interface (it has {', '.join(names)})",
                    f"set {var}" + (f"={holder} (the interface holding {n.ip})" if holder else "")
                    + f" in {n.host}'s env"))
    if infiniband:
        if not f.ib:
            out.append(RackFinding("ib-port", n.host, "no InfiniBand/RoCE port under /sys/class/infiniband",
                                   "load the HCA driver (mlx5_ib) and check `ibstat`, or set infiniband: false"))
        else:
            exclude, wanted = ib_hcas(n.env.get("NCCL_IB_HCA", ""))
            have = sorted({p.hca for p in f.ib})
            if wanted and not exclude:
                missing = [h for h in wanted if h not in have]
                if missing:
                    out.append(RackFinding("ib-hca", n.host, f"NCCL_IB_HCA names {', '.join(missing)}, which it "
                                           f"does not have (it has {', '.join(have)})",
                                           f"set NCCL_IB_HCA in {n.host}'s env to HCAs it has"))
            used = [p for p in f.ib if (p.hca in wanted) != exclude] if wanted else list(f.ib)
            for p in used:
                if p.state != "ACTIVE":
                    out.append(RackFinding("ib-port", n.host, f"{p.hca} port {p.port} is {p.state}, not ACTIVE",
                                           f"check the cable and switch port of {p.hca} (`ibstat {p.hca}`), or "
                                           "leave the HCA out of NCCL_IB_HCA"))
                if p.link_layer == "Ethernet" and not p.rocev2:
                    out.append(RackFinding("roce-gid", n.host, f"{p.hca} port {p.port} is RoCE without a RoCE v2 GID",
                                           "give the interface an IP address (RoCE v2 GIDs follow it), then set "
                                           "NCCL_IB_GID_INDEX to the RoCE v2 entry (`show_gids`)"))
    if infiniband and f.dockerd_sys_resource is False and f.dockerd_memlock not in (None, -1):
        out.append(RackFinding("memlock", n.host, f"its Docker cannot give the containers unlimited locked memory "
                               f"(--ulimit memlock=-1, which RDMA needs): dockerd's own limit is "
                               f"{f.dockerd_memlock / (1 << 20):.0f} MiB and it lacks CAP_SYS_RESOURCE (rootless "
                               "or confined Docker)", "run dockerd with LimitMEMLOCK=infinity (systemctl edit "
                               "docker) as root, or set infiniband: false"))
    if ipc_host and f.shm_bytes is not None and f.shm_bytes < MIN_SHM_BYTES:
        out.append(RackFinding("shm", n.host, f"/dev/shm is {f.shm_bytes / (1 << 20):.0f} MiB and the containers "
                               "share it (ipc_host)", "enlarge it (`mount -o remount,size=16G /dev/shm`) or set "
                               "cluster.ipc_host: false with a shm_size"))
    if n.nofile_hard is not None and n.nofile_hard < MIN_NOFILE:
        out.append(RackFinding("nofile", n.host, f"the open-files limit is {n.nofile_hard}, below {MIN_NOFILE}",
                               "raise the hard nofile limit (LimitNOFILE in docker.service, "
                               "/etc/security/limits.conf)"))
    return out


def check_rack(nodes: Sequence[RackNode], *, infiniband: bool = False, ipc_host: bool = True,
               skip: frozenset[str] = frozenset()) -> list[RackFinding]:
    """Every finding of the checks not skipped, the head's first (put it first), then by host."""
    out: list[RackFinding] = []
    for n in nodes:
        out += _node_checks(n, infiniband=infiniband, ipc_host=ipc_host)
    out += _differs("gpu-driver", {n.host: n.driver for n in nodes if n.driver}, "NVIDIA driver",
                    "install the same driver on every node (`nvidia-smi` shows it)")
    # a tag moved on some nodes only: they would run another build of the image (nodes without it
    # get it from `up`)
    out += _differs("image", {n.host: n.image_id.removeprefix("sha256:")[:12] for n in nodes if n.image_id},
                    "the image's ID", "give every node the same image: `bootstrap up --pull` pulls it again "
                    "everywhere (or `--load-image` sends this machine's)")
    mtus = {n.host: lk.mtu for n in nodes if (lk := _data_link(n)) is not None and lk.mtu}
    out += _differs("mtu", mtus, "data-plane MTU", "give the data-plane interfaces one MTU (`ip link set DEV mtu N`, "
                    "and the switch ports)")
    if infiniband:
        layers = {n.host: "/".join(sorted({p.link_layer for p in n.facts.ib})) for n in nodes if n.facts.ib}
        out += _differs("ib-link-layer", layers, "InfiniBand link layer",
                        "use one fabric for NCCL: InfiniBand on every node or RoCE on every node")
    clocks = [(n.host, n.facts.clock_offset) for n in nodes if n.facts.clock_offset is not None]
    if clocks:
        ref_host, ref = clocks[0]
        for host, off in clocks[1:]:
            if abs(off - ref) > MAX_SKEW_S:
                out.append(RackFinding("clock", host, f"its clock is {off - ref:+.1f} s from {ref_host}'s",
                                       "enable time sync on every node (`timedatectl set-ntp true`, chrony)"))
    order = {n.host: i for i, n in enumerate(nodes)}
    return sorted((f for f in out if f.check not in skip), key=lambda f: (order.get(f.host, 0), f.check))
