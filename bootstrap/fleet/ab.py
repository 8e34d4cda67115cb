"""`bench --ab`: the same workload through the fleet's routers under each policy in turn (SSH + HTTP).

Each arm restarts every router with the arm's policy (the replicas keep serving; only the routers
restart, as `serve` starts them), sends the arm's warm-up requests, reads the replicas' counters,
sends the measured requests and reads the counters again. The routers get the inventory's own
policy back at the end, whatever happened. The order and the table are serve/abtest.py's.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from bootstrap.errors import FleetError
from bootstrap.fleet import kvevents as KV
from bootstrap.fleet import names as FN
from bootstrap.fleet import routers as FRT
from bootstrap.fleet import status as FS
from bootstrap.fleet.steps import _rm, start_routers
from bootstrap.model import Inventory, kv_events_on
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Reporter, Session
from bootstrap.serve import abtest as AB
from bootstrap.serve import bench as B
from bootstrap.serve.workloads import Req


def check(inv: Inventory, policies: Sequence[str] = ()) -> None:
    """What `bench --ab` needs of the inventory, before any host is contacted."""
    if not FN.is_fleet(inv):
        raise FleetError("bench --ab compares the routers' policies: the inventory has no router (set "
                         "cluster.replicas > 1, serve, then run it)")
    if inv.models:
        raise FleetError("bench --ab: a pool of models routes each model with its own policy (models[].policy); "
                         "A/B the policies on an inventory of one model")
    if any(_policy_of(p) == "kv_aware" for p in policies) and not kv_events_on(inv):
        raise FleetError("bench --ab kv_aware: the replicas must publish their KV cache events; set "
                         "cluster.router.kv_events: true and run serve again (it restarts them with the events on)")


def _policy_of(label: str) -> str:
    """An arm's policy, without its settings (POLICY:NAME=VALUE...: the CLI checked them, AB.arm_router)."""
    return label.split(":", 1)[0]


def _with_policy(inv: Inventory, label: str) -> Inventory:
    """The inventory with an arm's policy and settings (AB.arm_router) in cluster.router."""
    policy, settings = AB.arm_router(label)
    c = inv.cluster
    return replace(inv, cluster=replace(c, router=replace(c.router, policy=policy, **settings)))


def restart_routers(sess: Session, inv: Inventory, policy: str, kv: KV.KvEvents | None = None) -> None:
    """Every router removed and started again with `policy`, each checked with a completion (kv: the
    replicas' KV event sources, for kv_aware)."""
    pinv = _with_policy(inv, policy)
    urls = [FN.replica_url(inv, k) for k in range(inv.cluster.replicas)]
    rhosts = list(FN.router_hosts(inv))
    launches = {h.name: FRT.RouterLaunch(h.name, FRT.router_run_argv(pinv, urls, None, h, kv)) for h in rhosts}
    _rm(sess, rhosts, FN.router_name(inv), stage=f"router-{policy}")
    start_routers(sess, pinv, launches)


def serving_kv(inv: Inventory, state: FS.FleetState) -> KV.KvEvents:
    """What the routers subscribe with, from what the replicas serve (their containers' serve label)."""
    spec = next((r.spec for r in state.replicas if r.spec is not None), None)
    if spec is None:
        raise FleetError("bench --ab kv_aware: no replica is serving (serve first)")
    if spec.dp and spec.dp > 1:
        raise FleetError(f"bench --ab kv_aware: the replicas run {spec.dp} data parallel engines each, which publish "
                         "no KV events; A/B the other policies, or serve without --dp")
    return KV.of(inv, spec.model, spec.served_name, spec.extra)


def _delta(before: FS.FleetState, after: FS.FleetState, key: str) -> float | None:
    """A counter's increase over the arm, summed over the replicas (a restarted replica counts from 0);
    None: a replica does not export it."""
    total = 0.0
    for b, a in zip(before.replicas, after.replicas):
        la, lb = a.latency or {}, b.latency or {}
        if key not in la:
            return None
        d = la[key] - lb.get(key, 0.0)
        total += d if d >= 0 else la[key]
    return total


def _arm(sess: Session, policy: str, repeat: int, cfg: B.BenchConfig, reqs: Sequence[Req], warm: int) -> AB.Arm:
    if warm:
        B.run_bench(replace(cfg, requests=warm), requests=reqs[:warm])
    before = FS.fleet_state(sess)
    res = B.run_bench(cfg, requests=reqs[warm:])
    after = FS.fleet_state(sess)
    d = {k: _delta(before, after, k) for k in FS.LATENCY_KEYS}
    engine = {}
    for name in ("ttft", "itl"):
        n, total = d[f"{name}_count"], d[f"{name}_sum"]
        engine[name] = total / n * 1000 if n and total is not None else None
    looked, hits = _kv_lookups(before, after)
    return AB.Arm(policy, repeat, res, d["prefix_queries"], d["prefix_hits"], FS.spread(before, after).per_replica,
                  engine["ttft"], engine["itl"], looked, hits)


def _kv_lookups(before: FS.FleetState, after: FS.FleetState) -> tuple[float | None, float | None]:
    """kv_aware's lookups in the routers' KV index over the arm, and its hits (summed over routers);
    (None, None) where no router made one."""
    seen = {r.host: r.kv_lookups or {} for r in before.routers}
    looked = hits = 0.0
    for r in after.routers:
        now, then = r.kv_lookups or {}, seen.get(r.host, {})
        looked += sum(now.values()) - sum(then.values())
        hits += now.get("hit", 0.0) - then.get("hit", 0.0)
    return (looked, hits) if looked > 0 else (None, None)


def run_ab(inv: Inventory, policies: Sequence[str], workload: Callable[[int], list[Req]], cfg: B.BenchConfig, *,
           repeats: int = 2, warmup: int = 0, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
           on_arm: Callable[[AB.Arm], None] | None = None) -> list[AB.Arm]:
    """Every arm of AB.order(policies, repeats); workload(seed) gives an arm's requests (its first
    `warmup` sent before the measured ones, not counted). The routers are given the inventory's
    policy back at the end."""
    check(inv, policies)
    arms: list[AB.Arm] = []
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        aware = any(_policy_of(p) == "kv_aware" for p in (*policies, inv.cluster.router.policy))
        kv = serving_kv(inv, FS.fleet_state(sess)) if aware else None
        try:
            for i, (r, policy) in enumerate(AB.order(policies, repeats)):
                restart_routers(sess, inv, policy, kv)
                arm = _arm(sess, policy, r, cfg, workload(i), warmup)
                arms.append(arm)
                if on_arm is not None:
                    on_arm(arm)
        finally:
            restart_routers(sess, inv, inv.cluster.router.policy, kv)
    return arms
