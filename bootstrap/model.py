"""The typed inventory: what `bootstrap.inventory` produces after validation.

Everything here is immutable and does no I/O. Secrets are a type that never prints its value.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["head", "worker"]
#: Host.replica of a pool's host that serves no model
IDLE = -1
Accelerator = Literal["gpu", "none"]

DEFAULT_CONTAINER_NAME = "bootstrap-vllm"
#: cluster.image left out: the stock image of the vLLM release bootstrap is tested with, pinned (not :latest,
#: which moves: nodes that pull at different times would run different vLLMs). A new release: a new default here.
DEFAULT_IMAGE = "vllm/vllm-openai:v0.32.0"
HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
#: The kernel's default ceiling on open files per process (fs.nr_open): docker cannot give a
#: container a nofile limit above the host's.
NOFILE_MAX = 1048576
#: The most GPUs one host may declare (the largest single systems have 16; more is a typo that the
#: split and `--num-gpus` would take at its word).
MAX_GPUS_PER_HOST = 64

#: Variables the plan sets in a container itself (cluster/plan.py, fleet/plan.py set them under these
#: names) -> (where its value comes from, the setting to use instead; None: none): neither a cluster
#: or host `env` entry (docker keeps the last `-e`) nor a secret (its entrypoint exports it over the
#: plan's) may set them.
VLLM_HOST_IP_ENV = "VLLM_HOST_IP"
RAY_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
STOP_GRACE_ENV = "BOOTSTRAP_STOP_GRACE"
PLAN_ENV: dict[str, tuple[str, str | None]] = {
    VLLM_HOST_IP_ENV: ("each host's ip", "the host's ip"),
    **{k: ("cluster.ray_auth (the token is made per cluster and kept as a file)", "cluster.ray_auth")
       for k in RAY_AUTH_ENV},
    NIXL_HOST_ENV: ("each host's ip (a disaggregated member's KV side channel)", "the host's ip"),
    NIXL_PORT_ENV: ("cluster.ports.kv_transfer", "cluster.ports.kv_transfer"),
    STOP_GRACE_ENV: ("the serve containers' stop grace", None),
}
#: Variables the plan sets per node unless the node's env does (the compile caches' places, the
#: interfaces and HCAs from its facts, UCX's devices, vLLM-CPU's binding): `env` may choose them,
#: a secret may not (it would override the plan's per node, unseen).
PLAN_DEFAULT_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "NCCL_SOCKET_IFNAME",
                    "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "UCX_NET_DEVICES",
                    "VLLM_CPU_OMP_THREADS_BIND")


class Secret:
    """A value that prints as ``***`` in reprs, plans, logs and error messages."""

    __slots__ = ("name", "_value")

    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self.name}=***)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and (self.name, self._value) == (other.name, other._value)

    def __hash__(self) -> int:
        return hash((self.name, self._value))


@dataclass(frozen=True)
class SSHTarget:
    """How to reach one host. None means: let ~/.ssh/config (or the ssh default) decide."""

    address: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    #: A bastion / jump host, as ``[user@]host[:port]``.
    jump: str | None = None
    #: sudo's password on this host (the Ansible format's ansible_become_password); never shown.
    become_password: str | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Host:
    name: str
    ssh: SSHTarget
    #: Data-plane IP: the node's VLLM_HOST_IP and Ray node IP.
    ip: str
    role: Role
    #: Expected GPU count (None: not checked; only allowed with accelerator none).
    gpus: int | None = None
    #: Per-host environment, merged over the cluster's (e.g. NCCL_SOCKET_IFNAME).
    env: tuple[tuple[str, str], ...] = ()
    #: The serving group (replica) this host belongs to, 0-based; 0 when cluster.replicas is 1;
    #: IDLE: a pool's host that no model's replica takes (models:).
    replica: int = 0

    @property
    def is_head(self) -> bool:
        return self.role == "head"


@dataclass(frozen=True)
class Ports:
    #: Ray's GCS on the head (`ray start --port`).
    ray_gcs: int = 6379
    #: Ray's dashboard on the head.
    dashboard: int = 8265
    #: vLLM's OpenAI-compatible API (each replica's head).
    vllm: int = 8000
    #: Ray's Prometheus metrics export on every node (`ray start --metrics-export-port`)
    ray_metrics: int = 8080
    #: where a node that has the image serves it to its peers during `up` (data-plane IP only)
    image_copy: int = 8476
    #: the KV cache transfer's side channel on every serve member when prefill and decode are
    #: disaggregated (cluster.router.prefill; vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT)
    kv_transfer: int = 5600
    #: where each replica's engine publishes its KV cache events (vLLM's ZMQ publisher, on the head's
    #: data-plane IP) for the routers' kv_aware policy (cluster.router.kv_events)
    kv_events: int = 5557


#: vLLM's native multi-node mode in a fleet replica: torch.distributed's rendezvous on the replica's
#: head, and the members' own coordination port beside it (checks/member.py).
NATIVE_MASTER_PORT = 29600
NATIVE_COORD_PORT = 29599


@dataclass(frozen=True)
class SSHSettings:
    """Cluster-wide SSH behaviour."""

    #: known_hosts file checked in addition to ~/.ssh/known_hosts (None: only the system ones).
    known_hosts: str | None = None
    #: Trust and record keys of hosts not yet known (like ssh's StrictHostKeyChecking=accept-new).
    #: A changed key is always refused.
    accept_new_host_keys: bool = False
    #: Seconds to wait for a host's SSH connection.
    connect_timeout: float = 10.0
    #: Seconds a remote command may run unless the step sets its own deadline.
    command_timeout: float = 600.0
    #: Retries of a refused or reset connection, with backoff (timeouts are not retried).
    connect_retries: int = 3
    #: sudo's password where the SSH user is not root (-K/--ask-become-pass, $BOOTSTRAP_BECOME_PASSWORD;
    #: a host's own in the inventory wins); it travels on the SSH channel's stdin only, never shown.
    become_password: str | None = field(default=None, repr=False, compare=False)


#: vllm-router's balancing policies that bootstrap offers (kv_aware: from the engines' own KV cache events,
#: which the plan turns on; a one-model fleet only)
ROUTER_POLICIES = ("power_of_two", "round_robin", "cache_aware", "consistent_hash", "sticky_least_loaded",
                   "kv_aware", "random")


@dataclass(frozen=True)
class Vip:
    """A floating address in front of the routers (cluster.router.vip): keepalived (VRRP, unicast
    between the router hosts) holds it on one healthy router host at a time."""

    #: the IPv4 address clients use (on the router hosts' data-plane network, used by no host)
    address: str
    #: its prefix length on the interface (32: the address alone)
    prefix: int = 32
    #: VRRP's virtual router id (1-255), unique on the network segment; None: derived from the cluster's name
    id: int | None = None
    #: the name of a secret (cluster.secrets) for VRRP's password: VRRPv2 with 1-s adverts (a dead host
    #: loses the address in about 3.5 s); None: VRRPv3 with 0.25-s adverts (under a second), no password
    secret: str | None = None
    #: the image keepalived runs in (it needs keepalived, iptables and curl); None: cluster.image
    image: str | None = None


@dataclass(frozen=True)
class Router:
    """vllm-router in front of the replicas (used when cluster.replicas > 1)."""

    #: the host that runs it (None: the first replica's head); one router, the endpoint is that host
    host: str | None = None
    #: hosts that each run a router with the same workers (with vip; default: the heads of the first two replicas)
    hosts: tuple[str, ...] = ()
    #: the floating address in front of the routers (None: the endpoint is one host)
    vip: Vip | None = None
    #: The router's port (the fleet's endpoint).
    port: int = 30000
    #: How the router spreads requests (vllm-router's policies).
    policy: str = "power_of_two"
    #: its Prometheus metrics port
    metrics_port: int = 29000
    #: seconds between its health checks of each replica (a dead replica is out within about this)
    health_interval: int = 2
    #: the name of the secret (cluster.secrets) that holds the API key: the replicas get it as
    #: VLLM_API_KEY and refuse /v1 requests without it; the router passes the client's header on
    api_key: str | None = None
    #: replicas that only prefill (prefill/decode disaggregation: vllm-router's PD mode, the KV
    #: cache moved to a decode replica by vLLM's NixlConnector); the others decode. Empty: every
    #: replica serves whole requests.
    prefill: tuple[int, ...] = ()
    #: seconds a prefill replica keeps a request's KV cache for the decode replica to pull (vLLM's
    #: kv_lease_duration); None: vLLM's own (30 s) on GPU nodes, CPU_KV_LEASE on CPU nodes
    kv_lease: int | None = None
    #: the engines publish their KV cache events (cluster.ports.kv_events) and the routers subscribe,
    #: so that kv_aware can be chosen (bench --ab); always on with policy kv_aware
    kv_events: bool = False
    #: cache_aware: the share of a prompt a replica's prefix tree must match for the request to go
    #: there (vllm-router's --cache-threshold; None: its default, 0.3)
    cache_threshold: float | None = None
    #: cache_aware balances by load while the busiest replica has more than this many requests over
    #: the idlest (--balance-abs-threshold; None: 64)
    balance_abs_threshold: int | None = None
    #: ... and more than this many times the idlest's load (--balance-rel-threshold; None: 1.5)
    balance_rel_threshold: float | None = None
    #: kv_aware: a session (X-Session-ID) stays on its replica until idle this many seconds
    #: (--kv-aware-session-affinity-ttl-secs; None: no session affinity)
    session_ttl: int | None = None


#: vllm-router's settings of its policies that the inventory (cluster.router) and `bench --ab`'s arms
#: (POLICY:NAME=VALUE) take: name -> (its flag, int or float, lowest, highest, what it does)
ROUTER_SETTINGS: dict[str, tuple[str, type, float, float, str]] = {
    "cache_threshold": ("--cache-threshold", float, 0.0, 1.0,
                        "cache_aware: the share of the prompt a replica's prefix tree must match for the "
                        "request to go there by the cache (else to the least loaded); vllm-router's default 0.3"),
    "balance_abs_threshold": ("--balance-abs-threshold", int, 0, 1_000_000,
                              "cache_aware balances by load instead while the busiest replica has more than this "
                              "many requests over the idlest (and balance_rel_threshold times); default 64"),
    "balance_rel_threshold": ("--balance-rel-threshold", float, 1.0, 1000.0,
                              "cache_aware: with balance_abs_threshold, the busiest over the idlest replica's "
                              "load above which it balances by load; default 1.5"),
    "session_ttl": ("--kv-aware-session-affinity-ttl-secs", int, 1, 31_536_000,
                    "kv_aware: keep a session (X-Session-ID) on its replica until it has been idle this many "
                    "seconds; default off"),
}


#: the policy each of ROUTER_SETTINGS acts with (vllm-router reads it for that policy only): a setting with
#: another policy does nothing, and is refused (the inventory's router, bench --ab's arms)
SETTING_POLICY = {"cache_threshold": "cache_aware", "balance_abs_threshold": "cache_aware",
                  "balance_rel_threshold": "cache_aware", "session_ttl": "kv_aware"}


def idle_setting(name: str, policies: "set[str] | frozenset[str]") -> str | None:
    """Why the router setting `name` does nothing under `policies` (every policy that will route), or None."""
    acts = SETTING_POLICY[name]
    if acts in policies:
        return None
    return (f"does nothing: vllm-router reads {name} for policy {acts} only, and {', '.join(sorted(policies))} "
            f"{'is' if len(policies) == 1 else 'are'} what routes here; set policy: {acts}, or remove {name}")


#: the KV lease on CPU nodes when cluster.router.kv_lease is not set: with vLLM-CPU 0.32 and NIXL 1.5.1
#: the decode replica starts its pull only when the prefill's lease ends (measured: lease 30 s -> 32 s
#: per request, 6 s -> 8 s), so the lease is the latency floor there; docs/replicas.md
CPU_KV_LEASE = 5


@dataclass(frozen=True)
class Monitor:
    """`bootstrap monitor`: Prometheus on one host, a node exporter on every host."""

    #: the host that runs Prometheus (None: the head)
    host: str | None = None
    #: Prometheus' port.
    port: int = 9090
    #: Each host's node exporter.
    node_exporter_port: int = 9100
    #: seconds between scrapes
    scrape_interval: int = 5
    #: how long Prometheus keeps samples (its --storage.tsdb.retention.time)
    retention: str = "15d"
    #: The Prometheus image.
    image: str = "prom/prometheus:v2.53.4"
    #: The node exporter image.
    node_exporter_image: str = "prom/node-exporter:v1.8.2"
    #: NVIDIA's DCGM exporter on every host (GPU clusters)
    dcgm: bool = False
    #: The DCGM exporter image.
    dcgm_image: str = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04"
    #: Each host's DCGM exporter.
    dcgm_port: int = 9400


@dataclass(frozen=True)
class Cluster:
    #: The cluster's name: in labels, the lock file and messages (lowercase letters, digits, '-').
    name: str = "vllm"
    #: The vLLM image every node runs (with or without Ray).
    image: str = DEFAULT_IMAGE
    #: The node container's name on every host; the fleet's containers and volumes take it as prefix.
    container_name: str = DEFAULT_CONTAINER_NAME
    #: `gpu`: `docker run --gpus all`, nvidia-smi checked; `none`: CPU hosts (the sandbox).
    accelerator: Accelerator = "gpu"
    #: ray: each container runs `ray start` (head/worker); none: the container only holds the
    #: node (vLLM's native multi-node mode, for images that do not ship Ray). None (unset): `up`
    #: decides from the image, Ray where it has it (see bootstrap.cluster.runtime).
    runtime: Literal["ray", "none"] | None = None
    #: Host directory mounted at /root/.cache/huggingface (None: no mount).
    hf_cache: str | None = None
    #: Extra bind mounts, docker -v syntax ``SRC:DST[:ro]``.
    mounts: tuple[str, ...] = ()
    #: ``--ipc host`` (default) or a ``--shm-size`` when ipc_host is False.
    ipc_host: bool = True
    #: The container's /dev/shm when ipc_host is false.
    shm_size: str = "10.24g"
    #: The ports bootstrap uses on every host (cluster.ports).
    ports: Ports = field(default_factory=Ports)
    #: Environment for every node (NCCL_*/GLOO_*), before per-host overrides.
    env: tuple[tuple[str, str], ...] = ()
    #: Secrets taken from the caller's environment (HF_TOKEN by default, when set).
    secrets: tuple[Secret, ...] = ()
    #: Pass /dev/infiniband with IPC_LOCK and an unlimited memlock (never --privileged).
    infiniband: bool = False
    #: `docker run --privileged`: only when a setup needs it; InfiniBand does not.
    privileged: bool = False
    #: nofile ulimit for the container; None: the host's hard limit (read as a fact).
    nofile: int | None = None
    #: Stream the image from this machine (docker save | ssh docker load) instead of pulling.
    load_image: bool = False
    #: Nodes lacking the image get it from a node that has it, over the data plane, so that the
    #: registry (or this machine, with load_image) sends it once; false: every node pulls.
    peer_copy: bool = True
    #: With peer_copy, when no node has the image: the image of a registry mirror (nginx) the head
    #: runs for the duration of the pulls, which every node pulls through at once, so that the
    #: registry sends each layer once (bootstrap.cluster.imagedist); "" (``false`` in the file): the
    #: head pulls and copies the image to the others.
    image_mirror: str = "nginx:1.27-alpine"
    #: Extra arguments for `ray start` on every node.
    ray_args: tuple[str, ...] = ()
    #: Where the head's Ray dashboard listens: ``localhost`` (Ray's default, 127.0.0.1),
    #: ``data-plane`` (the head's ip), ``all`` (0.0.0.0) or a literal IP address.
    dashboard_host: str = "localhost"
    #: SSH settings for every host (cluster.ssh).
    ssh: SSHSettings = field(default_factory=SSHSettings)
    #: Serving groups: the hosts split, in order, into this many equal groups, each its own head
    #: (groups of different sizes when every host pins its own `replica`).
    replicas: int = 1
    #: With replicas: a standby serve container beside each one, vLLM imported and waiting, that
    #: takes the place of a killed one (the keeper's take-over); false: a killed one starts afresh.
    standby: bool = True
    #: vllm-router in front of the replicas (cluster.router).
    router: Router = field(default_factory=Router)
    #: Prometheus and the exporters of `bootstrap monitor` (cluster.monitor).
    monitor: Monitor = field(default_factory=Monitor)
    #: Host firewall rules (nftables) that close the cluster's ports to all but its members and the
    #: controller, put by `up` and removed by `down` (bootstrap.cluster.guard.fence).
    fence: bool = True
    #: Addresses or networks the fence admits like members (e.g. an operators' network).
    fence_allow: tuple[str, ...] = ()
    #: Ray's token authentication (RAY_AUTH_MODE=token, a token per cluster): `token` or `off`.
    ray_auth: Literal["token", "off"] = "token"
    #: Set by fleet.plan.replica_inventory only: the whole fleet's addresses (a replica's fence admits
    #: the other replicas' hosts) and the fleet's endpoint (host name, port), open to everyone in
    #: place of the group head's vLLM port.
    fence_members: tuple[str, ...] = ()
    fence_endpoint: tuple[str, int] | None = None


# A Hugging Face repo id: `name` or `org/name`; letters, digits, '-', '_', '.'; no '--' or '..'
# (huggingface_hub's validate_repo_id), at most 96 characters a part.
_HF_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
                    r"(?:/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?)?")


def model_ref_problem(model: str) -> str | None:
    """Why vLLM could not load `model` the same way on every node, or None.

    Accepted: a Hugging Face id (`org/name`, or a bare `name`), fetched through the HF cache, or
    an absolute path inside the containers. A path may contain spaces: it travels as one argv
    element. A relative path (`./my model`, `~/m`) is refused: it would be resolved against each
    container's working directory, not this machine's. Used by serve's MODEL and models[].source.
    """
    if not isinstance(model, str) or not model.strip():
        return ("no model given to serve: give a Hugging Face id (org/name) "
                "or an absolute path inside the containers")
    if any(ord(c) < 32 or ord(c) == 127 for c in model):
        return f"{model!r} contains a control character"
    if model.startswith("/"):
        return None
    if model.startswith(("./", "../", "~")) or model in (".", ".."):
        return (f"{model!r} is a relative path; a model path is an absolute path inside the "
                "containers (e.g. /models/llama, mounted with cluster.mounts), or give a "
                "Hugging Face id (org/name)")
    if not _HF_ID.fullmatch(model) or "--" in model or ".." in model:
        return (f"{model!r} is neither a Hugging Face id (org/name) nor an absolute path "
                "inside the containers (e.g. /models/llama)")
    return None


@dataclass(frozen=True)
class ServedModel:
    """One model the pool serves (the inventory's models: section): its replicas take hosts of the
    pool (bootstrap.inventory.modelfields places them), and one router routes by its name."""

    #: the name clients send as the OpenAI `model` field (vLLM's --served-model-name)
    name: str
    #: what vLLM loads: a Hugging Face id (org/name) or an absolute path in the containers; default: name
    source: str
    #: how many replicas serve it (with hosts: one per group listed)
    replicas: int = 1
    #: hosts in each replica (its TP x PP spans them); with hosts: each group's own size
    nodes: int = 1
    #: pinned host groups, one per replica (names of hosts); empty: placed in the order of hosts:
    hosts: tuple[tuple[str, ...], ...] = ()
    #: tensor parallel size of each replica (None: chosen from the model, as serve does)
    tp: int | None = None
    #: pipeline parallel size of each replica (None: chosen from the model, as serve does)
    pp: int | None = None
    #: vLLM's own flags for this model (what `serve MODEL -- ...` takes after --)
    args: tuple[str, ...] = ()
    #: vllm-router's policy for this model's replicas (None: cluster.router.policy)
    policy: str | None = None
    #: LoRA adapters of this model, (served name, source) each: loaded with it on every replica and
    #: served under their own names through the endpoint; `adapters:` given (even empty) turns LoRA on
    #: and lets `bootstrap adapter` load more at runtime
    adapters: tuple[tuple[str, str], ...] = ()
    #: LoRA is on for this model (its adapters: key is given)
    lora: bool = False
    #: the largest adapter rank its replicas accept (vLLM's --max-lora-rank; None: vLLM's default, 16)
    lora_rank: int | None = None
    #: the name of a secret in cluster.secrets holding this model's own API key: its replicas ask
    #: for it (vLLM's VLLM_API_KEY) instead of cluster.router.api_key's (None: the pool's key, if any)
    api_key: str | None = None
    #: where it is written (FILE:LINE: models[i]), for errors found after loading (serve's checks)
    where: str = ""
    #: the line of each of its keys written in the file ((key, line), ...), so that a rule judged after
    #: loading (the pool's rules) names the line of the field it refuses: line_of("args")
    lines: tuple[tuple[str, int], ...] = ()

    def line_of(self, key: str) -> int | None:
        """The line `key` of this model is written on (None: not known); where() names it."""
        return dict(self.lines).get(key)

    @property
    def field(self) -> str:
        """Its field in the inventory: "models[i]" (from where)."""
        return self.where.split(": ", 1)[1] if ": " in self.where else "models"


@dataclass(frozen=True)
class Inventory:
    path: str
    cluster: Cluster
    hosts: tuple[Host, ...]
    #: the models: section (empty: one model, named by `serve MODEL`)
    models: tuple[ServedModel, ...] = ()
    #: with models: the model (its index in models) each replica group serves
    placement: tuple[int, ...] = ()

    @property
    def idle(self) -> tuple[Host, ...]:
        """A pool's hosts that serve no model (models: takes fewer hosts than hosts: has)."""
        return tuple(h for h in self.hosts if h.replica == IDLE)

    def model_of(self, k: int) -> ServedModel | None:
        """The model replica group k serves (None without models:)."""
        return self.models[self.placement[k]] if self.models else None

    @property
    def head(self) -> Host:
        """The head (with replicas: the first replica's head)."""
        if self.cluster.replicas > 1:
            return self.replicas[0][0]
        return next(h for h in self.hosts if h.is_head)

    @property
    def replicas(self) -> tuple[tuple[Host, ...], ...]:
        """The hosts of each serving group, its head first."""
        groups: list[list[Host]] = [[] for _ in range(self.cluster.replicas)]
        for h in self.hosts:
            if h.replica != IDLE:
                groups[h.replica].append(h)
        return tuple(tuple(sorted(g, key=lambda h: not h.is_head)) for g in groups)

    @property
    def workers(self) -> tuple[Host, ...]:
        """Every host but the head (with replicas: the other replicas' heads too, so that checks
        across the whole inventory, such as check-nccl and doctor, see every node)."""
        head = self.head
        return tuple(h for h in self.hosts if h != head)

    @property
    def router_hosts(self) -> tuple[Host, ...]:
        """A fleet's router hosts: cluster.router.hosts; with a floating address and no hosts named,
        the heads of the first two replicas; else cluster.router.host (default: replica 0's head)."""
        r = self.cluster.router
        if r.hosts:
            return tuple(self.host(n) for n in r.hosts)
        if r.vip is not None:
            return tuple(g[0] for g in self.replicas[:2])
        return (self.host(r.host) if r.host else self.replicas[0][0],)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @property
    def gpus_per_node(self) -> int:
        if self.cluster.accelerator == "none":
            return 0
        return self.hosts[0].gpus or 0


def kv_events_on(inv: "Inventory") -> bool:
    """The engines publish their KV cache events and the routers subscribe (policy kv_aware, or
    cluster.router.kv_events for bench --ab): a fleet of one model, whole requests (the inventory
    refuses it with models: or cluster.router.prefill)."""
    c = inv.cluster
    return (c.replicas > 1 and not inv.models and not c.router.prefill
            and (c.router.policy == "kv_aware" or c.router.kv_events))
