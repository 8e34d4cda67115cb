"""`bootstrap top`: sample every host over SSH, keep a short history, make the rows.

One remote step: `checks/top_probe.py` inside the host's container (the serve container of a
replica, else the cluster container), given the vLLM /metrics URL on a replica's head. All hosts are
sampled in parallel each frame; a host or container that does not answer is a row marked down (it
is tried again next frame), never an abort. The arithmetic is in bootstrap.metrics.
"""
from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from bootstrap.fleet import names as FN
from bootstrap.model import Host, Inventory
from bootstrap.monitor import metrics as M
from bootstrap.remote import node as N
from bootstrap.remote.session import Session

#: samples kept per host (enough for the percentile window at a 1 s interval)
KEEP = 90


@dataclass(frozen=True)
class Target:
    host: Host
    container: str
    replica: int | None  # None: one cluster (cluster.replicas = 1)
    metrics_url: str | None  # set on a replica's head


def targets(inv: Inventory) -> list[Target]:
    """Every host once; the head of each replica also reads its vLLM's /metrics. A pool's idle host (in no
    replica: Inventory.idle) is read in its cluster container, with no replica."""
    if FN.is_fleet(inv):
        heads = {group[0].name: k for k, group in enumerate(inv.replicas)}
        replica_of = {h.name: k for k, group in enumerate(inv.replicas) for h in group}
        return [Target(h, FN.serve_name(inv), replica_of[h.name],
                       FN.replica_url(inv, heads[h.name]) + "/metrics" if h.name in heads else None)
                if h.name in replica_of else Target(h, inv.cluster.container_name, None, None)
                for h in inv.hosts]
    url = FN.http_url(inv.head.ip, inv.cluster.ports.vllm) + "/metrics"
    return [Target(h, inv.cluster.container_name, None, url if h.name == inv.head.name else None)
            for h in inv.hosts]


@dataclass(frozen=True)
class Frame:
    t: float  # time.time() of the frame
    interval: float
    window: float  # seconds of history the percentiles cover
    rows: tuple[M.Row, ...]
    #: "probe" (bootstrap's probe in each container) or the Prometheus URL the rows came from
    source: str = "probe"

    @property
    def down(self) -> list[M.Row]:
        return [r for r in self.rows if not r.up]

    def to_dict(self) -> dict:
        return {"time": round(self.t, 3), "interval": self.interval, "window_seconds": round(self.window, 1),
                "source": self.source,
                "replicas": [r.to_dict() for r in self.rows if r.kind == "replica"],
                "nodes": [r.to_dict() for r in self.rows if r.kind == "node"]}


class Watcher:
    """Holds the SSH sessions and each host's recent samples."""

    def __init__(self, inv: Inventory, *, clock: Callable[[], float] = time.time):
        self.inv = inv
        self.targets = targets(inv)
        self.clock = clock
        self.history: dict[str, deque[M.HostSample]] = {t.host.name: deque(maxlen=KEEP) for t in self.targets}
        # a dead host costs one short try per frame, not the inventory's retries
        ssh = replace(inv.cluster.ssh, connect_retries=0, connect_timeout=min(inv.cluster.ssh.connect_timeout, 5.0))
        self.sess = Session(inv, parallel=max(1, len(self.targets)), settings=ssh)

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc) -> None:
        self.sess.close()

    def _sample(self, t: Target) -> M.HostSample:
        # read here, not with the payload's one rule: a probe that exited non-zero is a row marked down
        r = N.of(self.sess, t.host, t.container).ask("top_probe.py", *([t.metrics_url] if t.metrics_url else []),
                                                    timeout=20).result
        now = self.clock()
        line = next((ln for ln in reversed(r.stdout.splitlines()) if ln.startswith("{")), None)
        if r.exit_code != 0 or line is None:
            why = (r.stderr or r.stdout).strip().splitlines()
            last = why[-1] if why else f"exit {r.exit_code}"
            return M.HostSample(t=now, error=f"container {t.container}: {last}"[:200])
        return M.parse_probe(json.loads(line), now)

    def sample(self) -> None:
        """One look at every host, in parallel; failures become samples with an error."""
        res = self.sess.stage("top", [t.host for t in self.targets],
                              lambda h: self._sample(next(t for t in self.targets if t.host is h)), strict=False)
        now = self.clock()
        failed = res.failed
        for t in self.targets:
            r = res.get(t.host.name)
            if t.host.name in failed:
                if isinstance(r, KeyboardInterrupt):
                    raise r
                r = M.HostSample(t=now, error=str(r)[:200])
            self.history[t.host.name].append(r)

    def groups(self) -> list[tuple[str, int | None, list[str]]]:
        """(row name, replica, hosts with the head first) of each serving group."""
        if FN.is_fleet(self.inv):  # a pool's rows say the model each replica serves
            return [(f"replica {k}" + (f" {m.name}" if (m := self.inv.model_of(k)) else ""), k, [h.name for h in g])
                    for k, g in enumerate(self.inv.replicas)]
        hosts = [self.inv.head.name] + [h.name for h in self.inv.hosts if h.name != self.inv.head.name]
        return [("vllm", None, hosts)]

    def prometheus_frame(self, sess_query: Callable[[str], list], url: str, interval: float) -> Frame:
        """The rows from Prometheus (every column's PromQL over the last minute)."""
        values = {col: M.by_host(sess_query(expr)) for col, expr in M.PROMQL.items()}
        rows = M.rows_from_prometheus(values, self.groups(), {t.host.name: t.replica for t in self.targets})
        return Frame(self.clock(), interval, M.WINDOW, rows, url)

    def frame(self, interval: float) -> Frame:
        rows: list[M.Row] = []
        for name, replica, hosts in self.groups():
            rows.append(M.replica_row(name, replica, hosts, self.history[hosts[0]]))
        for t in self.targets:
            rows.append(M.node_row(t.host.name, t.replica, self.history[t.host.name]))
        spans = [h[-1].t - h[0].t for h in self.history.values() if len(h) > 1]
        window = min(M.WINDOW, max(spans)) if spans else 0.0
        return Frame(self.clock(), interval, window, tuple(rows))
