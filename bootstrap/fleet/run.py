"""Replicas behind one endpoint: serve, status, rollout and stop over SSH.

The decisions (names, argv, order) are in fleet/plan.py; this module runs them on the hosts.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from bootstrap.cluster import plan as PL
from bootstrap.cluster import probe
from bootstrap.cluster.guard import run as GD
from bootstrap.errors import (
    FleetError,
    ServeFailed,
)
from bootstrap.fleet import converge as CV
from bootstrap.fleet import kvcheck as KV
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.fleet.steps import (
    _check_vip_image,
    _create_with,
    _in_router,
    _logs,
    _node_facts,
    _pool_split,
    _preflight,
    _probe,
    _rm,
    _rm_routers,
    _split,
    _start_standbys,
    drain_out,
    drained_hosts,
    start_gated,
    start_routers,
)
from bootstrap.model import Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Reporter, Session, check_script

#: serve's processes inside the node containers (a single-replica serve) hold the vLLM port.
from bootstrap.serve.state import stop_serving


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
    #: a pool that served already: what `serve` changed and kept (fleet/converge.py); None: all started
    changes: list[CV.Change] | None = None

    def curl(self) -> str:
        body = json.dumps({"model": self.served[0] if self.served else self.plan.spec.model,
                           "prompt": "San Francisco is a", "max_tokens": 32, "temperature": 0})
        key = self.plan.api_key_env
        auth = f" -H \"Authorization: Bearer ${key}\"" if key else ""
        return f"curl {self.endpoint}/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


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
        outs = sess.stage("kv-check", [pair.source, pair.reader], lambda h, argv=argv: N.of(sess, h, name).ask(
            "kv_check.py", *argv[h.name], timeout=KV.TIMEOUT_S + 60).result)
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
    if not FN.is_pd(inv):
        raise FleetError("check-kv checks the KV path between prefill and decode replicas: the inventory has "
                         "none (set cluster.replicas > 1 and cluster.router.prefill)")
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _preflight(sess, inv)
        facts = probe.gather_hosts(sess, inv.hosts)
        ucx = {h.name: PL.ucx_env(inv, h, facts.get(h.name)) for h in inv.hosts}
        return _kv_check(sess, inv, ucx, port=port, stop=False)


def serve_fleet(inv: Inventory, model: str | None, *, tp: int | None = None, pp: int | None = None,
                dp: int | None = None, backend: str | None = None, extra: Sequence[str] = (), wait: float = 900.0,
                served_name: str | None = None, parallel: int = DEFAULT_PARALLEL, dry_run: bool = False,
                on_plan: Callable[[FP.FleetPlan], None] | None = None, drain: float = 120.0,
                on_changes: Callable[[list[CV.Change] | None, str | None], None] | None = None,
                reporter: Reporter | None = None) -> FleetResult | FP.FleetPlan:
    """Serve the model on every replica at once, gate each on a real completion, put the router in
    front and check a completion through it. A pool (inv.models; model None): each replica group
    serves its model, and the routers route by the request's model (each model checked through them).
    A pool that serves already converges (fleet/converge.py): on_changes(changes, None) before anything
    changes (the caller may refuse by raising), or on_changes(None, why) when every replica restarts."""
    FP.check_backend(inv, backend)
    FP.check_pd_flags(inv, extra)  # before any host is contacted (the image's table checks it again)
    t0 = time.monotonic()
    spec = FP.Spec(model or "", tuple(extra), inv.cluster.image, served_name, dp)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _preflight(sess, inv)
        GD.check_secret_store(sess, inv.hosts)
        if inv.models:
            specs: FP.Spec | list[FP.Spec] = FP.pool_specs(inv, inv.cluster.image)
            splits, notes = _pool_split(sess, inv, inv.cluster.image)
        else:
            specs = spec
            splits, notes = _split(sess, inv, spec.model, tp, pp, extra, dp)
        _check_vip_image(sess, inv, spec.image)
        facts = _node_facts(sess, inv)
        plan = FP.plan_fleet(inv, specs, splits, notes=notes, **facts)
        if on_plan is not None:
            on_plan(plan)
        if inv.models:
            done = _converge(sess, inv, plan, dry_run=dry_run, wait=wait, drain=drain, on_changes=on_changes)
            if done is not None:
                return done if not isinstance(done, list) else FleetResult(
                    plan.endpoint, [m.name for m in inv.models], plan, {}, time.monotonic() - t0, notes, [], done)
        if dry_run:
            return plan
        ready = _launch(sess, inv, plan, facts, notes, wait)
        through = _routers(sess, inv, plan)
        _keep_drained_out(sess, inv, notes)
        _start_standbys(sess, inv, plan.replicas)
        return FleetResult(plan.endpoint, through.get("models", []), plan,
                           {k: float(r.get("t", 0)) for k, r in ready.items()}, time.monotonic() - t0, notes,
                           facts.get("kv", []))


def _converge(sess: Session, inv: Inventory, plan: FP.FleetPlan, *, dry_run: bool, wait: float, drain: float,
              on_changes: Callable | None) -> FP.FleetPlan | list[CV.Change] | None:
    """A pool that serves already: its changes run (fleet/converge.py) and returned (the plan with
    dry_run); None: nothing serves, or the routers cannot change in place, and serve starts over."""
    running, routers, routed, policies = CV.read(sess, inv)
    if not any(r is not None and r.running for r in running.values()):
        return None
    why = CV.router_ready(inv, plan, routers)
    if why is not None:
        if on_changes is not None:
            on_changes(None, why)
        return None
    todo = CV.changes(inv, plan, running, routed, policies)
    if on_changes is not None:
        on_changes(todo, None)
    if dry_run:
        return plan
    CV.converge(sess, inv, plan, [c for c in todo if c.action != CV.KEEP], wait=wait, drain=drain,
                step=lambda c, what: sess.reporter.event(", ".join(c.hosts) or c.url, c.action, "", what))
    return todo


def _launch(sess: Session, inv: Inventory, plan: FP.FleetPlan, facts: dict, notes: list[str], wait: float) -> dict:
    """Stop what served before, check the KV path (disaggregated), start every replica and wait for
    each to answer a completion; ServeFailed naming the first replica that did not."""
    sess.stage("stop-old", inv.hosts, lambda h: stop_serving(sess, h))  # what a single `serve` started
    _rm_routers(sess, inv, "remove-old-router")
    _rm(sess, inv.hosts, *FN.serve_names(inv), stage="remove-old")
    kv = _kv_check(sess, inv, facts["ucx"])
    facts["kv"] = kv
    notes.extend(w for w in (r.warning(inv.cluster.infiniband) for r in kv) if w)
    GD.put_secrets(sess, inv.hosts, prune=False)
    try:
        return start_gated(sess, inv, plan.replicas, wait)
    except ServeFailed as failed:
        # a removal that fails is attached to the error, not raised in its place (Session.cleanup)
        names = (*FN.serve_names(inv), FN.router_name(inv), FN.vip_name(inv))
        sess.cleanup("stop-failed", inv.hosts, lambda h: DK.rm(sess.ssh[h.name], *names, timeout=120), failed)
        raise


def _keep_drained_out(sess: Session, inv: Inventory, notes: list[str]) -> None:
    """The replicas with a drained host (bootstrap drain) out of every router: serving, not in rotation."""
    drained = set(drained_hosts(sess, inv.hosts))
    for k, group in enumerate(inv.replicas):
        marked = [h.name for h in group if h.name in drained]
        if not marked:
            continue
        out = _in_router(sess, inv, k, False)
        if not out.get("ok"):
            raise ServeFailed(f"replica {k} is drained ({', '.join(marked)}) but the routers did not let go of it: "
                              f"{out}", "")
        notes.append(f"replica {k} serves but stays out of the routers: {', '.join(marked)} drained "
                     f"(`bootstrap undrain {marked[0]}` puts it back)")


def _routers(sess: Session, inv: Inventory, plan: FP.FleetPlan) -> dict:
    """Start the routers (and keepalived with a floating address), then check a completion through
    each (every model of a pool); the last probe's answer."""
    launches = {r.host: r for r in plan.routers}
    rhosts = list(FN.router_hosts(inv))
    through = start_routers(sess, inv, launches)
    if plan.vip is not None:
        sess.stage("vip", rhosts, lambda h: _create_with(sess, h, launches[h.name].vip_create, FN.vip_name(inv), {
            FRT.VIP_ENTRY_PATH: check_script("vip_entry.sh"),
            FRT.VIP_CONF_PATH: launches[h.name].vip_config.encode()}))
        through = _probe(sess, rhosts[0], FN.router_name(inv), ["ready", FN.router_url(inv), "60"], timeout=120)
        if not through.get("ready"):
            tails = "\n".join(f"{h.name}: {_logs(sess, h, FN.vip_name(inv), 15)}" for h in rhosts)
            raise ServeFailed(f"the floating address {plan.vip} did not answer a completion: "
                              f"{through.get('error')}", tails)
    return through


def stop_fleet(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
               drain: float = 120.0) -> list[str]:
    """Remove the serve containers, the router and the keepers (the node containers stay); every replica
    leaves the routers and finishes its requests first (steps.drain_out, `drain` seconds at most)."""
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _rm(sess, inv.hosts, FN.keeper_name(inv), stage="stop-keeper")
        drain_out(sess, inv, inv.hosts, drain)
        _rm_routers(sess, inv, "stop-router")
        _rm(sess, inv.hosts, *FN.serve_names(inv), stage="stop")
    return [h.name for h in inv.hosts]
