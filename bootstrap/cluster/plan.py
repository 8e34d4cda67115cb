"""Plan: what each host gets. Pure functions of the inventory and the facts; no I/O.

The container a host gets is an argv tuple (`ContainerSpec.run_argv`), identical to what
`scripts/run_cluster.sh` builds for the same inputs (tests/test_run_cluster_script.py holds them
together). Its hash goes into a label, so a later `up` can tell an unchanged container from one
whose spec changed.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass, field, replace
from typing import Literal, Mapping, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster import gpuaccess as GA
from bootstrap.cluster.facts import HostFacts
from bootstrap.cluster.gids import ROCE_V2
from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.exposure import RAY_DASHBOARD_DEFAULT, dashboard_address
from bootstrap.model import HF_CACHE_IN_CONTAINER, NOFILE_MAX, VLLM_HOST_IP_ENV, Host, Inventory
from bootstrap.remote import argv as RA

#: nofile limit used when neither the inventory nor the host says otherwise.
NOFILE_CAP = NOFILE_MAX
NOFILE_UNKNOWN = "<host hard limit>"

LABEL_CLUSTER = "bootstrap.cluster"
LABEL_HOST = "bootstrap.host"
LABEL_ROLE = "bootstrap.role"
LABEL_SPEC = "bootstrap.spec"
#: Where PyTorch's and vLLM's compile caches live in every container of a host (node and serve
#: containers), on a named volume per host (compile_cache_volume) that outlives the containers:
#: what vLLM compiles on its first request (Inductor's C++/Triton kernels, vLLM's torch.compile
#: graphs) is compiled once per host, not again after each restart, rollout or keeper restart, and
#: vLLM's model-info cache (VLLM_CACHE_ROOT/modelinfos) spares each start a subprocess that imports
#: vLLM once more to inspect the model's class. `down` removes the volume. cluster.env may point
#: the variables elsewhere.
COMPILE_CACHE_IN_CONTAINER = "/var/cache/bootstrap-compile"
COMPILE_ENV = {"TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE_IN_CONTAINER}/inductor",
               "TRITON_CACHE_DIR": f"{COMPILE_CACHE_IN_CONTAINER}/triton",
               "VLLM_CACHE_ROOT": f"{COMPILE_CACHE_IN_CONTAINER}/vllm"}


def compile_cache_volume(inv: Inventory) -> str:
    return f"{inv.cluster.container_name}-compile-cache"


def drain_mark_volume(inv: Inventory) -> str:
    """A fleet host that `bootstrap drain` marked holds this (empty, labelled) volume; `down` removes it."""
    return f"{inv.cluster.container_name}-drained"

Action = Literal["create", "recreate", "keep"]


@dataclass(frozen=True)
class ContainerSpec:
    host: str
    role: str
    name: str
    image: str
    #: docker run options, in the fixed order run_cluster.sh uses (no labels, no env file).
    options: tuple[str, ...]
    #: the `ray start ...` arguments (the entrypoint is `ray`).
    command: tuple[str, ...]
    #: names of the secrets the container gets: files on the host's /run mounted read-only, which
    #: its entrypoint exports (secretstore), never a value on a command line or in Docker's config.
    secret_names: tuple[str, ...]
    cluster: str
    #: `ray` (the node runs `ray start ...`) or `sleep` (runtime none: `sleep infinity`).
    entrypoint: str = "ray"
    #: a digest of Ray's token (fence.token_digest; "" without token authentication): a new token
    #: is a new spec, so the containers are recreated with it
    auth: str = ""
    #: the host's set of secrets it mounts (secretstore.KINDS: a fleet's node containers have their own)
    secret_set: str = SS.SERVE

    @property
    def spec_hash(self) -> str:
        # with secrets, how they reach the container too (a container an older bootstrap gave them
        # through Docker's env is recreated); without, the same hash as before there was a choice
        how = [SS.mounts(self.cluster, self.secret_names, self.secret_set),
               SS.entry_argv(self.secret_names, self.entrypoint, self.command)] if self.secret_names else []
        doc = json.dumps([self.name, self.image, self.options, self.entrypoint, self.command, self.secret_names]
                         + ([self.auth] if self.auth else []) + how)
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        return ((LABEL_CLUSTER, self.cluster), (LABEL_HOST, self.host), (LABEL_ROLE, self.role),
                (LABEL_SPEC, self.spec_hash))

    def run_argv(self) -> tuple[str, ...]:
        entrypoint, command = SS.entry_argv(self.secret_names, self.entrypoint, self.command)
        return RA.docker_argv(RA.RunSpec(self.image, self.name, detach=True,
                                         options=(*self.options, *SS.mounts(self.cluster, self.secret_names,
                                                                            self.secret_set), *RA.labels(self.labels)),
                                         entrypoint=entrypoint, command=tuple(command)))


@dataclass(frozen=True)
class HostAction:
    host: str
    action: Action
    reason: str
    spec: ContainerSpec
    #: what the node's fabric gave its NCCL variables, and why (fabric_notes; () without facts)
    fabric: tuple[str, ...] = ()


def nofile_for(inv: Inventory, facts: HostFacts | None) -> int | None:
    if inv.cluster.nofile is not None:
        return inv.cluster.nofile
    if facts is not None and facts.nofile_hard is not None:
        return min(facts.nofile_hard, NOFILE_CAP)
    return None


def node_env(host: Host) -> dict[str, str]:
    """The environment of a host's node container: the compile caches' places (COMPILE_ENV), its env
    (the cluster's with the host's over it, over those) and VLLM_HOST_IP, its data-plane IP."""
    env = {**COMPILE_ENV, **dict(host.env)}
    env[VLLM_HOST_IP_ENV] = host.ip
    return env


#: The variables derived_env may set: each selects something of one node, so it is per node.
DERIVED_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")


def interface_of(host: Host, facts: HostFacts | None) -> str | None:
    """The interface that holds the host's data-plane IP, from its facts (None: not known)."""
    rack = facts.rack if facts is not None else None
    if rack is None:
        return None
    return next((i for i, a in rack.addrs if a == host.ip and i), None)


def network_of(host: Host, facts: HostFacts | None) -> str | None:
    """The network of the host's data-plane IP (``10.0.0.0/24``), from its facts (None: not known)."""
    rack = facts.rack if facts is not None else None
    nets = [ipaddress.ip_interface(n) for n in (rack.nets if rack is not None else ())]
    return next((str(n.network) for n in nets if str(n.ip) == host.ip), None)


def derived_env(inv: Inventory, host: Host, facts: HostFacts | None) -> dict[str, str]:
    """NCCL's and Gloo's per-node variables from the node's own facts, for those its env leaves unset:
    the socket interface is the one holding its data-plane IP; with InfiniBand, NCCL_IB_HCA lists its
    ACTIVE HCAs (AWS EFA devices left out: NCCL reaches them through its EFA plugin only), and on RoCE
    NCCL_IB_GID_INDEX is the RoCE v2 GID's index when every active port has it at the same index (NCCL
    takes one index for all HCAs). {} without facts (an offline plan)."""
    rack = facts.rack if facts is not None else None
    if rack is None:
        return {}
    out: dict[str, str] = {}
    holder = interface_of(host, facts)
    if holder:
        out.update(NCCL_SOCKET_IFNAME=holder, GLOO_SOCKET_IFNAME=holder)
    # EFA devices are NCCL's EFA plugin's (aws-ofi-nccl), never its IB transport's: not named to it
    active = [p for p in rack.ib or () if p.state == "ACTIVE" and not p.efa]
    if inv.cluster.infiniband and active:
        out["NCCL_IB_HCA"] = ",".join(sorted({p.hca for p in active}))
        roce = [p for p in active if p.link_layer == "Ethernet"]
        indexes = {p.rocev2_index for p in roce}
        if roce and len(indexes) == 1 and None not in indexes:
            out["NCCL_IB_GID_INDEX"] = str(indexes.pop())
    own = dict(host.env)
    return {k: v for k, v in out.items() if k not in own}


def fabric_notes(inv: Inventory, host: Host, facts: HostFacts | None) -> tuple[str, ...]:
    """What `up --dry-run` says of the node's fabric (pure): the RoCE v2 GID NCCL_IB_GID_INDEX names and the
    link-local ones left out, or why the variable is left unset; EFA devices left out of NCCL_IB_HCA; how
    GPUDirect RDMA can work. () without facts or infiniband."""
    rack = facts.rack if facts is not None else None
    if rack is None or not inv.cluster.infiniband or not rack.ib:
        return ()
    out = []
    active = [p for p in rack.ib if p.state == "ACTIVE"]
    roce = [p for p in active if p.link_layer == "Ethernet" and not p.efa]
    chosen = {p.hca: next((g for g in p.gids if g.index == p.rocev2_index), None) for p in roce}
    own = dict(host.env).get("NCCL_IB_GID_INDEX")
    if own is not None and roce:
        out.append(f"NCCL_IB_GID_INDEX={own} as its env sets it (the routable RoCE v2 GIDs are at "
                   + ", ".join(f"{p.hca}: {p.rocev2_index}" for p in roce) + ")")
    elif len({p.rocev2_index for p in roce}) == 1 and None not in {p.rocev2_index for p in roce}:
        local = sorted({g.index for p in roce for g in p.gids if g.link_local and g.type == ROCE_V2})
        out.append(f"NCCL_IB_GID_INDEX={roce[0].rocev2_index}: the RoCE v2 GID of "
                   + ", ".join(f"{h} ({g.ipv4 or g.address}{' on ' + g.ndev if g.ndev else ''})"
                               for h, g in chosen.items() if g)
                   + (f"; link-local fe80:: RoCE v2 at {', '.join(map(str, local))} left out (no router forwards it)"
                      if local else ""))
    elif roce:
        out.append("NCCL_IB_GID_INDEX left unset: the ports' routable RoCE v2 GIDs are at different indexes ("
                   + ", ".join(f"{p.hca}: {p.rocev2_index if p.rocev2_index is not None else 'none'}" for p in roce)
                   + "), and NCCL 2.21+ picks each port's routable one itself")
    efa = sorted({p.hca for p in active if p.efa})
    if efa:
        out.append(f"{', '.join(efa)}: AWS EFA, left out of NCCL_IB_HCA (NCCL's EFA plugin, aws-ofi-nccl, uses them)")
    if rack.gdr is not None and rack.gdr.known:
        out.append(rack.gdr.describe())
    return tuple(out)


def ucx_env(inv: Inventory, host: Host, facts: HostFacts | None) -> dict[str, str]:
    """UCX's devices for the KV cache transfer (NIXL runs on UCX) from the node's facts: with
    InfiniBand, UCX_NET_DEVICES lists its ACTIVE ports as HCA:port (UCX's own form), so the
    transfer goes over RDMA rather than the first interface UCX finds; {} otherwise (UCX picks TCP
    on the data-plane interface), and where the host's env sets it."""
    rack = facts.rack if facts is not None else None
    active = sorted({(p.hca, p.port) for p in (rack.ib or ()) if p.state == "ACTIVE"}) if rack else []
    if not inv.cluster.infiniband or not active or "UCX_NET_DEVICES" in dict(host.env):
        return {}
    return {"UCX_NET_DEVICES": ",".join(f"{hca}:{port}" for hca, port in active)}


def ray_auth(inv: Inventory, f: HostFacts | None) -> tuple[str, str] | None:
    """(the host's token file, its digest) when the node runs Ray with token authentication; the
    file's place in an offline plan (no facts)."""
    if not FN.ray_auth_on(inv):
        return None
    g = f.guard if f is not None else None
    if g is None or not g.home:
        return (FN.token_path("~", inv.cluster.name), "")
    return (FN.token_path(g.home, inv.cluster.name), g.token)


def gpu_flags(f: HostFacts | None) -> tuple[str, ...]:
    """How the host's Docker gives a container its GPUs (gpuaccess.choose): `--gpus all`, or CDI's
    `--device nvidia.com/gpu=all` where that is the way the host has."""
    if f is None:
        return GA.choose(None).flags
    return GA.choose(f.gpu_access, f.runtimes, f.docker_version).flags


def container_spec(inv: Inventory, host: Host, nofile: int | None,
                   derived: Mapping[str, str] | None = None, auth: tuple[str, str] | None = None,
                   gpus: tuple[str, ...] = ("--gpus", "all")) -> ContainerSpec:
    """The node container of a host; `derived`: derived_env's variables (the host's env wins);
    `auth`: Ray's token file on the host and its digest (ray_auth), mounted read-only; `gpus`: the
    host's way to its GPUs (gpu_flags), on a GPU cluster."""
    c = inv.cluster
    head = inv.head
    opts: list[str] = ["--network", "host"]
    opts += ["--ipc", "host"] if c.ipc_host else ["--shm-size", c.shm_size]
    if c.accelerator == "gpu":
        opts += list(gpus)
    n = str(nofile) if nofile is not None else NOFILE_UNKNOWN
    opts += ["--ulimit", f"nofile={n}:{n}"]
    if c.infiniband:
        opts += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]
    if c.privileged:
        opts += ["--privileged"]
    if c.hf_cache:
        opts += ["-v", f"{c.hf_cache}:{HF_CACHE_IN_CONTAINER}"]
    for m in c.mounts:
        opts += ["-v", m]
    opts += ["-v", f"{compile_cache_volume(inv)}:{COMPILE_CACHE_IN_CONTAINER}"]
    env = {**(derived or {}), **node_env(host)}
    if auth is not None and c.runtime == "ray":
        opts += ["-v", f"{auth[0]}:{FN.TOKEN_IN_CONTAINER}:ro"]
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=FN.TOKEN_IN_CONTAINER)
    for k in sorted(env):
        opts += ["-e", f"{k}={env[k]}"]
    kind = SS.node_kind(inv)  # the secrets it uses, from its own set (secretstore.KINDS)
    secrets, secret_set = SS.kind_names(inv, kind), SS.KINDS[kind][0] or SS.SERVE

    if c.runtime == "none":
        return ContainerSpec(host=host.name, role=host.role, name=c.container_name, image=c.image,
                             options=tuple(opts), command=("infinity",),
                             secret_names=secrets, cluster=c.name, entrypoint="sleep", secret_set=secret_set)
    gcs = c.ports.ray_gcs
    cmd = ["start", "--block"]
    if host.is_head:
        cmd += ["--head", f"--node-ip-address={host.ip}", f"--port={gcs}",
                f"--dashboard-port={c.ports.dashboard}"]
        dash = dashboard_address(c, host)
        if dash != RAY_DASHBOARD_DEFAULT:
            cmd += [f"--dashboard-host={dash}"]
    else:
        cmd += [f"--address={hostport(head.ip, gcs)}", f"--node-ip-address={host.ip}"]
    if c.accelerator == "gpu" and host.gpus:
        # Ray counts GPUs through NVML itself; the count the preflight checked with nvidia-smi is
        # what vLLM's placement needs, whatever NVML in the container says
        cmd += [f"--num-gpus={host.gpus}"]
    cmd += [f"--metrics-export-port={c.ports.ray_metrics}", "--disable-usage-stats", *c.ray_args]
    return ContainerSpec(host=host.name, role=host.role, name=c.container_name, image=c.image,
                         options=tuple(opts), command=tuple(cmd),
                         secret_names=secrets, cluster=c.name, auth=auth[1] if auth is not None else "",
                         secret_set=secret_set)


def hostport(ip: str, port: int) -> str:
    """ip:port, an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def plan_up(inv: Inventory, facts: Mapping[str, HostFacts]) -> tuple[HostAction, ...]:
    """Decide create / recreate / keep for every host. The head first, then the workers.

    A head that is (re)created takes every worker with it: workers joined to the old head's GCS
    would not rejoin the new one.
    """
    actions: list[HostAction] = []
    for host in (inv.head, *inv.workers):
        f = facts.get(host.name)
        spec = container_spec(inv, host, nofile_for(inv, f), derived_env(inv, host, f), ray_auth(inv, f), gpu_flags(f))
        action, reason = _decide(spec, f)
        actions.append(HostAction(host.name, action, reason, spec, fabric_notes(inv, host, f)))
    head = actions[0]
    if head.action != "keep":
        actions = [head] + [
            a if a.action != "keep" else replace(a, action="recreate", reason="the head is (re)started")
            for a in actions[1:]
        ]
    return tuple(actions)


def disruptive(actions: Sequence[HostAction], facts: Mapping[str, HostFacts]) -> tuple[HostAction, ...]:
    """The actions that stop a running container: what `up` asks about before it goes on (a missing or
    stopped container recreated stops nothing)."""
    def running(host: str) -> bool:
        f = facts.get(host)
        return f is not None and f.container is not None and f.container.running
    return tuple(a for a in actions if a.action == "recreate" and running(a.host))


def _decide(spec: ContainerSpec, f: HostFacts | None) -> tuple[Action, str]:
    cur = f.container if f else None
    if cur is None:
        return "create", "no container"
    if cur.labels.get(LABEL_SPEC) != spec.spec_hash:
        return "recreate", "spec changed" if LABEL_SPEC in cur.labels else "not created by bootstrap"
    if not cur.running:
        return "recreate", f"container is {cur.status}"
    if f is not None and f.image_id and cur.image_id and f.image_id != cur.image_id:
        return "recreate", "image updated"
    return "keep", "up to date"


@dataclass(frozen=True)
class RayNode:
    ip: str
    alive: bool
    gpus: float
    cpus: float
    node_id: str = ""


@dataclass(frozen=True)
class RayView:
    ready: bool
    nodes: tuple[RayNode, ...]
    missing: tuple[str, ...]
    error: str = ""
    elapsed: float = 0.0
    #: When the poller first saw each node IP alive: time.time() on the head's clock.
    first_seen: Mapping[str, float] = field(default_factory=dict)
    #: The head's time.time() when the poller finished (compare with ours for the clock skew).
    head_now: float | None = None


def parse_ray_nodes(out: str) -> RayView:
    done = None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if obj.get("event") == "done":
                done = obj
    if done is None:
        return RayView(False, (), (), error=(out.strip().splitlines() or ["no output"])[-1])
    nodes = tuple(RayNode(n["ip"], bool(n["alive"]), float(n.get("gpus", 0)), float(n.get("cpus", 0)),
                          str(n.get("node_id") or ""))
                  for n in done.get("nodes", []))
    seen = done.get("first_seen") or {}
    first_seen = {str(ip): float(t) for ip, t in seen.items()} if isinstance(seen, dict) else {}
    now = done.get("now")
    return RayView(bool(done.get("ready")), nodes, tuple(done.get("missing", [])), done.get("error", ""),
                   float(done.get("t", 0.0)), first_seen, float(now) if isinstance(now, (int, float)) else None)


def stale_registrations(inv: Inventory, actions: Sequence[HostAction], members: RayView | None) -> set[str]:
    """Ray node IDs of the containers we just replaced on a kept head's GCS. Ray lists a dead node
    as alive until its heartbeats time out (tens of seconds), so the old registration of a
    recreated worker must not count as that worker having rejoined."""
    if members is None:
        return set()
    replaced = {inv.host(a.host).ip for a in actions if a.action != "keep"}
    return {n.node_id for n in members.nodes if n.alive and n.ip in replaced and n.node_id}


def all_alive(view: RayView, hosts: Sequence[Host], gpus: float) -> bool:
    """Every host's IP alive in the view, with at least ``gpus`` GPUs."""
    alive = {n.ip: n for n in view.nodes if n.alive}
    return all(h.ip in alive and alive[h.ip].gpus >= gpus for h in hosts)


def ray_checks_needed(changing: Sequence[HostAction], facts: Mapping[str, F.HostFacts]) -> dict[str, str]:
    """Image ID -> the host to run the `ray`-in-image check on: one per distinct ID among the
    hosts that change, except IDs some host has a marker for (checked there before)."""
    proven = {m for f in facts.values() for m in f.ray_ok}
    by_id: dict[str, str] = {}
    for a in changing:
        iid = facts[a.host].image_id or ""
        if not (iid and F.ray_ok_marker(iid) in proven):
            by_id.setdefault(iid, a.host)
    return by_id


def with_ray_members(inv: Inventory, actions: Sequence[HostAction], missing_ips: set[str]) -> tuple[HostAction, ...]:
    """Recreate kept containers whose node Ray does not list alive (all of them if it is the head)."""
    from dataclasses import replace

    if inv.head.ip in missing_ips:
        return tuple(replace(a, action="recreate", reason="head not alive in Ray") if a.host == inv.head.name
                     else (replace(a, action="recreate", reason="the head is (re)started") if a.action == "keep" else a)
                     for a in actions)
    return tuple(replace(a, action="recreate", reason="not alive in Ray")
                 if a.action == "keep" and inv.host(a.host).ip in missing_ips else a for a in actions)


#: What `plan` says of a runtime left unset (its rows show the containers with Ray).
UNDECIDED_NOTE = ("`up` reads the image: Ray where it has it (shown below), else each node runs `sleep infinity` "
                  "and `serve` uses vLLM's native multi-node mode; set cluster.runtime to choose")


def plan_offline(inv: Inventory) -> tuple[HostAction, ...]:
    """The containers each host would get, from the inventory alone (no host contacted)."""
    return tuple(HostAction(h.name, "create", "offline plan",
                            container_spec(inv, h, nofile_for(inv, None), auth=ray_auth(inv, None)))
                 for h in (inv.head, *inv.workers))
