"""Every preflight check, one `Check` entry each (REGISTRY), with its judge; pure: a new check goes here.

What breaks a multi-node vLLM later (a hung collective, a cryptic Ray or NCCL error) is checked on
every node before `up` changes anything, and on demand by `doctor`. A judge reads what was seen
(registry.Seen: the facts its entry's `reads` names) and returns a registry.Finding per problem:
the host, what is wrong or differs, and the fix. A skippable check is one an expert can leave out
(`up --skip-check ID`); CHECKS lists those, with what each looks at.
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

from bootstrap.cluster import gpuaccess as GA
from bootstrap.cluster.facts import HostFacts, Link, platform_arch
from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.cluster.preflight import ports
from bootstrap.cluster.preflight.registry import Check, Finding, RackNode, Seen, by_host, judge
from bootstrap.cluster.preflight.rules import forward_compatible, ib_hcas, image_cuda_need, select_interfaces, version
from bootstrap.errors import PreflightFailed

#: Clocks further apart than this (seconds) are refused: Ray's and vLLM's timeouts, logs, tokens.
MAX_SKEW_S = 2.0
#: With --ipc host the containers use the host's /dev/shm (NCCL's SHM transport, vLLM's broadcast).
MIN_SHM_BYTES = 1 << 30
#: The open-files hard limit below which a node is refused: Ray and vLLM hold thousands of files and
#: sockets on a busy node, and the containers get the host's hard limit (bootstrap.cluster.plan). Hosts
#: left at 1024 or 4096 fail late with "Too many open files"; the sandbox's nodes have 20000
#: (../shared/TESTBED.md), a usual systemd host 524288 or more.
MIN_NOFILE = 8192


# -- each host on its own (reads "host") ---------------------------------------------------------------
def _nvidia_runtime(seen: Seen) -> list[Finding]:
    if not seen.want_gpus:
        return []
    found = []
    for name, f in seen.facts.items():
        if f.gpu_access is None:  # the toolkit not looked for: Docker's `nvidia` runtime, at least
            if "nvidia" not in f.runtimes:
                found.append(Finding("nvidia-runtime", name, "Docker has no NVIDIA runtime (--gpus would fail)",
                                     "install nvidia-container-toolkit and run `nvidia-ctk runtime configure "
                                     "--runtime=docker`"))
        elif (c := GA.choose(f.gpu_access, f.runtimes, f.docker_version)).way is None:
            found.append(Finding("nvidia-runtime", name, c.why, c.fix))
    return found


def _gpu_count(seen: Seen) -> list[Finding]:
    if not seen.want_gpus:
        return []
    return [Finding("gpu-count", name, f"nvidia-smi shows {n} GPU(s), the inventory expects {seen.want_gpus}",
                    "fix hosts[].gpus / cluster.gpus_per_node or the host")
            for name, f in seen.facts.items() if (n := len(f.gpus or ())) != seen.want_gpus]


# -- the nodes side by side (reads "rack") -------------------------------------------------------------
def _majority(values: Mapping[str, object]) -> object | None:
    counts = Counter(values.values()).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None
    return counts[0][0] if counts else None


def _differs(check: str, values: Mapping[str, object], what: str, fix: str) -> list[Finding]:
    """A finding for each node whose value is not the majority's (every node when there is none)."""
    if len(set(values.values())) <= 1:
        return []
    common = _majority(values)
    listed = ", ".join(f"{h} {v}" for h, v in values.items())
    return [Finding(check, h, f"{what}: {v}, " + (f"the other nodes {common}" if common is not None
                                                  else f"the nodes differ ({listed})"), fix)
            for h, v in values.items() if v != common]


def _holder(n: RackNode) -> str | None:
    """The interface holding the node's data-plane IP (None: none does)."""
    return next((i for i, a in n.facts.addrs if a == n.ip), None)


def _data_link(node: RackNode) -> Link | None:
    holder = _holder(node)
    return next((lk for lk in node.facts.links if lk.name == holder), None) if holder else None


def _gpu_driver(seen: Seen) -> list[Finding]:
    return _differs("gpu-driver", {n.host: n.driver for n in seen.nodes if n.driver}, "NVIDIA driver",
                    "install the same driver on every node (`nvidia-smi` shows it)")


def _cuda_driver(seen: Seen) -> list[Finding]:
    out = []
    for n in seen.nodes:
        need = image_cuda_need(n.image_cuda)
        have = version(n.driver_cuda)
        if need is None or have is None or have[:2] >= version(need)[:2]:
            continue
        if forward_compatible(n.image_cuda.get("NVIDIA_REQUIRE_CUDA", ""), n.driver):
            continue
        driver = f"NVIDIA driver {n.driver}" if n.driver else "NVIDIA driver"
        out.append(Finding("cuda-driver", n.host, f"its {driver} runs CUDA up to {n.driver_cuda}, "
                           f"the image is built for CUDA {need}",
                           f"install a driver for CUDA {need} or newer on {n.host} (`nvidia-smi` shows its \"CUDA "
                           f"Version\"), or use an image built for CUDA {n.driver_cuda} or older"))
    return out


def _data_interface(seen: Seen) -> list[Finding]:
    out = []
    for n in (n for n in seen.nodes if n.facts.addrs):
        holder, link = _holder(n), _data_link(n)
        if holder is None:
            out.append(Finding("data-interface", n.host, f"no interface holds its data-plane IP {n.ip}",
                               f"set hosts[].ip of {n.host} to an address `ip -o addr` lists on it"))
        elif link is not None and not link.up:
            out.append(Finding("data-interface", n.host, f"{holder}, which holds {n.ip}, is down",
                               f"bring it up on {n.host} (`ip link set {holder} up`; check the cable/switch port)"))
    return out


def _socket_ifname(seen: Seen) -> list[Finding]:
    out = []
    for n in seen.nodes:
        names = [lk.name for lk in n.facts.links]
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if names else ():
            value = n.env.get(var)
            if value and not select_interfaces(var, value, names):
                holder = _holder(n)
                out.append(Finding(
                    "socket-ifname", n.host, f"{var}={value} selects no interface (it has {', '.join(names)})",
                    f"set {var}" + (f"={holder} (the interface holding {n.ip})" if holder else "")
                    + f" in {n.host}'s env"))
    return out


def _mtu(seen: Seen) -> list[Finding]:
    mtus = {n.host: lk.mtu for n in seen.nodes if (lk := _data_link(n)) is not None and lk.mtu}
    return _differs("mtu", mtus, "data-plane MTU", "give the data-plane interfaces one MTU (`ip link set DEV mtu N`, "
                    "and the switch ports)")


def _used_ports(n: RackNode):
    """The IB ports NCCL will use on the node: those NCCL_IB_HCA selects (all without it)."""
    exclude, wanted = ib_hcas(n.env.get("NCCL_IB_HCA", ""))
    return [p for p in n.facts.ib if (p.hca in wanted) != exclude] if wanted else list(n.facts.ib)


def _ib_port(seen: Seen) -> list[Finding]:
    out = []
    for n in seen.nodes if seen.infiniband else ():
        if not n.facts.ib:
            out.append(Finding("ib-port", n.host, "no InfiniBand/RoCE port under /sys/class/infiniband",
                               "load the HCA driver (mlx5_ib) and check `ibstat`, or set infiniband: false"))
            continue
        out += [Finding("ib-port", n.host, f"{p.hca} port {p.port} is {p.state}, not ACTIVE",
                        f"check the cable and switch port of {p.hca} (`ibstat {p.hca}`), or "
                        "leave the HCA out of NCCL_IB_HCA") for p in _used_ports(n) if p.state != "ACTIVE"]
    return out


def _ib_link_layer(seen: Seen) -> list[Finding]:
    if not seen.infiniband:
        return []
    layers = {n.host: "/".join(sorted({p.link_layer for p in n.facts.ib})) for n in seen.nodes if n.facts.ib}
    return _differs("ib-link-layer", layers, "InfiniBand link layer",
                    "use one fabric for NCCL: InfiniBand on every node or RoCE on every node")


def _roce_gid(seen: Seen) -> list[Finding]:
    return [_no_gid(n.host, p) for n in (seen.nodes if seen.infiniband else ()) if n.facts.ib
            for p in _used_ports(n) if p.link_layer == "Ethernet" and not p.rocev2]


def _no_gid(host: str, p) -> Finding:
    if p.link_local_only:  # fe80:: only: NCCL would take it, and no router forwards it
        ndev = next((g.ndev for g in p.gids if g.ndev), "its network device")
        return Finding("roce-gid", host, f"{p.hca} port {p.port} has only link-local RoCE v2 GIDs (fe80::), which no "
                                         "router forwards: RoCE between subnets would fail or hang",
                       f"give {ndev} an IPv4 address on the RDMA network (each address adds a RoCE v2 GID; "
                       f"`show_gids {p.hca}` lists them), then run up again")
    return Finding("roce-gid", host, f"{p.hca} port {p.port} is RoCE without a RoCE v2 GID",
                   "give the interface an IP address (RoCE v2 GIDs follow it), then set "
                   "NCCL_IB_GID_INDEX to the RoCE v2 entry (`show_gids`)")


def _efa(seen: Seen) -> list[Finding]:
    out = []
    for n in (n for n in seen.nodes if seen.infiniband and n.facts.ib):
        efa = sorted({p.hca for p in _used_ports(n) if p.efa})
        if efa:
            out.append(Finding("efa", n.host, f"its RDMA devices {', '.join(efa)} are AWS EFA, which NCCL reaches only "
                               "through its EFA plugin (aws-ofi-nccl with libfabric); vllm/vllm-openai ships none, "
                               "and without it NCCL falls back to TCP sockets",
                               "use an image with aws-ofi-nccl and libfabric (AWS's EFA installer in an image built "
                               "FROM the vLLM one) and `up --skip-check efa` (check-nccl then fails if NCCL still "
                               "goes over sockets), or set infiniband: false to run over sockets knowingly"))
    return out


def _gpudirect(seen: Seen) -> list[Finding]:
    return [Finding("gpudirect", n.host, f"{g.describe()}: NCCL would stage every transfer through host memory "
                    "(a fraction of the fabric's bandwidth; FlashInfer's autotune has hung on it, vllm#52291)",
                    "`sudo modprobe nvidia-peermem` (and name it in /etc/modules-load.d), or NVIDIA's open kernel "
                    "modules on Linux 5.12+ for DMA-BUF; or `up --skip-check gpudirect` to run without")
            for n in (seen.nodes if seen.infiniband and seen.want_gpus else ())
            if n.facts.ib and (g := n.facts.gdr) is not None and g.known and not g.usable]


def _ib_hca(seen: Seen) -> list[Finding]:
    out = []
    for n in (n for n in seen.nodes if seen.infiniband and n.facts.ib):
        exclude, wanted = ib_hcas(n.env.get("NCCL_IB_HCA", ""))
        have = sorted({p.hca for p in n.facts.ib})
        missing = [h for h in wanted if h not in have] if not exclude else []
        if missing:
            out.append(Finding("ib-hca", n.host, f"NCCL_IB_HCA names {', '.join(missing)}, which it "
                               f"does not have (it has {', '.join(have)})",
                               f"set NCCL_IB_HCA in {n.host}'s env to HCAs it has"))
    return out


def _clock(seen: Seen) -> list[Finding]:
    clocks = [(n.host, n.facts.clock_offset) for n in seen.nodes if n.facts.clock_offset is not None]
    if not clocks:
        return []
    ref_host, ref = clocks[0]
    return [Finding("clock", host, f"its clock is {off - ref:+.1f} s from {ref_host}'s",
                    "enable time sync on every node (`timedatectl set-ntp true`, chrony)")
            for host, off in clocks[1:] if abs(off - ref) > MAX_SKEW_S]


def _shm(seen: Seen) -> list[Finding]:
    return [Finding("shm", n.host, f"/dev/shm is {n.facts.shm_bytes / (1 << 20):.0f} MiB and the containers "
                    "share it (ipc_host)", "enlarge it (`mount -o remount,size=16G /dev/shm`) or set "
                    "cluster.ipc_host: false with a shm_size")
            for n in (seen.nodes if seen.ipc_host else ())
            if n.facts.shm_bytes is not None and n.facts.shm_bytes < MIN_SHM_BYTES]


def _nofile(seen: Seen) -> list[Finding]:
    return [Finding("nofile", n.host, f"the open-files limit is {n.nofile_hard}, below {MIN_NOFILE}",
                    "raise the hard nofile limit (LimitNOFILE in docker.service, /etc/security/limits.conf)")
            for n in seen.nodes if n.nofile_hard is not None and n.nofile_hard < MIN_NOFILE]


def _image(seen: Seen) -> list[Finding]:
    # a tag moved on some nodes only: they would run another build of the image (nodes without it
    # get it from `up`)
    # by content (its layers and config): Docker's classic and containerd image stores name one image
    # differently (facts.image_key)
    return _differs("image", {n.host: n.image_key.removeprefix("content:")[:12] for n in seen.nodes if n.image_key},
                    "the image's content (layers and config)", "give every node the same image: `bootstrap up --pull` "
                    "pulls it again everywhere (or `--load-image` sends this machine's)")


def _arch(seen: Seen) -> list[Finding]:
    return _differs("arch", {n.host: n.facts.arch for n in seen.nodes if n.facts.arch}, "CPU architecture",
                    "run the cluster on nodes of one architecture (one image build serves all the ranks, and the "
                    "peers copy the image to each other): an inventory per architecture")


def _image_arch(seen: Seen) -> list[Finding]:
    return [Finding("image-arch", n.host, f"the cluster image on it is built for {n.image_platform}, the host is "
                    f"{n.facts.arch} ({n.facts.machine}): every program in it would fail with \"exec format error\"",
                    f"use an image built for linux/{n.facts.arch} (or one published for several platforms) as "
                    "cluster.image, then `bootstrap up --pull`")
            for n in seen.nodes if n.facts.arch and platform_arch(n.image_platform) not in (None, n.facts.arch)]


def _memlock(seen: Seen) -> list[Finding]:
    return [Finding("memlock", n.host, f"its Docker cannot give the containers unlimited locked memory "
                    f"(--ulimit memlock=-1, which RDMA needs): dockerd's own limit is "
                    f"{n.facts.dockerd_memlock / (1 << 20):.0f} MiB and it lacks CAP_SYS_RESOURCE (rootless "
                    "or confined Docker)", "run dockerd with LimitMEMLOCK=infinity (systemctl edit "
                    "docker) as root, or set infiniband: false")
            for n in (seen.nodes if seen.infiniband else ())
            if n.facts.dockerd_sys_resource is False and n.facts.dockerd_memlock not in (None, -1)]


# -- between the nodes (reads "ports") and the fence's facts (reads "guard") ---------------------------
def _ports(seen: Seen) -> list[Finding]:
    if seen.inv is None:
        return []
    firewalld = frozenset(h.name for h in seen.hosts
                          if (f := seen.facts.get(h.name)) is not None and f.guard is not None and f.guard.firewalld)
    return ports.findings(seen.inv, [h for h in seen.hosts if h.name in seen.bound], seen.bound, seen.dialled,
                          firewalld)


def _mtu_path(seen: Seen) -> list[Finding]:
    return ports.payload_findings([h for h in seen.hosts if h.name in seen.bound], seen.dialled)


def _fence(seen: Seen) -> list[Finding]:
    if seen.inv is None or not seen.inv.cluster.fence:
        return []
    return [Finding("fence", h.name, *why) for h in seen.hosts
            if (g := seen.facts[h.name].guard) is not None and (why := FN.fence_refusal(g)) is not None]


def _secrets(seen: Seen) -> list[Finding]:
    if seen.inv is None or not SS.values(seen.inv):
        return []
    return [Finding("secrets", h.name, *why) for h in seen.hosts
            if (g := seen.facts[h.name].guard) is not None
            and (why := SS.refusal(g.root, g.sudo, g.run_fs, g.become_refused))]


#: Every check, in the order `up` runs them (and `--help` lists the skippable ones).
REGISTRY: tuple[Check, ...] = (
    Check("nvidia-runtime", "Docker can give containers the GPUs: the NVIDIA toolkit's hook (--gpus) or CDI (GPU "
          "clusters)", "host", _nvidia_runtime, skippable=False),
    Check("gpu-count", "nvidia-smi shows the GPUs the inventory expects", "host", _gpu_count, skippable=False),
    Check("gpu-driver", "the NVIDIA driver version is the same on every node", "rack", _gpu_driver),
    Check("cuda-driver", "the NVIDIA driver runs the CUDA version the image is built for (where the image is on "
          "the node)", "rack", _cuda_driver),
    Check("data-interface", "the interface holding the node's IP exists and is up", "rack", _data_interface),
    Check("socket-ifname", "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME select an interface of the node", "rack",
          _socket_ifname),
    Check("mtu", "the data-plane interfaces have the same MTU on every node", "rack", _mtu),
    Check("ib-port", "the InfiniBand/RoCE ports NCCL will use are ACTIVE", "rack", _ib_port),
    Check("ib-link-layer", "the ports' link layer (InfiniBand or Ethernet) is the same on every node", "rack",
          _ib_link_layer),
    Check("roce-gid", "a RoCE port has a routable RoCE v2 GID (not only link-local fe80::)", "rack", _roce_gid),
    Check("efa", "RDMA devices that are AWS EFA are named with what NCCL needs for them (its EFA plugin)", "rack",
          _efa),
    Check("gpudirect", "GPUDirect RDMA can work where NCCL uses the HCAs (nvidia-peermem, or DMA-BUF)", "rack",
          _gpudirect),
    Check("ib-hca", "every HCA NCCL_IB_HCA names exists on the node", "rack", _ib_hca),
    Check("clock", "the nodes' clocks agree", "rack", _clock),
    Check("shm", "/dev/shm is large enough where containers share the host's (ipc_host)", "rack", _shm),
    Check("nofile", "the open-files limit is high enough for Ray and vLLM", "rack", _nofile),
    Check("image", "the cluster image has the same ID on every node that holds it", "rack", _image),
    Check("arch", "the nodes have one CPU architecture (`uname -m`)", "rack", _arch),
    Check("image-arch", "the cluster image on a node is built for the node's CPU architecture", "rack", _image_arch),
    Check(ports.CHECK, "every node opens TCP to the others' cluster ports (Ray GCS, vLLM, an ephemeral port) on "
          "the data-plane IPs, tested between the nodes", "ports", _ports),
    Check(ports.PATH_CHECK, "a packet of the data-plane MTU crosses between every pair of nodes (a path that drops "
          "jumbo frames hangs NCCL's and Gloo's sockets), tested between the nodes", "ports", _mtu_path),
    Check("memlock", "Docker can give the containers the unlimited locked memory RDMA needs (infiniband)", "rack",
          _memlock),
    Check("fence", "the fence can be put on the host (cluster.fence)", "guard", _fence, skippable=False),
    Check("secrets", "the host can keep the cluster's secrets in memory (cluster.secrets)", "guard", _secrets,
          skippable=False),
)
#: The checks `--skip-check` takes, by id, with what each looks at.
CHECKS: dict[str, str] = {c.id: c.title for c in REGISTRY if c.skippable}


def reading(reads: str) -> tuple[Check, ...]:
    """The registry's checks that read these facts (registry.READS), in order."""
    return tuple(c for c in REGISTRY if c.reads == reads)


def check_preflight(name: str, facts: HostFacts, *, want_gpus: int | None) -> None:
    """Raise PreflightFailed (the first finding) when the host cannot run the cluster container."""
    found = judge(Seen(facts={name: facts}, want_gpus=want_gpus), reading("host"))
    if found:
        raise PreflightFailed(name, found[0].what, found[0].fix)


def check_rack(nodes: Sequence[RackNode], *, infiniband: bool = False, ipc_host: bool = True,
               skip: frozenset[str] = frozenset(), want_gpus: int | None = None) -> list[Finding]:
    """Every finding of the node checks not skipped, the head's first (put it first), then by host."""
    seen = Seen(nodes=tuple(nodes), infiniband=infiniband, ipc_host=ipc_host, want_gpus=want_gpus)
    return by_host(judge(seen, reading("rack"), skip), [n.host for n in nodes])
