"""The JSON documents of the library face's results (what `--json` prints): one builder per result, no I/O.

Each builder takes the library's own result objects, as the renderers do; the face's result classes
(face/results.py) call them in their to_doc(). Credentials are masked where the document is printed
(cli/render.py), not here.
"""
from __future__ import annotations

from bootstrap.cluster.run import HostTiming
from bootstrap.cluster.runtime import UNDECIDED as RUNTIME_UNDECIDED
from bootstrap.nccl import parse as N


def _host_doc(a, runtime: str | None) -> dict:
    return {"host": a.host, "role": a.spec.role, "action": a.action, "reason": a.reason,
            "runtime": runtime if runtime is not None else RUNTIME_UNDECIDED,
            "spec_hash": a.spec.spec_hash, "argv": list(a.spec.run_argv()), "fabric": list(a.fabric)}


def plan_doc(actions, runtime: str | None = "") -> dict:
    """`plan` and `up --dry-run` of one cluster: the shape of a fleet's (fleet_plan_doc) with one group,
    replica null, and no router; runtime None: not decided yet."""
    return {"kind": "cluster", "models": [], "replicas": [{"replica": None, "url": None,
                                             "hosts": [_host_doc(a, runtime) for a in actions]}],
            "router": None, "routers": [], "keeper": None, "standby": None}


def fleet_plan_doc(replicas, routers, router_url: str, keeper_argv, standby: str | None = None,
                   runtime: str | None = "", models: list | None = None, idle: list | None = None) -> dict:
    """`plan` with replicas: [(url, actions)] per replica, the routers, the keeper, the standby's name;
    models: a pool's model on each replica ({"model", "source"}), else empty; idle: its hosts that serve none."""
    return {
        "kind": "fleet", "models": list(dict.fromkeys(m["model"] for m in models or [])),
        **({"idle": list(idle)} if models else {}),
        "replicas": [{"replica": k, "url": url, **(models[k] if models else {}),
                      "hosts": [_host_doc(a, runtime) for a in acts]}
                     for k, (url, acts) in enumerate(replicas)],
        "router": {"host": routers[0].host, "endpoint": router_url + "/v1", "argv": list(routers[0].run)},
        "routers": [{"host": r.host, "argv": list(r.run), "vip_argv": list(r.vip_create),
                     "vip_config": r.vip_config} for r in routers],
        "keeper": list(keeper_argv), "standby": standby}


def up_doc(inv, res, total: float, started_at: float) -> dict:
    """`up`'s result. times: time.time() seconds; run_start/run_end/started_at/ready_at on this
    machine's clock, ray_seen on the head's (head_clock_offset = head minus this machine)."""
    alive = {n.ip: n for n in (res.ray.nodes if res.ray else ()) if n.alive}
    no_time = HostTiming().as_dict()
    return {
        "changed": res.changed, "seconds": round(total, 3),
        "stages": {k: round(v, 3) for k, v in res.timings.stages.items()},
        "hosts": [{"host": a.host, "ip": inv.host(a.host).ip, "role": a.spec.role,
                   "action": a.action, "reason": a.reason, "ray_alive": inv.host(a.host).ip in alive,
                   "gpus": alive[inv.host(a.host).ip].gpus if inv.host(a.host).ip in alive else 0,
                   "image_from": res.image_from.get(a.host),
                   **(res.host_timings[a.host].as_dict() if a.host in res.host_timings else no_time)}
                  for a in res.actions],
        "started_at": round(started_at, 3),
        "ready_at": None if res.ready_at is None else round(res.ready_at, 3),
        "gcs_open": None if res.gcs_open is None else round(res.gcs_open, 3),
        "head_clock_offset": None if res.head_clock_offset is None else round(res.head_clock_offset, 3),
        "skipped": dict(res.skipped), "warnings": res.warnings,
        "runtime": res.runtime, "runtime_why": res.runtime_why}


def status_doc(st) -> dict:
    """`status` of one cluster: each node, what is served, the Ray dashboard."""
    return {"nodes": [r.as_dict() for r in st.nodes],
            "serving": st.serving.to_dict() if st.serving else None,
            "ray_dashboard": st.dashboard, "runtime": st.runtime,
            "ray_error": st.ray_error or None, "serving_error": st.serving_error or None}


def exposure_doc(inv, found) -> dict:
    """`status --exposure`: each listening socket, and how many are open beyond SSH and the endpoint."""
    return {"listeners": [dict(host=e.host, address=e.address, port=e.port, what=e.what, bind=e.bind,
                               auth=e.auth, reach=e.reach, expected=e.expected, open_beyond=e.open_beyond,
                               fence_allow=list(e.allowed), public=list(e.public))
                          for e in found],
            "fence": inv.cluster.fence, "open_beyond": sum(1 for e in found if e.open_beyond)}


def fleet_status_doc(groups, fs) -> dict:
    """`status` with replicas: each group's nodes, the fleet as the router sees it; a pool's models
    (models_doc), an empty list for a fleet of one model."""
    return {"nodes": [{"replica": k, **r.as_dict()} for k, g in enumerate(groups) for r in g.nodes],
            "fleet": fs.to_dict(), "ray_dashboard": [g.dashboard for g in groups],
            "ray_error": [g.ray_error or None for g in groups], "models": models_doc(fs)}


def models_doc(fs) -> list[dict]:
    """What a pool serves, by model (the served name its replicas' labels carry): its source, its
    replicas, how many are healthy and in the router's rotation, and each LoRA adapter with the number
    of its replicas that serve it now; a pool of one model lists it too. Empty when no replica serves
    under a name of its own (a fleet of one model, which clients name by its path)."""
    by: dict[str, dict] = {}
    for r in fs.replicas:
        # what serves there, else (nothing does: stopped, starting) what the inventory places there
        name, source = (r.spec.served_name, r.spec.model) if r.spec is not None and r.spec.served_name else (
            r.placed or (None, None))
        if not name:
            continue
        m = by.setdefault(name, {"model": name, "source": source, "replicas": [], "healthy": 0, "in_router": 0,
                                 "adapters": {}, "kv_cache_usage": None})
        m["replicas"].append(r.index)
        if r.kv_usage is not None:  # the fullest replica's share of its KV cache
            m["kv_cache_usage"] = max(m["kv_cache_usage"] or 0.0, r.kv_usage)
        m["healthy"] += r.health == "healthy"
        m["in_router"] += bool(r.in_rotation)
        for a in r.adapters or ():
            m["adapters"][a] = m["adapters"].get(a, 0) + 1
    return list(by.values())


def down_doc(groups, fleet=None) -> dict:
    """down's result: per replica group the hosts removed and absent; with replicas the fleet's containers."""
    doc = {"groups": [{"removed": list(g.removed), "absent": list(g.absent)} for g in groups]}
    if fleet is not None:
        doc["fleet_removed"] = {h: list(names) for h, names in fleet.items()}
    return doc


def nccl_doc(res) -> dict:
    """check-nccl's result."""
    return {
        "ok": res.ok, "verdict": res.verdict, "backend": res.backend, "world_size": res.world_size,
        "seconds": round(res.seconds, 2), "timed_out": list(res.timed_out),
        "nodes": [n.__dict__ for n in res.nodes],
        "bandwidth": [b.__dict__ for b in res.bandwidth],
        "bandwidth_note": N.bandwidth_note(res.world_size, res.bandwidth),
        "transport": None if res.transport is None else {
            "network": res.transport.network, "gdrdma": res.transport.gdrdma,
            "nccl_version": res.transport.nccl_version},
        "findings": [f.__dict__ for f in res.findings], "warnings": res.warnings}


def kv_check_doc(results, infiniband: bool) -> dict:
    """check-kv: each prefill x decode pair, the warnings, the verdict."""
    return {"ok": all(r.ok for r in results), "pairs": [r.to_dict() for r in results],
            "warnings": [w for w in (r.warning(infiniband) for r in results) if w]}


def doctor_doc(rep) -> dict:
    return {"ok": rep.ok, "findings": [f.__dict__ for f in rep.findings]}


def served_doc(res) -> dict:
    """serve's result on one cluster."""
    return {
        "endpoint": res.endpoint, "model": res.model, "served": res.served, "backend": res.backend,
        "tp": res.parallelism.tp, "pp": res.parallelism.pp, "dp": res.parallelism.dp,
        "ep": res.parallelism.ep_size, "ready_seconds": round(res.ready_seconds, 1),
        "kv_cache_tokens": getattr(res.kv, "tokens", None), "notes": res.notes,
        "split_reason": res.plan.split.reason if res.plan else None,
        "backend_reason": res.plan.backend_reason if res.plan else None}


def fleet_served_doc(res) -> dict:
    """serve's result with replicas."""
    return {"endpoint": res.endpoint, "served": res.served, **res.plan.to_dict(),
            "ready_seconds": {str(k): v for k, v in res.ready_seconds.items()},
            "seconds": round(res.seconds, 1), "kv_check": [r.to_dict() for r in res.kv],
            **({"changes": [c.to_dict() for c in res.changes]} if res.changes is not None else {})}


def rollout_doc(res) -> dict:
    return {"endpoint": res.endpoint, "model": res.target.model,
            "extra": list(res.target.extra), "image": res.target.image,
            "replaced": res.replaced, "unchanged": res.unchanged,
            "seconds": round(res.seconds, 1),
            "steps": {str(k): {n: round(v, 1) for n, v in d.items()}
                      for k, d in res.steps.items()}}


def bench_doc(res, spread) -> dict:
    return {**res.to_dict(), **({"spread": spread.to_dict()} if spread else {})}


def monitor_down_doc(removed: dict, purge: bool) -> dict:
    return {"hosts": removed, "purged": purge}
