"""bootstrap adapter: a pool model's LoRA adapters, loaded and unloaded at runtime on every replica of
the model and in every router, over SSH (no replica restarts).

vLLM loads an adapter through its API when its container allows it (VLLM_ALLOW_RUNTIME_LORA_UPDATING,
set by the plan on the replicas of a model with `adapters:`); the pool's routers route the adapter's
name to the model's replicas (vllm-router's multi-model mode indexes a replica under every name it is
added with; fleet_probe.py's `route`). An adapter loaded here lasts until its replica restarts: put
it in the model's `adapters:` to keep it (the next `serve` loads it with the model).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from bootstrap.errors import FleetError, ServeFailed
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.fleet.steps import _probe, _route, rewrite_workers
from bootstrap.inventory import modelfields as MF
from bootstrap.model import Inventory, ServedModel
from bootstrap.remote.fanout import DEFAULT_PARALLEL, fan_out
from bootstrap.remote.session import Reporter, Session


@dataclass
class AdapterResult:
    action: str
    model: str
    name: str | None
    #: replica index -> the adapters it serves after the action ({"name", "source"} each)
    replicas: dict[int, list[dict]] = field(default_factory=dict)
    #: router host -> what it answered (route), for add and remove
    routers: dict[str, dict] = field(default_factory=dict)


def check(inv: Inventory, action: str, model: str, name: str | None, source: str | None) -> ServedModel:
    """What `adapter` refuses before any host is contacted."""
    if not inv.models:  # one model: its adapters are vLLM's own flags, given at start
        raise FleetError(f"{inv.path} has no models: section: adapters at runtime are a pool model's; one model "
                         "takes its adapters at start: bootstrap serve MODEL -- --enable-lora --lora-modules "
                         "NAME=SOURCE (docs/models.md, LoRA adapters)")
    m, _ = FP.pool_model(inv, model)
    if action == "list":
        return m
    if not m.lora:
        raise FleetError(f"{m.where} ({m.name}) has no adapters: key, so LoRA is off on its replicas: add "
                         "`adapters: []` (or its adapters) to the model and run bootstrap serve")
    why = MF.served_name_problem(name or "")
    if why:
        raise FleetError(f"adapter name: {why}")
    taken = {n: f"model {x.name}" for x in inv.models for n in (x.name,)}
    taken.update({a: f"an adapter of {x.name} in {inv.path}" for x in inv.models for a, _ in x.adapters})
    if action == "add":
        if name in taken:
            raise FleetError(f"{name!r} is already the name of {taken[name]}: give the adapter a name of its own")
        why = MF.adapter_source_problem(source or "")
        if why:
            raise FleetError(f"adapter source: {why}")
    elif name in taken and name not in dict(m.adapters):  # a model, or another model's adapter: not m's to remove
        raise FleetError(f"{name!r} is the name of {taken[name]}, not an adapter of {m.name}: nothing to remove "
                         f"(bootstrap adapter list -i {inv.path} {m.name} lists its adapters)")
    elif name in dict(m.adapters):
        raise FleetError(f"{name!r} is in {m.where}.adapters: remove it there and run bootstrap serve (an adapter "
                         "of the inventory comes back with every replica restart)")
    return m


def adapter(inv: Inventory, action: str, model: str, name: str | None = None, source: str | None = None, *,
            parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None) -> AdapterResult:
    """`adapter add|remove|list`: add loads NAME from SOURCE on every replica of MODEL, then routes it
    in every router; remove takes it out of the routers first, then unloads it; list reads each replica."""
    m = check(inv, action, model, name, source)
    _, groups = FP.pool_model(inv, model)
    res = AdapterResult(action, model, name)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        heads = [inv.replicas[k][0] for k in groups]

        def on_replica(verb: str, *args: str) -> dict:
            out = fan_out(groups, lambda k: _probe(sess, inv.replicas[k][0], FN.serve_name(inv),
                                                   [verb, FN.replica_url(inv, k), *args], timeout=180),
                          key=lambda k: k, parallel=len(groups))
            docs = {**out.succeeded, **{k: {"ok": False, "error": str(e)} for k, e in out.failed.items()}}
            bad = [k for k, d in docs.items() if not d.get("ok")]
            if bad:
                d = docs[bad[0]]
                raise ServeFailed(f"replica {bad[0]} ({heads[groups.index(bad[0])].name}) of {model}: {verb} "
                                  f"{' '.join(args)}: {d.get('answer') or d.get('error')}")
            return docs

        if action == "add":
            on_replica("lora-load", name or "", source or "")
        if action in ("add", "remove"):
            served = on_replica("adapters")
            res.routers = _reroute(sess, inv, m, groups, served, drop=name if action == "remove" else None)
            _remember(sess, inv, m, groups, served, drop=name if action == "remove" else None)
        if action == "remove":
            on_replica("lora-unload", name or "")
        res.replicas = {k: d.get("adapters", []) for k, d in on_replica("adapters").items()}
    return res


def _names(m: ServedModel, served: dict, drop: str | None) -> list[str]:
    """What a replica is routed under: the model's name and every adapter it serves but `drop`."""
    return [m.name, *(a["name"] for a in served.get("adapters", []) if a["name"] != drop)]


def _remember(sess: Session, inv: Inventory, m: ServedModel, groups: list[int], served: dict[int, dict],
              drop: str | None) -> None:
    """Each router's workers file (routers.WORKERS_PATH) says what the routers were just told, so that
    a router restarted later routes the adapter too (the model's other entries, and every other
    model's, as the file held them)."""
    urls = {k: FN.replica_url(inv, k) for k in groups}
    rewrite_workers(sess, inv, {urls[k]: FRT.worker_entries(inv, m, urls[k], _names(m, served[k], drop))
                                for k in groups})


def _reroute(sess: Session, inv: Inventory, m: ServedModel, groups: list[int], served: dict[int, dict],
             drop: str | None) -> dict[str, dict]:
    """Every router routes each replica of the model under its name and the adapters it serves (less
    `drop`), one replica at a time (the model's other replicas keep its requests meanwhile)."""
    out: dict[str, dict] = {}
    for k in groups:
        doc = _route(sess, inv, k, _names(m, served[k], drop))
        bad = next((h for h, d in doc.items() if h != "ok" and not d.get("ok")), None)
        if bad is not None:
            raise ServeFailed(f"the router on {bad} did not take replica {k} of {m.name}: {doc[bad].get('error')}")
        out.update({h: d for h, d in doc.items() if h != "ok"})
    return out
