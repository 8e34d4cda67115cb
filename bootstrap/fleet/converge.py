"""`serve -i INV` of a pool that already serves: make it serve what models: says, touching only what changed.

What each host's serve container runs is compared with the plan by its launch digest (fleet/plan.py's
launch_label: the replica's hosts, the member's rank and `vllm serve` argv, the spec): a replica whose
members would start the same is kept as it is; one that runs something else (another model, other
flags or adapters, another split, another image) is replaced as a rollout replaces one (out of the
routers, drained, stopped, started, gated, back); one with nothing running is started; a worker the
routers hold that no replica of the plan has (a model removed, a host gone) is taken out of every
router and drained. Requests to a model that is not changed are never sent anywhere else.

`changes` is pure; `converge` runs them over SSH (the caller has the plan and asks the user first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence
from urllib.parse import urlsplit

from bootstrap.cluster.guard import run as GD
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.errors import ServeFailed
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.fleet.steps import (
    NotOut,
    _in_router,
    _inspect,
    _probe,
    _rm,
    _start_standbys,
    rewrite_workers,
    start_gated,
    take_out,
)
from bootstrap.model import Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote.session import Reporter, Session

KEEP, START, REPLACE, REMOVE, ROUTE, STOP, POLICY = "keep", "start", "replace", "remove", "route", "stop", "policy"


@dataclass(frozen=True)
class Running:
    """One host's serve container as Docker records it (its labels), running or not."""

    launch: str
    spec: FP.Spec | None
    running: bool


@dataclass(frozen=True)
class Change:
    action: str
    #: the model (a removed worker: the names the routers held it under, or its URL's old model)
    model: str
    #: the replica's index in the plan; None: a worker no replica of the plan has
    index: int | None
    hosts: tuple[str, ...]
    url: str
    why: str

    def describe(self) -> str:
        where = f"replica {self.index} " if self.index is not None else ""
        on = f" on {', '.join(self.hosts)}" if self.hosts else ""
        return f"{self.action:<8} {self.model}: {where}({self.url}){on}: {self.why}"

    def to_dict(self) -> dict:
        return {"action": self.action, "model": self.model, "replica": self.index, "hosts": list(self.hosts),
                "url": self.url, "why": self.why}


def _why_replace(rp: FP.ReplicaPlan, spec: FP.Spec, have: Sequence[Running | None]) -> str:
    """What differs between what runs on a replica's hosts and what the plan starts there."""
    olds = {r.spec for r in have if r is not None}
    old = next(iter(olds)) if len(olds) == 1 else None
    if old is None:
        return "its hosts run parts of other replicas"
    if old.served_name != spec.served_name:
        return f"its hosts serve {old.served_name or old.model} now"
    if old.model != spec.model:
        return f"source {old.model} -> {spec.model}"
    if old.image != spec.image:
        return f"image {old.image} -> {spec.image}"
    if old.extra != spec.extra:
        return f"vLLM flags {' '.join(old.extra) or '(none)'} -> {' '.join(spec.extra) or '(none)'}"
    if any(r is None for r in have):
        return f"its hosts change ({len([r for r in have if r is not None])} of {len(have)} run it now)"
    return "its hosts or its split change"


def _kept(inv: Inventory, rp: FP.ReplicaPlan, name: str, was: str | None) -> Change:
    """A replica that runs as planned and is routed: KEEP, or POLICY where its model's policy changed
    alone. vllm-router resets a model's policy only when its last worker leaves, and removes a URL under
    its last name only (policies/registry.rs; a URL routed under a LoRA adapter's name too keeps the
    model's policy: measured), so a model with LoRA on keeps its policy until the routers restart."""
    m = inv.model_of(rp.index)
    want = FRT.model_policy(inv, m) if m is not None else None
    if was is None or want is None or was == want:
        return Change(KEEP, name, rp.index, rp.hosts, rp.url, "unchanged")
    if m is not None and m.lora:
        return Change(KEEP, name, rp.index, rp.hosts, rp.url, f"unchanged; router policy {was} -> {want} takes "
                      "effect when the routers restart (a model with LoRA on keeps its policy in vllm-router)")
    return Change(POLICY, name, rp.index, rp.hosts, rp.url, f"router policy {was} -> {want}, in place")


def changes(inv: Inventory, plan: FP.FleetPlan, running: Mapping[str, Running | None],
            routed: Mapping[str, str], policies: Mapping[str, str] | None = None) -> list[Change]:
    """What `serve` does to make the pool serve the plan. running: each host's serve container (None:
    none); routed: each URL the routers hold -> the model they hold it under (as far as they say);
    policies: the policy each was last added with (a model's policy changed alone: POLICY)."""
    out: list[Change] = []
    for rp in plan.replicas:
        spec = plan.spec_of(rp)
        name = spec.served_name or spec.model
        have = [running.get(m.host) for m in rp.members]
        same = all(r is not None and r.running and r.launch == m.launch for r, m in zip(have, rp.members))
        if same and rp.url in routed:
            out.append(_kept(inv, rp, name, (policies or {}).get(rp.url)))
        elif same:
            out.append(Change(ROUTE, name, rp.index, rp.hosts, rp.url, "serving, not in the routers"))
        elif not any(r is not None and r.running for r in have):
            out.append(Change(START, name, rp.index, rp.hosts, rp.url, "nothing runs on its hosts"
                              if all(r is None for r in have) else "its containers are stopped"))
        else:
            out.append(Change(REPLACE, name, rp.index, rp.hosts, rp.url, _why_replace(rp, spec, have)))
    planned = {rp.url for rp in plan.replicas}
    for url, model in sorted(routed.items()):
        if url not in planned:
            out.append(Change(REMOVE, model, None, (), url, "no replica of models: is there now"))
    for h in inv.idle:
        r = running.get(h.name)
        if r is not None:
            name = (r.spec.served_name or r.spec.model) if r.spec else "?"
            out.append(Change(STOP, name, None, (h.name,), FN.http_url(h.ip, inv.cluster.ports.vllm),
                              "the host is idle now (no model's replica takes it)"))
    return out


def router_ready(inv: Inventory, plan: FP.FleetPlan, states: Mapping[str, object]) -> str | None:
    """None when every router runs a pool's entry with the planned options (converge can change its
    workers in place); else why it cannot, and `serve` starts the pool over."""
    launches = {r.host: r for r in plan.routers}
    for h in FN.router_hosts(inv):
        st = states.get(h.name)
        if st is None or not getattr(st, "running", False):
            return f"the router on {h.name} is not running"
        args = tuple(getattr(st, "args", ()))
        if "@" + FRT.WORKERS_PATH not in args:
            return f"the router on {h.name} was not started by this version's pool entry"
        if tuple(launches[h.name].run[-len(args):]) != args:
            return f"the router's options on {h.name} changed"
        if _secrets_of(inv, st) != ",".join(SS.router_names(inv)):
            return f"the secrets the router on {h.name} holds changed (a model's own API key: models[].api_key)"
    return None


def _secrets_of(inv: Inventory, st: object) -> str:
    """The secrets a pool's router was started with: its label; a router of an earlier version (no
    label) held the pool's API key, if any."""
    labels = getattr(st, "labels", None) or {}
    if FN.LABEL_SECRETS in labels:
        return labels[FN.LABEL_SECRETS]
    return SS.API_KEY_ENV if SS.API_KEY_ENV in SS.values(inv) else ""


def read(sess: Session, inv: Inventory) -> tuple[dict[str, Running | None], dict[str, object], dict[str, str],
                                                dict[str, str]]:
    """Each host's serve container, each router host's router container, the URLs the first router
    that answers holds (url -> model) and the policy each was last added with (url -> policy)."""
    sname = FN.serve_name(inv)

    def one(h) -> Running | None:
        st = _inspect(sess, h, sname)
        if st is None:
            return None
        return Running(st.labels.get(FN.LABEL_LAUNCH, ""), FP.Spec.from_label(st.labels.get(FN.LABEL_SERVE)),
                       st.running)
    running = sess.stage("inspect-serve", inv.hosts, one).succeeded
    rhosts = list(FN.router_hosts(inv))
    routers = sess.stage("inspect-router", rhosts, lambda h: _inspect(sess, h, FN.router_name(inv))).succeeded
    routed: dict[str, str] = {}
    policies: dict[str, str] = {}
    for h in rhosts:
        if routers.get(h.name) is None or not routers[h.name].running:
            continue
        doc = _probe(sess, h, FN.router_name(inv), ["pool-workers", FN.router_url(inv, h)], timeout=60)
        if "workers" in doc:
            routed = {u.rstrip("/"): m for u, m in doc["workers"].items()}
            policies = {u.rstrip("/"): p for u, p in (doc.get("policies") or {}).items() if p}
            break
    return running, routers, routed, policies


def converge(sess: Session, inv: Inventory, plan: FP.FleetPlan, todo: Sequence[Change], *, wait: float,
             drain: float, step: Callable[[Change, str], None]) -> dict:
    """Run the changes: the removed workers out of the routers and drained, idle hosts stopped, the
    changed replicas replaced one at a time, the new ones started together and gated, each into the
    routers; then the routers' workers file rewritten (a router that restarts adds what the pool
    serves now) and a completion of every model through each router. Returns the last router's answer."""
    from bootstrap.fleet import rollout as FRO

    by_index = {rp.index: rp for rp in plan.replicas}
    _let_go(sess, inv, [c for c in todo if c.action in (REMOVE, STOP)], drain, step)
    GD.put_secrets(sess, inv.hosts, prune=False)
    for c in (c for c in todo if c.action == REPLACE):
        step(c, "replacing")
        FRO.replace_one(sess, inv, by_index[c.index], drain, wait, lambda k, what, c=c: step(c, what))
    starts = [by_index[c.index] for c in todo if c.action == START]
    if starts:
        start_gated(sess, inv, starts, wait, own_stages=True, after="; the other replicas serve as before")
    for c in todo:
        if c.action in (START, ROUTE):
            back = _in_router(sess, inv, c.index, True)
            if not back.get("ok"):
                raise ServeFailed(f"the routers did not take replica {c.index} ({c.model}) in: {back}", "")
            step(c, "in the routers")
    _repolicy(sess, inv, plan, [c for c in todo if c.action == POLICY], step)
    _start_standbys(sess, inv, starts)
    return _routers_now(sess, inv, plan)


def _repolicy(sess: Session, inv: Inventory, plan: FP.FleetPlan, todo: Sequence[Change],
              step: Callable[[Change, str], None]) -> None:
    """Each model whose policy changed alone gets it in every router, in place: all its URLs out and in
    again under its name with the new policy (fleet_probe's `repolicy`). vllm-router 0.1.17 sets a model's
    policy at its first worker only and sends a request for a model with no worker to any worker: the
    last URL's out and in go in one write, so that window is the router's own time between the two
    (perf/router_repolicy.py: 1 request in 2,700 refused 404 against 6 sent one by one); the step says so."""
    for name in dict.fromkeys(c.model for c in todo):
        m = next(x for x in inv.models if x.name == name)
        urls = [rp.url for rp in plan.replicas if inv.model_of(rp.index) is m]
        policy = FRT.model_policy(inv, m)
        for h in FN.router_hosts(inv):
            doc = _probe(sess, h, FN.router_name(inv), ["repolicy", FN.router_url(inv, h), name, policy, *urls],
                         timeout=120)
            if not doc.get("ok"):
                raise ServeFailed(f"the router on {h.name} did not take {name}'s policy {policy}: "
                                  f"{doc.get('error')}", "")
            for c in (c for c in todo if c.model == name):
                step(c, f"policy {policy} on {h.name} ({doc.get('gap_ms')} ms with no worker of {name} in the router: "
                        "a request of it in that moment may have been refused 404, docs/models.md)")


def _let_go(sess: Session, inv: Inventory, todo: Sequence[Change], drain: float,
            step: Callable[[Change, str], None]) -> None:
    """The removed workers out of every router and drained; then the idle hosts' serve containers removed."""
    for c in (c for c in todo if c.action == REMOVE):
        step(c, "out of the routers")
        try:
            d = take_out(sess, inv, c.url, drain)
        except NotOut as e:
            raise ServeFailed(f"the routers did not let go of {c.url} ({c.model}): {e.answer}", "") from None
        gone = not any(h.ip == urlsplit(c.url).hostname for h in inv.hosts)
        step(c, f"drained ({d.get('why', '?')})" + ("; its containers are on a host this inventory does not "
                                                    "hold: `bootstrap down` with one that holds it stops them"
                                                    if gone else ""))
    stops = [c for c in todo if c.action == STOP]
    for c in stops:
        step(c, "stopping")
    if stops:
        _rm(sess, [inv.host(c.hosts[0]) for c in stops], *FN.serve_names(inv), stage="stop-idle")


def _routers_now(sess: Session, inv: Inventory, plan: FP.FleetPlan) -> dict:
    """Each router's workers file rewritten to the plan, then a completion of every model through each."""
    data = FRT.workers_file(inv, [rp.url for rp in plan.replicas])
    rhosts = list(FN.router_hosts(inv))
    sess.stage("router-workers", rhosts, lambda h: DK.copy_file_in(sess.ssh[h.name], FN.router_name(inv),
                                                                   FRT.WORKERS_PATH, data))
    through: dict = {}
    for h in rhosts:
        through = _probe(sess, h, FN.router_name(inv), ["ready", FN.router_url(inv, h), "120"], timeout=240)
        if not through.get("ready"):
            raise ServeFailed(f"the router on {h.name} did not answer a completion: {through.get('error')}", "")
    return through


def stop_model(inv: Inventory, name: str, *, parallel: int, reporter: Reporter | None = None,
               drain: float = 120.0) -> list[int]:
    """`serve --stop --model NAME`: each replica of one model of the pool out of every router (asked of
    the routers themselves: a dead replica is taken out too), its requests finished (`drain` s at most),
    its serve containers removed and the routers' workers file without it; the other models serve as
    before. `serve` with no MODEL starts it again. Its replica indexes; FleetError for a name the pool
    does not serve."""
    _, groups = FP.pool_model(inv, name)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        out: list[int] = []
        for k in groups:
            url = FN.replica_url(inv, k)
            try:
                take_out(sess, inv, url, drain)
            except NotOut as e:
                taken = f" (out of the routers already: replica {', '.join(map(str, out))})" if out else ""
                raise ServeFailed(f"the routers did not let go of replica {k} of {name} ({url}): {e.answer}; "
                                  f"nothing was stopped{taken}: run it again, or serve to put it back", "") from None
            out.append(k)
        _rm(sess, [h for k in groups for h in inv.replicas[k]], *FN.serve_names(inv), stage="stop")
        rewrite_workers(sess, inv, {FN.replica_url(inv, k): [] for k in groups})
    return groups
