"""`bootstrap monitor up|down|status`: Prometheus and the exporters over SSH.

The decisions (names, argv, the scrape configuration) are in bootstrap.monitor.plan; this module
applies them. Prometheus itself is asked through an SSH channel from its host (SSHHost.http_get),
so it answers here even when this machine cannot reach the data-plane IP.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from bootstrap.containers import ContainerState
from bootstrap.errors import CommandFailed, HostUnreachable, MonitorUnreachable, PreflightFailed
from bootstrap.model import Host, Inventory
from bootstrap.monitor import plan as MP
from bootstrap.remote import node as N
from bootstrap.remote.session import Session

LABEL_SPEC = "bootstrap.monitor.run.spec"
#: targets that only answer while a model is served
SERVING_JOBS = ("vllm", "vllm-router")


@dataclass(frozen=True)
class TargetState:
    job: str
    host: str
    url: str
    health: str  # up, down, unknown
    error: str = ""
    replica: str | None = None

    def to_dict(self) -> dict:
        return {"job": self.job, "host": self.host, "replica": self.replica, "url": self.url,
                "health": self.health, "error": self.error}


@dataclass
class MonitorResult:
    url: str
    host: str
    targets: list[TargetState]
    #: what `up` did per container: started, replaced, kept, reloaded
    actions: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    #: seconds from the start of `up` until every target was up (None: not all up in time)
    all_up_after: float | None = None
    #: services a public address would reach (bootstrap.exposure.monitor_warnings)
    warnings: list[str] = field(default_factory=list)

    @property
    def down(self) -> list[TargetState]:
        return [t for t in self.targets if t.health != "up"]

    @property
    def down_infrastructure(self) -> list[TargetState]:
        """Down targets other than the serving ones (vLLM and the router answer once `serve` ran)."""
        return [t for t in self.down if t.job not in SERVING_JOBS]

    def to_dict(self) -> dict:
        return {"prometheus": self.url, "host": self.host, "targets": [t.to_dict() for t in self.targets],
                "actions": self.actions, "seconds": round(self.seconds, 1),
                "all_up_after": None if self.all_up_after is None else round(self.all_up_after, 1),
                "warnings": self.warnings}


def parse_targets(body: bytes) -> list[TargetState]:
    """Prometheus' /api/v1/targets -> the active targets (pure)."""
    doc = json.loads(body)
    out = []
    for t in doc.get("data", {}).get("activeTargets", []):
        labels = t.get("labels", {})
        out.append(TargetState(labels.get("job", t.get("scrapePool", "?")), labels.get("host", "?"),
                               t.get("scrapeUrl", ""), t.get("health", "unknown"), t.get("lastError", ""),
                               labels.get("replica")))
    return sorted(out, key=lambda x: (x.job, x.host, x.url))


def _spec(argv: tuple[str, ...]) -> str:
    return hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]


def _with_spec(argv: tuple[str, ...], spec: str) -> tuple[str, ...]:
    i = argv.index("--name")
    return (*argv[:i], "--label", f"{LABEL_SPEC}={spec}", *argv[i:])


def _ensure(sess: Session, host: Host, name: str, argv: tuple[str, ...], config: str | None) -> str:
    """Start `name` from argv unless it already runs that very argv; return what was done. A
    Prometheus whose argv is unchanged gets the new configuration and a reload (SIGHUP)."""
    node = N.of(sess, host, name)

    def copy_config() -> None:
        node.copy_in(MP.CONFIG_PATH, config.encode())

    spec = _spec(argv)
    cur = node.inspect()
    if cur is not None and cur.labels.get(LABEL_SPEC) == spec:
        if config is None:
            if cur.running:
                return "kept"
            node.start()
            return "started"
        copy_config()
        if cur.running:
            node.signal("HUP")
            return "reloaded"
        node.start()
        return "started"
    node.rm()
    node.run(_with_spec(argv, spec), timeout=300)
    if config is not None:  # created, not started: the configuration goes in first
        copy_config()
        node.start()
    return "replaced" if cur is not None else "started"


def _get(sess: Session, inv: Inventory, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    h = MP.monitor_host(inv)
    return N.of(sess, h).http_get(h.ip, inv.cluster.monitor.port, path, timeout=timeout)


def _targets(sess: Session, inv: Inventory) -> list[TargetState]:
    path = "/api/v1/targets?state=active"
    try:
        code, body = _get(sess, inv, path)
    except OSError as exc:  # refused or no answer: Prometheus' container runs, Prometheus does not answer
        mh = MP.monitor_host(inv)
        raise CommandFailed(mh.name, f"GET {MP.prometheus_url(inv)}{path}", 1, str(exc),
                            f"see `docker logs {MP.prometheus_name(inv)}` on {mh.name}") from None
    if code != 200:
        raise CommandFailed(MP.monitor_host(inv).name, "GET /api/v1/targets", code, body.decode(errors="replace")[:300])
    return parse_targets(body)


def query(sess: Session, expr: str) -> list[dict]:
    """An instant PromQL query on the cluster's Prometheus: its result vector."""
    import urllib.parse

    inv = sess.inv
    mh = MP.monitor_host(inv)
    try:
        code, body = _get(sess, inv, "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    except OSError as exc:  # its container runs, Prometheus refuses or does not answer
        raise CommandFailed(mh.name, f"query {MP.prometheus_url(inv)}", 1, str(exc),
                            f"see `docker logs {MP.prometheus_name(inv)}` on {mh.name}") from None
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    result = doc.get("data", {}).get("result") if isinstance(doc, dict) and isinstance(doc.get("data"), dict) else None
    if code != 200 or not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(result, list):
        why = doc.get("error") if isinstance(doc, dict) and doc.get("error") else body[:300].decode(errors="replace")
        raise CommandFailed(mh.name, f"query {expr}", code, str(why) or "not Prometheus' answer")
    return result


def monitor_up(sess: Session, *, wait: float = 120.0) -> MonitorResult:
    """Exporters on every host, then Prometheus with the generated configuration; wait until it is
    ready and (up to `wait` s) every target is up."""
    from bootstrap import exposure
    from bootstrap.cluster import facts as F
    from bootstrap.cluster import probe

    probe.runtime_from_containers(sess)  # Ray's metrics are scraped where the nodes run Ray
    inv = sess.inv
    t0 = time.monotonic()
    addrs = sess.stage("addresses", inv.hosts,
                       lambda h: F.parse_addresses(N.of(sess, h).run(F.addresses_cmd(), timeout=30).stdout))
    warnings = exposure.monitor_warnings(inv, addrs, MP.monitor_host(inv).name)
    for w in warnings:
        sess.reporter.event(w.split(":", 1)[0], "exposure", "warning", w)
    config = MP.scrape_config(inv)
    plan = MP.containers(inv)
    actions: dict[str, str] = {}
    exporters = [(h, n, a) for h, n, a in plan if n != MP.prometheus_name(inv)]
    by_host: dict[str, list] = {}
    for h, n, a in exporters:
        by_host.setdefault(h.name, []).append((n, a))
    res = sess.stage("exporters", [h for h in inv.hosts if h.name in by_host],
                     lambda h: {n: _ensure(sess, h, n, a, None) for n, a in by_host[h.name]})
    for hname, done in res.items():
        for n, what in done.items():
            actions[f"{hname}/{n}"] = what
    mh = MP.monitor_host(inv)
    argv = MP.prometheus_create_argv(inv)
    res = sess.stage("prometheus", [mh], lambda h: _ensure(sess, h, MP.prometheus_name(inv), argv, config))
    actions[f"{mh.name}/{MP.prometheus_name(inv)}"] = res[mh.name]

    deadline = time.monotonic() + max(wait, 30.0)
    last = "no answer"
    while True:  # ready: Prometheus answers /-/ready
        try:
            code, body = _get(sess, inv, "/-/ready", timeout=5)
            if code == 200:
                break
            last = f"HTTP {code}: {body.decode(errors='replace')[:200]}"
        except OSError as exc:  # not answering yet: asked again; the last answer is in the error at the deadline
            last = str(exc)
        if time.monotonic() > deadline:
            tail = N.of(sess, mh, MP.prometheus_name(inv)).logs(20)
            raise CommandFailed(mh.name, f"{MP.prometheus_name(inv)}: GET /-/ready ({last})", None, tail)
        time.sleep(1)
    targets = _targets(sess, inv)
    expected = len(MP.scrape_targets(inv))
    all_up, known_since = None, None
    settle = 3 * inv.cluster.monitor.scrape_interval + 5
    while True:
        # done when every target is up; or when each was scraped and the ones down stayed down
        # for three scrapes (vLLM before `serve`); or at the end of the wait
        if len(targets) >= expected and all(t.health == "up" for t in targets):
            all_up = time.monotonic() - t0
            break
        if len(targets) >= expected and all(t.health != "unknown" for t in targets):
            known_since = known_since or time.monotonic()
            if time.monotonic() - known_since > settle:
                break
        else:
            known_since = None
        if time.monotonic() > t0 + wait:
            break
        time.sleep(1)
        targets = _targets(sess, inv)
    return MonitorResult(MP.prometheus_url(inv), mh.name, targets, actions, time.monotonic() - t0, all_up, warnings)


def prometheus_state(sess: Session) -> ContainerState | None:
    """Prometheus' container on the monitor host; None when there is none. A host that does not
    answer over SSH raises MonitorUnreachable and a Docker that does not answer CommandFailed, each
    naming the host and why: neither may read as "Prometheus is not running"."""
    inv = sess.inv
    mh = MP.monitor_host(inv)
    try:
        return N.of(sess, mh, MP.prometheus_name(inv)).inspect()
    except HostUnreachable as exc:
        raise MonitorUnreachable(mh.name, exc.reason, exc.hint) from None


def running_url(inv: Inventory) -> str | None:
    """Prometheus' URL when its container runs on the monitor host (for `status` and `top`), None
    when it does not run; MonitorUnreachable or CommandFailed when that cannot be told (see
    prometheus_state): the caller says so instead of "not running"."""
    with Session(inv) as sess:
        state = prometheus_state(sess)
    return MP.prometheus_url(inv) if state is not None and state.running else None


def monitor_status(sess: Session) -> MonitorResult:
    """Every scrape target as Prometheus sees it. Only the monitor host is asked (the others' exporters
    are Prometheus' targets: a host down is a target down, not a failure of this command)."""
    inv = sess.inv
    mh = MP.monitor_host(inv)
    state = prometheus_state(sess)
    if state is None or not state.running:
        why = f"no container {MP.prometheus_name(inv)}" if state is None else f"it is {state.status}"
        raise PreflightFailed(mh.name, f"Prometheus is not running ({why})", "run `bootstrap monitor up`")
    return MonitorResult(MP.prometheus_url(inv), mh.name, _targets(sess, inv))


def monitor_down(sess: Session, *, purge: bool = False) -> dict[str, str]:
    """Remove every monitoring container (and with purge, Prometheus' data volume)."""
    inv = sess.inv
    names = (MP.node_exporter_name(inv), MP.dcgm_name(inv), MP.prometheus_name(inv))
    res = sess.stage("remove", inv.hosts, lambda h: N.of(sess, h).rm(*names, timeout=120))
    out = {h: "removed" for h in res}
    if purge:
        mh = MP.monitor_host(inv)
        sess.stage("purge", [mh], lambda h: N.of(sess, h).volume_rm(MP.volume_name(inv)))
        out[mh.name] = "removed, data purged"
    return out
