"""Replicas behind one endpoint: serve, status, rollout and stop over SSH.

The decisions (names, argv, order) are in fleet/plan.py; this module runs them on the hosts.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster import guard as GD
from bootstrap.cluster import plan as PL
from bootstrap.cluster import probe
from bootstrap.doctor import signatures as D
from bootstrap.errors import (
    BootstrapError,
    FleetError,
    Interrupted,
    PreflightFailed,
    ReplicaFailed,
    RolloutFailed,
    ServeFailed,
    UsageError,
)
from bootstrap.fleet import kvcheck as KV
from bootstrap.fleet import plan as FP
from bootstrap.model import Host, Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote.fanout import DEFAULT_PARALLEL, GroupResult, fan_out
from bootstrap.remote.session import Reporter, Session, check_script, last_json_or_error
from bootstrap.serve import experts as EX
from bootstrap.serve import flags as FG
from bootstrap.serve import split as SP

#: serve's processes inside the node containers (a single-replica serve) hold the vLLM port.
from bootstrap.serve.state import check_extra_in_image, engine_counts, read_model_info, stop_serving


@dataclass
class ReplicaState:
    index: int
    hosts: list[str]
    url: str
    #: serve container per host: running, restarting, exited, absent
    containers: dict[str, str]
    #: how often its members' vLLM started again: Docker's restarts of the serve containers and the
    #: member supervisors' own restarts of vLLM (checks/member.py)
    restarts: int
    spec: FP.Spec | None
    health: str
    in_rotation: bool | None
    running: float | None = None
    waiting: float | None = None
    succeeded: float | None = None
    #: the router's own health view of it (vllm_router_worker_health; None: not known)
    router_healthy: bool | None = None
    #: whether the router's circuit breaker for it is closed (vllm_router_cb_state 0; None: not known):
    #: open, the router sends it nothing, healthy or not, until the breaker's timeout has passed
    router_circuit_closed: bool | None = None
    #: 'prefill' or 'decode' in a disaggregated fleet; None: whole requests
    role: str | None = None
    #: KV cache transfers this replica pulled, and those that failed (vLLM's NixlConnector metrics on a
    #: decode replica; None: not exported)
    kv_transfers: float | None = None
    kv_failed: float | None = None
    #: the engine's own latency histograms, sum (seconds) and count: time to first token and
    #: inter-token latency (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds)
    latency: dict[str, float] | None = None
    #: requests finished per data parallel engine index (a DP replica's API server; None: not read)
    engines: dict[str, float] | None = None
    #: each member's standby container (cluster.standby): running, exited, absent...; None: no standbys
    standbys: dict[str, str] | None = None

    @property
    def router_available(self) -> bool | None:
        """Would the router send it a request now (healthy and circuit closed)? None: not known."""
        if self.router_healthy is None:
            return None
        return self.router_healthy and self.router_circuit_closed is not False

    def to_dict(self) -> dict:
        return {"replica": self.index, "hosts": self.hosts, "url": self.url, "containers": self.containers,
                "restarts": self.restarts, "model": self.spec.model if self.spec else None,
                "extra": list(self.spec.extra) if self.spec else None, "health": self.health,
                "in_rotation": self.in_rotation, "running": self.running, "waiting": self.waiting,
                "succeeded": self.succeeded, "router_healthy": self.router_healthy,
                "router_circuit_closed": self.router_circuit_closed, "role": self.role,
                "kv_transfers": self.kv_transfers, "kv_failed": self.kv_failed, "latency": self.latency,
                "dp": self.spec.dp if self.spec else None, "engines": self.engines, "standbys": self.standbys}


@dataclass
class RouterView:
    """One router host as `status` saw it."""

    host: str
    #: its router container: running, restarting, exited, absent, or unknown (...)
    state: str
    #: the router's own list of workers (None: it did not answer)
    workers: list[str] | None = None
    #: keepalived's container on it (a floating address; None: there is none)
    vip_state: str | None = None
    #: whether this host holds the floating address now (None: not known, or no floating address)
    holds_vip: bool | None = None

    def to_dict(self) -> dict:
        return {"host": self.host, "state": self.state, "workers": self.workers, "vip_state": self.vip_state,
                "holds_vip": self.holds_vip}


@dataclass
class FleetState:
    endpoint: str
    router_host: str
    router: str
    #: the router's own list of workers (None: it did not answer)
    router_workers: list[str] | None
    replicas: list[ReplicaState]
    #: every router host's view (the first is router_host's)
    routers: list[RouterView] = field(default_factory=list)
    #: the floating address, and the router host that holds it (None: none does, or not known)
    vip: str | None = None
    vip_holder: str | None = None

    def to_dict(self) -> dict:
        return {"endpoint": self.endpoint, "router_host": self.router_host, "router": self.router,
                "router_workers": self.router_workers, "replicas": [r.to_dict() for r in self.replicas],
                "routers": [r.to_dict() for r in self.routers], "vip": self.vip, "vip_holder": self.vip_holder}


@dataclass
class FleetResult:
    endpoint: str
    served: list[str]
    plan: FP.FleetPlan
    ready_seconds: dict[int, float]
    seconds: float
    notes: list[str] = field(default_factory=list)
    #: the KV transfer check of a disaggregated fleet, one per prefill x decode pair (kvcheck.py)
    kv: list[KV.PairResult] = field(default_factory=list)

    def curl(self) -> str:
        body = json.dumps({"model": self.served[0] if self.served else self.plan.spec.model,
                           "prompt": "San Francisco is a", "max_tokens": 32, "temperature": 0})
        key = self.plan.api_key_env
        auth = f" -H \"Authorization: Bearer ${key}\"" if key else ""
        return f"curl {self.endpoint}/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


@dataclass
class RolloutResult:
    endpoint: str
    target: FP.Spec
    replaced: list[int]
    unchanged: list[int]
    seconds: float
    #: replica -> seconds for drain, stop, start+gate
    steps: dict[int, dict[str, float]] = field(default_factory=dict)


# -- remote steps (each written once) -------------------------------------------------------------


def _create_started(sess: Session, host: Host, create: Sequence[str], name: str, path: str, script: str) -> None:
    """`docker create`, copy a payload in (it stays across restarts), `docker start`. The secrets it
    mounts were put on the host first (guard.put_secrets)."""
    _create_with(sess, host, create, name, {path: check_script(script)})


def _create_with(sess: Session, host: Host, create: Sequence[str], name: str, files: dict[str, bytes]) -> None:
    s = sess.ssh[host.name]
    DK.rm(s, name)
    s.run(tuple(create), timeout=120)
    for path, data in files.items():
        DK.copy_file_in(s, name, path, data)
    DK.start(s, name)


def _probe(sess: Session, host: Host, container: str, args: Sequence[str], timeout: float) -> dict:
    r = sess.ssh[host.name].run_with_input(DK.exec_python_argv(container, list(args)),
                                           [check_script("fleet_probe.py")], timeout=timeout, check=False)
    doc = last_json_or_error(r.stdout)
    if doc.get("ready") is False and "error" in doc and not r.stdout.strip():
        doc["error"] = (r.stderr or "no answer").strip()[-300:]
    return doc


def _inspect(sess: Session, host: Host, name: str) -> F.ContainerState | None:
    return DK.inspect(sess.ssh[host.name], name)


def _logs(sess: Session, host: Host, name: str, tail: int = 200) -> str:
    return DK.logs(sess.ssh[host.name], name, tail)


def _rm(sess: Session, hosts: Sequence[Host], *names: str, stage: str = "remove") -> None:
    """`docker rm -f` on every host: absent is fine, any other failure is a GroupError naming the host."""
    sess.stage(stage, hosts, lambda h: DK.rm(sess.ssh[h.name], *names, timeout=120))


def _stop(sess: Session, host: Host, name: str) -> None:
    """Stop on purpose: SIGTERM (vLLM finishes in-flight work), kill after the grace."""
    DK.stop(sess.ssh[host.name], name, FP.STOP_GRACE + 10, timeout=FP.STOP_GRACE + 60)


def _router_call(sess: Session, inv: Inventory, verb: str, url: str) -> dict:
    """Add or remove a replica on every router; an added one counts once each router would send it
    requests (its own health view healthy, its circuit breaker closed): taking the next replica out
    before that leaves a router none. {"ok": every router did, HOST: each one's answer}."""
    def one(h: Host) -> dict:
        args = [verb, FP.router_url(inv, h), url]
        if verb == "add":
            wait = max(30, 4 * inv.cluster.router.health_interval + 10)
            args += [FP.http_url(h.ip, inv.cluster.router.metrics_port) + "/metrics", str(wait)]
        return _probe(sess, h, FP.router_name(inv), args, timeout=120)
    hosts = FP.router_hosts(inv)
    res = fan_out(hosts, one, key=lambda h: h.name, parallel=len(hosts))
    out: dict = {h: (r if isinstance(r, dict) else {"ok": False, "error": str(r)})
                 for h, r in {**res.succeeded, **res.failed}.items()}
    return {"ok": all(v.get("ok") for v in out.values()), **out}


def stop_vip(sess: Session, host: Host) -> None:
    """Stop keepalived (SIGTERM, 10 s): it gives the floating address up and its entry removes the
    forwarding; `docker rm -f` alone would leave both on the host."""
    DK.stop(sess.ssh[host.name], FP.vip_name(sess.inv), 10, timeout=60)


def _rm_routers(sess: Session, inv: Inventory, stage: str) -> None:
    """Remove the routers and keepalived: keepalived stopped first, so that it gives the floating
    address up and its entry removes the forwarding (a kill would leave both on the host)."""
    if inv.cluster.router.vip is not None:
        sess.stage(f"{stage}-vip", list(FP.router_hosts(inv)), lambda h: stop_vip(sess, h))
    _rm(sess, inv.hosts, FP.router_name(inv), FP.vip_name(inv), stage=stage)


def _check_vip_image(sess: Session, inv: Inventory, image: str) -> None:
    """Refuse a floating address whose image lacks what keepalived's container runs, before any change."""
    vip = inv.cluster.router.vip
    if vip is None:
        return
    img = vip.image or image
    h = FP.router_hosts(inv)[0]
    r = sess.ssh[h.name].run(("docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", img, "-c",
                              "for t in keepalived iptables curl; do command -v $t >/dev/null || echo $t; done"),
                             timeout=300, check=False)
    if not r.ok:
        raise PreflightFailed(h.name, f"could not run the floating address's image {img}: "
                              f"{(r.stderr or r.stdout).strip()[-300:]}")
    missing = r.stdout.split()
    if missing:
        raise PreflightFailed(h.name, f"the image {img} has no {', '.join(missing)}, which keepalived's container "
                              "runs (cluster.router.vip)", "install them in the image (Debian: apt-get install "
                              "keepalived iptables curl), or set cluster.router.vip.image to one that has them")


# -- serve ----------------------------------------------------------------------------------------


def _preflight(sess: Session, inv: Inventory) -> None:
    name = inv.cluster.container_name
    states = sess.stage("inspect", inv.hosts, lambda h: _inspect(sess, h, name))
    down = [h.name for h in inv.hosts if not (states.get(h.name) and states[h.name].running)]
    if down:
        raise PreflightFailed(", ".join(down), "the cluster container is not running", "run `bootstrap up` first")


def _split(sess: Session, inv: Inventory, model: str, tp: int | None, pp: int | None,
           extra: Sequence[str], dp: int | None = None,
           image: str | None = None) -> tuple[dict[int, SP.SplitChoice], list[str]]:
    """Each replica's split, by its number of nodes (one entry when the replicas are of one size):
    TP x PP, or with dp vLLM's data parallel engines within the replica's nodes behind its head's
    API server. --tp/--pp/--dp apply to every replica."""
    c = inv.cluster
    sizes = list(dict.fromkeys(len(g) for g in inv.replicas))  # replica 0's first
    for nodes in sizes:
        if dp is None:
            SP.parallelism(nodes, inv.gpus_per_node, tp, pp, accelerator=c.accelerator)
        else:
            SP.data_parallel(nodes, inv.gpus_per_node, dp, tp, pp, accelerator=c.accelerator)
    info = read_model_info(sess, inv.replicas[0][0], model)
    config = info.get("config") if isinstance(info.get("config"), dict) else None
    shape = SP.model_shape(config) if config else None
    splits = {n: SP.choose_split(shape, n, inv.gpus_per_node, accelerator=c.accelerator, tp=tp, pp=pp, dp=dp)
              for n in sizes}
    notes: list[str] = []
    check_extra_in_image(sess, inv.replicas[0][0], image or c.image, extra, "native", notes, FP.plan_sets(inv))
    engine = EX.EngineCaps.from_doc(info.get("engine"))
    for split in splits.values():
        FG.check_engine_flags(c.accelerator, split.par, extra)
        FP.check_pd(inv, extra, nixl_connector=engine.nixl_connector, nixl="nixl" in engine.modules,
                    pp=split.par.pp)
    if config is None:
        notes.append(f"could not read the model's config.json ({info.get('error') or 'no answer'}): "
                     "the split is not checked against the model")
    return splits, notes


def _node_facts(sess: Session, inv: Inventory) -> dict:
    """plan_fleet's per-host facts: nofile= (the limit to give), derived= (plan.derived_env),
    ucx= (plan.ucx_env), ifaces= and nets= (each router host's interface and network) and cpus= (each
    host's CPU count)."""
    facts = probe.gather_hosts(sess, inv.hosts)
    return {"nofile": {h.name: PL.nofile_for(inv, facts.get(h.name)) for h in inv.hosts},
            "derived": {h.name: PL.derived_env(inv, h, facts.get(h.name)) for h in inv.hosts},
            "ucx": {h.name: PL.ucx_env(inv, h, facts.get(h.name)) for h in inv.hosts},
            "ifaces": {h.name: PL.interface_of(h, facts.get(h.name)) for h in FP.router_hosts(inv)},
            "nets": {h.name: PL.network_of(h, facts.get(h.name)) for h in FP.router_hosts(inv)},
            "cpus": {h.name: f.rack.cpus for h in inv.hosts
                     if (f := facts.get(h.name)) is not None and f.rack is not None}}


def _kv_check(sess: Session, inv: Inventory, ucx: dict, *, port: int | None = None,
              stop: bool = True) -> list[KV.PairResult]:
    """checks/kv_check.py in the cluster containers, a decode head reading from a prefill head, one
    pair at a time (each uses its prefill head's KV side-channel port, or `port`); stop: ServeFailed
    at the first pair that fails (serve, before any member starts), else every pair's result."""
    name = inv.cluster.container_name
    results = []
    for pair in KV.pairs(inv):
        argv = {pair.source.name: KV.source_args(inv, pair, ucx.get(pair.source.name) or {}, port),
                pair.reader.name: KV.reader_args(inv, pair, ucx.get(pair.reader.name) or {}, port)}
        outs = sess.stage("kv-check", [pair.source, pair.reader], lambda h, argv=argv: sess.ssh[h.name].run_with_input(
            DK.exec_python_argv(name, argv[h.name]), [check_script("kv_check.py")],
            timeout=KV.TIMEOUT_S + 60, check=False))
        src, rdr = outs[pair.source.name], outs[pair.reader.name]
        res = KV.parse(pair, src.stdout, src.exit_code, rdr.stdout, rdr.exit_code, rdr.stderr)
        results.append(res)
        if stop and not res.ok:
            raise ServeFailed(f"KV transfer check: {res.describe()}",
                              "\n".join(f"{h}: {line}" for h, r in ((pair.source.name, src), (pair.reader.name, rdr))
                                        for line in KV.log_lines(r.stdout + "\n" + r.stderr)),
                              tail_of="the KV transfer check (checks/kv_check.py)")
    return results


def check_kv(inv: Inventory, *, port: int | None = None, parallel: int = DEFAULT_PARALLEL,
             reporter: Reporter | None = None) -> list[KV.PairResult]:
    """`check-kv`: the KV transfer check of a disaggregated fleet on its own, after `up` (the
    cluster containers run it) and before or beside `serve` (with another port while the fleet's
    members hold cluster.ports.kv_transfer)."""
    if not FP.is_pd(inv):
        raise FleetError("check-kv checks the KV path between prefill and decode replicas: the inventory has "
                         "none (set cluster.replicas > 1 and cluster.router.prefill)")
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _preflight(sess, inv)
        facts = probe.gather_hosts(sess, inv.hosts)
        ucx = {h.name: PL.ucx_env(inv, h, facts.get(h.name)) for h in inv.hosts}
        return _kv_check(sess, inv, ucx, port=port, stop=False)


def _ensure_keeper(sess: Session, inv: Inventory) -> None:
    argv = FP.keeper_create_argv(inv)
    sess.stage("keeper", inv.hosts, lambda h: _create_started(sess, h, argv, FP.keeper_name(inv),
                                                              FP.KEEPER_PATH, "keeper.py"))


def _start_replica(sess: Session, inv: Inventory, rp: FP.ReplicaPlan, stage: str = "start") -> None:
    hosts = [inv.host(m.host) for m in rp.members]
    by_host = {m.host: m for m in rp.members}
    sess.stage(stage, hosts, lambda h: _create_started(sess, h, by_host[h.name].create, FP.serve_name(inv),
                                                       FP.MEMBER_PATH, "member.py"))


def _start_standbys(sess: Session, inv: Inventory, rps: Sequence[FP.ReplicaPlan], stage: str = "standby") -> None:
    """Each member's standby (cluster.standby): its serve container's twin, vLLM imported and
    waiting, that the keeper puts in the place of a killed one (checks/keeper.py). Started once the
    replicas serve, so that its imports do not slow their start."""
    members = [m for rp in rps for m in rp.members if m.standby]
    if not members:
        return
    by_host = {m.host: m for m in members}
    files = {FP.MEMBER_PATH: check_script("member.py"), FP.ROLE_PATH: b"standby\n"}
    sess.stage(stage, [inv.host(h) for h in by_host],
               lambda h: _create_with(sess, h, by_host[h.name].standby, FP.standby_name(inv), files))


def _gate(sess: Session, inv: Inventory, k: int, wait: float) -> dict:
    head = inv.replicas[k][0]
    return _probe(sess, head, FP.serve_name(inv), ["ready", FP.replica_url(inv, k), str(wait), FP.EXITED_PATH],
                  timeout=wait + 120)


def _replica_failure(sess: Session, inv: Inventory, k: int, ready: dict) -> tuple[str, str]:
    """Why replica k did not serve: vLLM's own root cause from its members' logs, and the tail."""
    tails = {h.name: _logs(sess, h, FP.serve_name(inv)) for h in inv.replicas[k]}
    root = D.root_cause_of(tails)
    findings = D.scan_logs(tails, infiniband=inv.cluster.infiniband)
    cause = root or (findings[0].title if findings else ready.get("error") or "no answer")
    head_log = tails[inv.replicas[k][0].name]
    return cause, "\n".join(head_log.splitlines()[-30:])


def serve_fleet(inv: Inventory, model: str, *, tp: int | None = None, pp: int | None = None,
                dp: int | None = None, backend: str | None = None, extra: Sequence[str] = (), wait: float = 900.0,
                served_name: str | None = None, parallel: int = DEFAULT_PARALLEL, dry_run: bool = False,
                on_plan: Callable[[FP.FleetPlan], None] | None = None,
                reporter: Reporter | None = None) -> FleetResult | FP.FleetPlan:
    """Serve the model on every replica at once, gate each on a real completion, put the router in
    front and check a completion through it."""
    FP.check_backend(inv, backend)
    FP.check_pd_flags(inv, extra)  # before any host is contacted (the image's table checks it again)
    t0 = time.monotonic()
    spec = FP.Spec(model, tuple(extra), inv.cluster.image, served_name, dp)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _preflight(sess, inv)
        GD.check_secret_store(sess, inv.hosts)
        splits, notes = _split(sess, inv, model, tp, pp, extra, dp)
        _check_vip_image(sess, inv, spec.image)
        facts = _node_facts(sess, inv)
        plan = FP.plan_fleet(inv, spec, splits, notes=notes, **facts)
        if on_plan is not None:
            on_plan(plan)
        if dry_run:
            return plan
        sess.stage("stop-old", inv.hosts, lambda h: stop_serving(sess, h))  # what a single `serve` started
        _rm_routers(sess, inv, "remove-old-router")
        _rm(sess, inv.hosts, *FP.serve_names(inv), stage="remove-old")
        kv = _kv_check(sess, inv, facts["ucx"])
        notes.extend(w for w in (r.warning(inv.cluster.infiniband) for r in kv) if w)
        GD.put_secrets(sess, inv.hosts, prune=False)
        _ensure_keeper(sess, inv)
        for rp in plan.replicas:
            _start_replica(sess, inv, rp)
        ready = fan_out(range(len(plan.replicas)), lambda k: _gate(sess, inv, k, wait), key=lambda k: k,
                        parallel=len(plan.replicas))
        bad = {**ready.failed, **{k: r for k, r in ready.succeeded.items() if not r.get("ready")}}
        if bad:
            k = min(bad)
            r = bad[k]
            cause, tail = _replica_failure(sess, inv, k, r if isinstance(r, dict) else {"error": str(r)})
            others = f" (also replica {', '.join(map(str, sorted(set(bad) - {k})))})" if len(bad) > 1 else ""
            failed = ServeFailed(f"replica {k} ({', '.join(plan.replicas[k].hosts)}) did not serve: {cause}{others}",
                                 tail)
            # a removal that fails is attached to the error, not raised in its place (Session.cleanup)
            names = (*FP.serve_names(inv), FP.router_name(inv), FP.vip_name(inv))
            sess.cleanup("stop-failed", inv.hosts, lambda h: DK.rm(sess.ssh[h.name], *names, timeout=120), failed)
            raise failed
        launches = {r.host: r for r in plan.routers}
        rhosts = list(FP.router_hosts(inv))
        sess.stage("router", rhosts, lambda h: sess.ssh[h.name].run(launches[h.name].run, timeout=120))
        throughs = fan_out(rhosts, lambda h: _probe(sess, h, FP.router_name(inv),
                                                    ["ready", FP.router_url(inv, h), "120"], timeout=240),
                           key=lambda h: h.name, parallel=len(rhosts))
        for h in rhosts:
            through = throughs.succeeded.get(h.name) or {"error": str(throughs.failed.get(h.name))}
            if not through.get("ready"):
                tail = _logs(sess, h, FP.router_name(inv), 30)
                raise ServeFailed(f"the router on {h.name} did not answer a completion: {through.get('error')}", tail)
        if plan.vip is not None:
            sess.stage("vip", rhosts, lambda h: _create_with(sess, h, launches[h.name].vip_create, FP.vip_name(inv), {
                FP.VIP_ENTRY_PATH: check_script("vip_entry.sh"),
                FP.VIP_CONF_PATH: launches[h.name].vip_config.encode()}))
            through = _probe(sess, rhosts[0], FP.router_name(inv), ["ready", FP.router_url(inv), "60"], timeout=120)
            if not through.get("ready"):
                tails = "\n".join(f"{h.name}: {_logs(sess, h, FP.vip_name(inv), 15)}" for h in rhosts)
                raise ServeFailed(f"the floating address {plan.vip} did not answer a completion: "
                                  f"{through.get('error')}", tails)
        _start_standbys(sess, inv, plan.replicas)
        return FleetResult(plan.endpoint, through.get("models", []), plan,
                           {k: float(r.get("t", 0)) for k, r in ready.items()}, time.monotonic() - t0, notes, kv)


def stop_fleet(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None) -> list[str]:
    """Remove the serve containers, the router and the keepers (the node containers stay)."""
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _rm(sess, inv.hosts, FP.keeper_name(inv), stage="stop-keeper")
        _rm_routers(sess, inv, "stop-router")
        _rm(sess, inv.hosts, *FP.serve_names(inv), stage="stop")
    return [h.name for h in inv.hosts]


# -- status ---------------------------------------------------------------------------------------


def fleet_state(sess: Session) -> FleetState:
    inv = sess.inv
    sname = FP.serve_name(inv)
    twin = FP.standby_name(inv) if inv.cluster.standby else ""
    looked = sess.stage("inspect-serve", inv.hosts, lambda h: (_inspect(sess, h, sname), DK.supervised_restarts(
                            sess.ssh[h.name], sname, FP.STARTS_PATH, twin)), strict=False)
    inspected, not_inspected = looked.succeeded, looked.failed
    urls = [FP.replica_url(inv, k) for k in range(inv.cluster.replicas)]
    routers, views = _router_views(sess, inv, urls)
    # the replicas as the router that holds the address sees them (else the first that answered)
    first = next((r for r in routers if r.holds_vip), None) or next((r for r in routers if r.host in views), None)
    view = views[first.host] if first is not None else None
    if view is None:
        some = next((h for h in inv.hosts if h.name in inspected
                     and inspected[h.name][0] is not None and inspected[h.name][0].running), None)
        view = (_probe(sess, some, sname, ["status", "-", "-", *urls], timeout=60) if some else {})
    rview = view.get("router") or {}
    workers = rview.get("workers") if isinstance(rview, dict) and "workers" in rview else None
    healthy = rview.get("healthy") if isinstance(rview, dict) else None
    closed = rview.get("circuit_closed") if isinstance(rview, dict) else None
    replicas = []
    for k, group in enumerate(inv.replicas):
        containers, restarts, spec, standbys = {}, 0, None, {}
        unknown = []
        for h in group:
            if h.name in not_inspected:  # unreachable, or its Docker does not answer: not "absent"
                containers[h.name] = "unknown"
                unknown.append(f"{h.name}: {not_inspected[h.name]}")
                continue
            got = inspected.get(h.name)
            st, (docker_restarts, starts, standby) = (None, (0, None, None)) if got is None else got
            containers[h.name] = st.status if st else "absent"
            # the container's restarts by Docker, and its supervisor's starts of vLLM after the first
            restarts += docker_restarts + max(0, (starts or 1) - 1)
            if standby is not None:
                standbys[h.name] = standby
            if st and h is group[0]:
                spec = FP.Spec.from_label(st.labels.get(FP.LABEL_SERVE))
        row = (view.get("replicas") or {}).get(urls[k]) or {}
        if row.get("health") == 200:
            health = "healthy"
        elif unknown:
            health = f"unknown ({'; '.join(unknown)})"[:300]
        elif all(v == "absent" for v in containers.values()):
            health = "not serving"
        elif any(v in ("running", "restarting") for v in containers.values()):
            health = "starting" if not row.get("error") else "starting (not answering)"
        else:
            health = "down"
        replicas.append(ReplicaState(k, [h.name for h in group], urls[k], containers, restarts, spec, health,
                                     (urls[k] in workers) if workers is not None else None,
                                     row.get("running"), row.get("waiting"), row.get("succeeded"),
                                     healthy.get(urls[k]) if isinstance(healthy, dict) else None,
                                     closed.get(urls[k]) if isinstance(closed, dict) else None,
                                     FP.role(inv, k), row.get("kv_transfers"), row.get("kv_failed"),
                                     {n: float(row[n]) for n in LATENCY_KEYS if isinstance(row.get(n), (int, float))},
                                     engine_counts(row.get("engines")), standbys or None))
    shown = first or routers[0]
    holder = next((r.host for r in routers if r.holds_vip), None)
    vip = inv.cluster.router.vip
    return FleetState(FP.router_url(inv) + "/v1", shown.host, shown.state, workers, replicas, routers,
                      vip.address if vip else None, holder)


def _router_views(sess: Session, inv: Inventory, urls: Sequence[str]) -> tuple[list[RouterView], dict[str, dict]]:
    """Each router host's router (its state, its workers) and keepalived (its state, whether the
    host holds the floating address), and each answering router's whole status probe by host."""
    vip = inv.cluster.router.vip

    def look(h: Host) -> tuple[RouterView, dict | None]:
        router = _inspect(sess, h, FP.router_name(inv))
        kad = _inspect(sess, h, FP.vip_name(inv)) if vip is not None else None
        rv = RouterView(h.name, router.status if router else "absent",
                        vip_state=(kad.status if kad else "absent") if vip is not None else None)
        if router is None or not router.running:
            return rv, None
        metrics = FP.http_url(h.ip, inv.cluster.router.metrics_port) + "/metrics"
        doc = _probe(sess, h, FP.router_name(inv), ["status", FP.router_url(inv, h), metrics, *urls], timeout=60)
        rdoc = doc.get("router")
        rv.workers = rdoc.get("workers") if isinstance(rdoc, dict) and "workers" in rdoc else None
        if vip is not None:
            rv.holds_vip = bool(_probe(sess, h, FP.router_name(inv), ["holds", vip.address], timeout=30).get("holds"))
        return rv, doc

    hosts = FP.router_hosts(inv)
    got = sess.stage("inspect-router", hosts, look, strict=False)
    routers, views = [], {}
    for h in hosts:
        if h.name in got.succeeded:
            rv, doc = got.succeeded[h.name]
            if doc is not None:
                views[h.name] = doc
        else:
            rv = RouterView(h.name, f"unknown ({got.failed[h.name]})"[:300])
        routers.append(rv)
    return routers, views


def status(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None) -> FleetState:
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect(strict=False)  # a host that is down is shown as such, not an error
        return fleet_state(sess)


#: the histogram sums and counts fleet_probe.py reads from each replica's /metrics
LATENCY_KEYS = ("ttft_sum", "ttft_count", "itl_sum", "itl_count")


@dataclass(frozen=True)
class Spread:
    """Requests each replica finished between two status samples (vllm:request_success_total), and
    in a disaggregated fleet each role's own latency over them (the engines' histograms)."""

    per_replica: dict[int, int]
    #: replica -> its role ('prefill'/'decode'; absent: whole requests)
    roles: dict[int, str] = field(default_factory=dict)
    #: replica -> {"ttft_ms", "itl_ms"}: the engine's mean time to first token and inter-token latency
    #: between the samples (None: nothing measured)
    latency_ms: dict[int, dict[str, float | None]] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        vals = list(self.per_replica.values())
        return max(vals) / min(vals) if vals and min(vals) > 0 else None

    def to_dict(self) -> dict:
        return {"per_replica": {str(k): v for k, v in self.per_replica.items()}, "max_over_min": self.ratio,
                "roles": {str(k): v for k, v in self.roles.items()},
                "latency_ms": {str(k): v for k, v in self.latency_ms.items()}}

    def describe(self) -> str:
        parts = ", ".join(f"replica {k}: {v}" for k, v in sorted(self.per_replica.items()))
        r = self.ratio
        line = f"spread over replicas: {parts} (max/min {r:.2f})" if r else f"spread over replicas: {parts}"
        if not self.roles:
            return line
        per = []
        for k, role in sorted(self.roles.items()):
            lat = self.latency_ms.get(k) or {}
            what = (("TTFT", lat.get("ttft_ms")),) if role == "prefill" else (("TTFT", lat.get("ttft_ms")),
                                                                               ("ITL", lat.get("itl_ms")))
            per.append(f"replica {k} ({role}): " + ", ".join(
                f"{n} mean {v:.1f} ms" if v is not None else f"{n} -" for n, v in what))
        return line + "\nper role, as the engines measure it: " + "; ".join(per)


def spread(before: FleetState, after: FleetState) -> Spread:
    got, roles, lat = {}, {}, {}
    for b, a in zip(before.replicas, after.replicas):
        d = (a.succeeded or 0) - (b.succeeded or 0)
        got[a.index] = int(d if d >= 0 else (a.succeeded or 0))  # a restarted replica counts from 0
        if a.role:
            roles[a.index] = a.role
        lat[a.index] = {f"{n}_ms": _mean_ms(b.latency, a.latency, n) for n in ("ttft", "itl")}
    return Spread(got, roles, lat)


def _mean_ms(before: dict | None, after: dict | None, name: str) -> float | None:
    """The mean of a histogram between two samples, in ms (None: not exported, or no new samples)."""
    b, a = before or {}, after or {}
    try:
        n = a[f"{name}_count"] - b.get(f"{name}_count", 0.0)
        total = a[f"{name}_sum"] - b.get(f"{name}_sum", 0.0)
    except KeyError:
        return None
    return total / n * 1000 if n > 0 and total >= 0 else None


# -- rollout --------------------------------------------------------------------------------------


def rollout(inv: Inventory, *, model: str | None = None, extra: Sequence[str] | None = None,
            image: str | None = None, served_name: str | None = None, dp: int | None | bool = False,
            drain: float = 120.0, wait: float = 900.0, max_unavailable: int = 1, parallel: int = DEFAULT_PARALLEL,
            reporter: Reporter | None = None, on_step: Callable[[int, str], None] | None = None) -> RolloutResult:
    """Replace the replicas one batch at a time (max_unavailable per batch): out of the router,
    drained, stopped (kept for rollback), started with the new spec, gated on a completion, back in
    the router. dp: False keeps each replica's shape, an int changes it to that many data parallel
    engines, None to a TP x PP group. A replica that does not serve is rolled back and the rollout stops, naming it;
    the others keep serving. Ctrl-C rolls the replica in flight back and lists every replica."""
    t0 = time.monotonic()
    step = on_step or (lambda k, what: None)
    if max_unavailable < 1:
        raise UsageError("--max-unavailable must be at least 1")
    FP.check_pd_flags(inv, extra or ())  # before any host is contacted (the image's table checks it again)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _preflight(sess, inv)
        state = fleet_state(sess)
        current = [r.spec for r in state.replicas]
        base = next((s for s in current if s is not None), None)
        if base is None:
            raise PreflightFailed("fleet", "no replica is serving", "run `bootstrap serve MODEL` first")
        target = FP.Spec(model or base.model, tuple(extra) if extra is not None else base.extra,
                         image or base.image or inv.cluster.image,
                         served_name if served_name is not None else base.served_name,
                         base.dp if dp is False else dp)
        todo = FP.rollout_order(current, target)
        if todo and FP.is_pd(inv):
            raise UsageError("rollout replaces replicas one at a time behind the router, which is not built for a "
                             "disaggregated fleet (cluster.router.prefill) yet: `bootstrap serve` with the new model "
                             "or flags restarts every replica")
        down = [r for r in state.routers if r.state != "running"]
        if down:
            raise PreflightFailed(down[0].host, f"the router container is {down[0].state}: a rollout changes "
                                  "every router's workers", "run `bootstrap serve` to start it")
        healthy = [r.index for r in state.replicas if r.health == "healthy"]
        if todo and not healthy:
            raise PreflightFailed("fleet", f"no replica of {len(inv.replicas)} is healthy: a rollout needs one serving "
                                  "while another is replaced", "see `bootstrap status`; `bootstrap serve` starts over")
        # never every replica at once: one keeps serving
        max_unavailable = min(max_unavailable, len(inv.replicas) - 1)
        splits, _ = _split(sess, inv, target.model, None, None, target.extra, target.dp, target.image)
        inv_t = inv if not image else _with_image(inv, target.image)
        plan = FP.plan_fleet(inv_t, target, splits, **_node_facts(sess, inv))
        if todo:
            GD.check_secret_store(sess, inv.hosts)
            GD.put_secrets(sess, inv.hosts, prune=False)  # a secret changed since `serve`: the new replicas get it
        states = {k: "new" if k not in todo else "old" for k in range(len(inv.replicas))}
        steps: dict[int, dict[str, float]] = {}
        for i in range(0, len(todo), max_unavailable):
            batch = todo[i:i + max_unavailable]
            others = _others_serving(sess, inv, batch, step)
            if not others:
                raise RolloutFailed(f"no other replica is healthy and in the router's rotation: replica "
                                    f"{', '.join(map(str, batch))} stays as it is", states)
            try:
                res = _replace_batch(sess, inv, [plan.replicas[k] for k in batch], drain, wait, step, steps)
            except KeyboardInterrupt:
                for k in batch:
                    states[k] = _roll_back(sess, inv, k, wait, step)
                raise Interrupted("rollout", "replace",
                                  {f"replica {k}": v for k, v in states.items()}) from None
            failed = res.failed
            for k in batch:
                err = failed.get(k)
                states[k] = "new" if err is None else getattr(err, "state", f"unknown ({err})")
            if failed:
                k = min(failed)
                err = failed[k]
                raise RolloutFailed(f"replica {k} ({', '.join(h.name for h in inv.replicas[k])}) did not serve "
                                    f"{target.describe()}: {getattr(err, 'cause', err)}; replica {k} is {states[k]}, "
                                    "the other replicas keep serving", states, getattr(err, "log_tail", ""))
        return RolloutResult(FP.router_url(inv) + "/v1", target, todo,
                             [k for k in range(len(inv.replicas)) if k not in todo], time.monotonic() - t0, steps)


def _others_serving(sess: Session, inv: Inventory, batch: Sequence[int],
                    step: Callable[[int, str], None]) -> list[int]:
    """The replicas outside `batch` that serve now, as they and the router see them (healthy, in
    the rotation, the router's circuit for them closed). A replica whose circuit is open (it failed
    requests, say it was restarted a moment ago) is waited for, up to the breaker's timeout: taking
    the batch out before that leaves the router no replica to send a request to."""
    deadline = time.monotonic() + FP.CB_TIMEOUT + 3 * inv.cluster.router.health_interval + 10
    said = False
    while True:
        reps = [r for r in fleet_state(sess).replicas if r.index not in batch]
        ready = [r.index for r in reps if r.health == "healthy" and r.in_rotation is not False
                 and r.router_available is not False]
        held = [r.index for r in reps if r.health == "healthy" and r.in_rotation and r.router_available is False]
        if ready or not held or time.monotonic() > deadline:
            return ready
        if not said:
            step(batch[0], f"waiting: the router holds replica {', '.join(map(str, held))} out (circuit open after "
                           f"failed requests, or its health checks); it tries again within {FP.CB_TIMEOUT}s")
            said = True
        time.sleep(1.0)


def _replace_batch(sess: Session, inv: Inventory, rps: list[FP.ReplicaPlan], drain: float, wait: float,
                   step: Callable[[int, str], None], steps: dict) -> GroupResult:
    """Replace these replicas; {index: None or the error}. One replica runs in this thread, so that
    Ctrl-C stops it where it is and the caller rolls it back."""
    if len(rps) == 1:
        try:
            _replace(sess, inv, rps[0], drain, wait, step, steps)
            return GroupResult({rps[0].index: None})
        except BootstrapError as exc:
            return GroupResult({rps[0].index: exc})
    return fan_out(rps, lambda rp: _replace(sess, inv, rp, drain, wait, step, steps), key=lambda rp: rp.index,
                   parallel=len(rps))


def _with_image(inv: Inventory, image: str) -> Inventory:
    from dataclasses import replace
    return replace(inv, cluster=replace(inv.cluster, image=image))


def _replace(sess: Session, inv: Inventory, rp: FP.ReplicaPlan, drain: float, wait: float,
             step: Callable[[int, str], None], steps: dict) -> None:
    k = rp.index
    hosts = list(inv.replicas[k])
    timing: dict[str, float] = {}
    steps[k] = timing
    t = time.monotonic()
    step(k, "out of the router")
    out = _router_call(sess, inv, "remove", rp.url)
    if not out.get("ok"):
        raise RolloutFailed(f"the router did not take replica {k} out: {out}", {})
    step(k, "draining")
    d = _probe(sess, hosts[0], FP.serve_name(inv), ["drain", rp.url, str(drain)], timeout=drain + 60)
    timing["drain"] = time.monotonic() - t
    step(k, f"drained ({d.get('why', '?')})")
    t = time.monotonic()
    sname, oname = FP.serve_name(inv), FP.old_name(inv)
    # Renamed first: the keeper restarts only containers under the serving name. The head (the API
    # server) is stopped first and alone: its vLLM finishes what is still in flight (member.py's
    # --shutdown-timeout) while the other members, whose GPUs those requests need, are still there.
    sb, sbold = FP.standby_name(inv), FP.standby_old_name(inv)
    # the standbys too: they serve the old spec (the keeper would not take over with them anyway)
    sess.stage(f"retire-r{k}", hosts, lambda h: (DK.rm(sess.ssh[h.name], oname, sbold),
                                                DK.rename(sess.ssh[h.name], sname, oname),
                                                DK.rename_if_present(sess.ssh[h.name], sb, sbold)))
    sess.stage(f"stop-r{k}", hosts[:1], lambda h: _stop(sess, h, oname))
    if hosts[1:]:
        sess.stage(f"stop-r{k}-members", hosts[1:], lambda h: _stop(sess, h, oname))
    timing["stop"] = time.monotonic() - t
    t = time.monotonic()
    step(k, "starting the new spec")
    _start_replica(sess, inv, rp, stage=f"start-r{k}")
    ready = _gate(sess, inv, k, wait)
    timing["start"] = time.monotonic() - t
    if not ready.get("ready"):
        cause, tail = _replica_failure(sess, inv, k, ready)
        raise ReplicaFailed(cause, _roll_back(sess, inv, k, wait, step), tail)
    back = _router_call(sess, inv, "add", rp.url)
    if not back.get("ok"):
        raise RolloutFailed(f"the router did not take replica {k} back: {back}", {})
    step(k, f"serving the new spec, back in the router ({ready.get('t', 0):.0f}s to serve)")
    _rm(sess, hosts, oname, sbold, stage=f"clean-r{k}")
    _start_standbys(sess, inv, [rp], stage=f"standby-r{k}")


def _roll_back(sess: Session, inv: Inventory, k: int, wait: float, step: Callable[[int, str], None]) -> str:
    """Put replica k's old containers back (kept stopped under the old name) and into the router."""
    hosts = list(inv.replicas[k])
    sname, oname = FP.serve_name(inv), FP.old_name(inv)
    if not all(_inspect(sess, h, oname) for h in hosts):
        if not all(_inspect(sess, h, sname) for h in hosts):
            return "down: nothing to roll back to"
        back = _router_call(sess, inv, "add", FP.replica_url(inv, k))  # it may have left the router already
        return "old (left as it was)" if back.get("ok") else "old (left as it was, not in the router)"
    step(k, "rolling back")
    sb, sbold = FP.standby_name(inv), FP.standby_old_name(inv)
    sess.stage(f"rollback-r{k}", hosts, lambda h: (DK.rm(sess.ssh[h.name], sname, sb),
                                                  DK.rename(sess.ssh[h.name], oname, sname),
                                                  DK.rename_if_present(sess.ssh[h.name], sbold, sb),
                                                  DK.start(sess.ssh[h.name], sname)))
    ready = _gate(sess, inv, k, wait)
    if not ready.get("ready"):
        return f"down: the old spec did not serve again ({ready.get('error')})"
    back = _router_call(sess, inv, "add", FP.replica_url(inv, k))
    step(k, "rolled back, serving the old spec")
    return "old (rolled back)" if back.get("ok") else "old (rolled back, not in the router)"
