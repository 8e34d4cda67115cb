"""What the fleet serves now, read over SSH: each replica's containers and health, the routers' views, the spread.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet.steps import _inspect, _probe, is_drained
from bootstrap.model import Host, Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Reporter, Session

#: serve's processes inside the node containers (a single-replica serve) hold the vLLM port.
from bootstrap.serve.state import engine_counts


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
    #: the LoRA adapters its vLLM serves now (its /v1/models; None: not read, or not answering)
    adapters: list[str] | None = None
    #: its hosts that `bootstrap drain` marked: it stays out of the routers until none is
    drained: list[str] = field(default_factory=list)
    #: the share of its KV cache in use now, 0..1 (vllm:kv_cache_usage_perc, its fullest engine; None: not read)
    kv_usage: float | None = None
    #: in a pool, the model the inventory places here (name, source): status names it while nothing serves
    placed: tuple[str, str] | None = None

    @property
    def router_available(self) -> bool | None:
        """Would the router send it a request now (healthy and circuit closed)? None: not known."""
        if self.router_healthy is None:
            return None
        return self.router_healthy and self.router_circuit_closed is not False

    def to_dict(self) -> dict:
        return {"replica": self.index, "hosts": self.hosts, "url": self.url, "containers": self.containers,
                "restarts": self.restarts, "model": self.spec.model if self.spec else None,
                # what clients send as `model`: its served name, else vLLM's default, the model as loaded
                "served_name": (self.spec.served_name or self.spec.model) if self.spec else None,
                "extra": list(self.spec.extra) if self.spec else None, "health": self.health,
                "in_rotation": self.in_rotation, "running": self.running, "waiting": self.waiting,
                "succeeded": self.succeeded, "router_healthy": self.router_healthy,
                "router_circuit_closed": self.router_circuit_closed, "role": self.role,
                "kv_transfers": self.kv_transfers, "kv_failed": self.kv_failed, "latency": self.latency,
                "dp": self.spec.dp if self.spec else None, "engines": self.engines, "standbys": self.standbys,
                "adapters": self.adapters, "drained": self.drained, "kv_usage": self.kv_usage,
                "means": self.means()}

    def means(self) -> dict[str, float | None]:
        """What the engine measured since it started: the mean time to first token, inter-token latency
        and queue wait (ms), and the prefix cache's hit rate (% of the tokens queried); None: not exported
        or nothing measured yet. Between two samples: spread() and `top`."""
        got = {f"{n}_ms": _mean_ms(None, self.latency, n) for n in ("ttft", "itl", "queue")}
        lat = self.latency or {}
        q, h = lat.get("prefix_queries"), lat.get("prefix_hits")
        got["prefix_hit_pct"] = 100 * h / q if q and h is not None else None
        return got


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
    #: kv_aware's lookups in the router's KV index since it started, by result ("hit": a replica held a
    #: prefix of the prompt; "miss"); None: not read
    kv_lookups: dict[str, float] | None = None

    def to_dict(self) -> dict:
        return {"host": self.host, "state": self.state, "workers": self.workers, "vip_state": self.vip_state,
                "holds_vip": self.holds_vip, "kv_lookups": self.kv_lookups}


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


def fleet_state(sess: Session) -> FleetState:
    inv = sess.inv
    sname = FN.serve_name(inv)
    twin = FN.standby_name(inv) if inv.cluster.standby else ""
    looked = sess.stage("inspect-serve", inv.hosts, lambda h: (_inspect(sess, h, sname), DK.supervised_restarts(
                            sess.ssh[h.name], sname, FN.STARTS_PATH, twin), is_drained(sess, h)), strict=False)
    inspected, not_inspected = looked.succeeded, looked.failed
    urls = [FN.replica_url(inv, k) for k in range(inv.cluster.replicas)]
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
        unknown, drained = [], []
        for h in group:
            if h.name in not_inspected:  # unreachable, or its Docker does not answer: not "absent"
                containers[h.name] = "unknown"
                unknown.append(f"{h.name}: {not_inspected[h.name]}")
                continue
            got = inspected.get(h.name)
            st, (docker_restarts, starts, standby), marked = (None, (0, None, None), False) if got is None else got
            if marked:
                drained.append(h.name)
            containers[h.name] = st.status if st else "absent"
            # the container's restarts by Docker, and its supervisor's starts of vLLM after the first
            restarts += docker_restarts + max(0, (starts or 1) - 1)
            if standby is not None:
                standbys[h.name] = standby
            if st and h is group[0]:
                spec = FP.Spec.from_label(st.labels.get(FN.LABEL_SERVE))
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
                                     FN.role(inv, k), row.get("kv_transfers"), row.get("kv_failed"),
                                     {n: float(row[n]) for n in LATENCY_KEYS if isinstance(row.get(n), (int, float))},
                                     engine_counts(row.get("engines")), standbys or None, row.get("adapters"),
                                     drained, _share(row.get("kv_usage")),
                                     (inv.model_of(k).name, inv.model_of(k).source) if inv.models else None))
    shown = first or routers[0]
    holder = next((r.host for r in routers if r.holds_vip), None)
    vip = inv.cluster.router.vip
    return FleetState(FN.router_url(inv) + "/v1", shown.host, shown.state, workers, replicas, routers,
                      vip.address if vip else None, holder)


def _share(value: object) -> float | None:
    """A 0..1 gauge as the probe read it (None: absent or not a number)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _router_views(sess: Session, inv: Inventory, urls: Sequence[str]) -> tuple[list[RouterView], dict[str, dict]]:
    """Each router host's router (its state, its workers) and keepalived (its state, whether the
    host holds the floating address), and each answering router's whole status probe by host."""
    vip = inv.cluster.router.vip

    def look(h: Host) -> tuple[RouterView, dict | None]:
        router = _inspect(sess, h, FN.router_name(inv))
        kad = _inspect(sess, h, FN.vip_name(inv)) if vip is not None else None
        rv = RouterView(h.name, router.status if router else "absent",
                        vip_state=(kad.status if kad else "absent") if vip is not None else None)
        if router is None or not router.running:
            return rv, None
        metrics = FN.http_url(h.ip, inv.cluster.router.metrics_port) + "/metrics"
        doc = _probe(sess, h, FN.router_name(inv), ["status", FN.router_url(inv, h), metrics, *urls], timeout=60)
        rdoc = doc.get("router")
        rv.workers = rdoc.get("workers") if isinstance(rdoc, dict) and "workers" in rdoc else None
        rv.kv_lookups = rdoc.get("kv_lookups") if isinstance(rdoc, dict) else None
        if vip is not None:
            rv.holds_vip = bool(_probe(sess, h, FN.router_name(inv), ["holds", vip.address], timeout=30).get("holds"))
        return rv, doc

    hosts = FN.router_hosts(inv)
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
LATENCY_KEYS = ("ttft_sum", "ttft_count", "itl_sum", "itl_count", "queue_sum", "queue_count", "prefix_queries",
                "prefix_hits")


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
