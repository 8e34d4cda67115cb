"""The library face's result objects: what each command's call returns, each with a to_doc() for `--json`.

They hold the library's own results (cluster.run, fleet, serve, ...) with what a caller needs to show
them (the inventory, the label of a replica); exit_status says how a command ends on them. No I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bootstrap.errors import ExitStatus, UsageError
from bootstrap.face import docs as D


class OptionError(UsageError):
    """An option or value that the inventory refuses (`--sync-model` with replicas, `--limit` naming no
    host): the command line's mistake, shown as a usage error of the command. param_hint: the option
    or argument it is about (None: the command as a whole)."""

    def __init__(self, message: str, param_hint: str | None = None):
        super().__init__(message)
        self.param_hint = param_hint


class _Verdict:
    """A result its command ends on: exit 0 when it is ok, else 1 (a host or a check failed)."""

    ok: bool

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.OK if self.ok else ExitStatus.ERROR


@dataclass
class PlanResult:
    """`plan` of one cluster (`up --dry-run`: live, what would change): each host's container."""
    actions: list
    runtime: str | None = ""
    why: str = ""
    live: bool = False

    def to_doc(self):
        return D.plan_doc(self.actions, self.runtime)


@dataclass
class FleetPlanResult:
    """`plan` with replicas: each replica's containers, the routers, the keeper."""
    replicas: list  # [(url, actions)]
    routers: list
    router_url: str
    keeper_argv: tuple
    standby: str | None = None
    #: cluster.runtime, None when unset (decided from the image by `up`)
    runtime: str | None = ""
    #: a pool's model on each replica (models:): {"model": served name, "source": what vLLM loads}; else []
    models: list = field(default_factory=list)
    #: a pool's hosts that serve no model (models: takes fewer hosts)
    idle: list = field(default_factory=list)

    def to_doc(self):
        return D.fleet_plan_doc(self.replicas, self.routers, self.router_url, self.keeper_argv, self.standby,
                                self.runtime, self.models, self.idle)


@dataclass
class UpResult:
    """One group's `up` (the cluster, or replica `index` of a fleet): cluster.run.UpResult and its times."""
    inv: Any
    result: Any
    label: str
    seconds: float
    started_at: float
    dry_run: bool = False

    @property
    def plan(self) -> PlanResult:
        """What `up --dry-run` shows: each host's container and what would change."""
        return PlanResult(self.result.actions, self.result.runtime, self.result.runtime_why, live=True)

    def to_doc(self):
        return self.plan.to_doc() if self.dry_run else D.up_doc(self.inv, self.result, self.seconds, self.started_at)


@dataclass
class Prometheus:
    """The Prometheus line under `status`: its URL (None: not running) on `host`, or why it is unknown."""
    url: str | None = None
    host: Any = None
    port: int | None = None
    unknown: Exception | None = None


@dataclass
class StatusResult(_Verdict):
    """`status` of one cluster: cluster.run.ClusterStatus, and Prometheus (None with --json)."""
    inv: Any
    status: Any
    prometheus: Prometheus | None = None

    @property
    def ok(self) -> bool:
        return all(r.ray_alive for r in self.status.nodes)

    def to_doc(self):
        return D.status_doc(self.status)


@dataclass
class FleetStatusResult(_Verdict):
    """`status` with replicas: each group's nodes, the fleet as the router sees it, Prometheus."""
    inv: Any
    groups: list
    fleet: Any
    ok: bool
    prometheus: Prometheus | None = None

    def to_doc(self):
        return D.fleet_status_doc(self.groups, self.fleet)


@dataclass
class DrainOutcome(_Verdict):
    """`drain` / `undrain`: fleet/drain.py's result; ok: drained (idle before the timeout), or put back
    (or left out only because another host of the replica is still drained)."""
    verb: str
    result: Any
    ok: bool

    def to_doc(self):
        return {"action": self.verb, **self.result.to_dict()}


@dataclass
class ExposureResult(_Verdict):
    """`status --exposure`: every listening socket of the cluster's (cluster.fence.Exposure)."""
    inv: Any
    found: list

    @property
    def ok(self) -> bool:
        return not any(e.open_beyond for e in self.found)

    def to_doc(self):
        return D.exposure_doc(self.inv, self.found)


@dataclass
class DownResult:
    """`down`: per replica group (one without replicas) what was removed; with replicas the fleet's own."""
    groups: list
    fleet: dict | None = None

    def to_doc(self):
        return D.down_doc(self.groups, self.fleet)


@dataclass
class ExecResult(_Verdict):
    """`exec`: each host's cluster.exec.ExecResult."""
    results: list

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def to_doc(self):
        return [r.as_dict() for r in self.results]


@dataclass
class NcclResult:
    """`check-nccl`: nccl.run's result."""
    result: Any

    @property
    def exit_status(self) -> ExitStatus:
        if self.result.ok:
            return ExitStatus.OK
        return ExitStatus.TIMEOUT if self.result.timed_out else ExitStatus.ERROR

    def to_doc(self):
        return D.nccl_doc(self.result)


@dataclass
class KvCheckResult(_Verdict):
    """`check-kv`: each prefill x decode pair's result; infiniband: the inventory's (TCP is a warning)."""
    pairs: list
    infiniband: bool

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.pairs)

    def to_doc(self):
        return D.kv_check_doc(self.pairs, self.infiniband)


@dataclass
class DoctorResult(_Verdict):
    """`doctor`: the findings on the inventory's hosts."""
    inv: Any
    report: Any

    @property
    def ok(self) -> bool:
        return self.report.ok

    def to_doc(self):
        return D.doctor_doc(self.report)


@dataclass
class LogsResult(_Verdict):
    """`logs`: what was read (doctor.run.LogsResult); None when interrupted while following."""
    result: Any
    asked: bool

    @property
    def ok(self) -> bool:
        r = self.result
        return r is None or not (r.failed or not r.read)


@dataclass
class ServeOutcome:
    """`serve`: what happened: "stopped", "planned" (--dry-run: value is the plan) or "served"; fleet:
    with replicas (value then fleet.run's FleetResult or FleetPlan)."""
    inv: Any
    kind: str
    fleet: bool
    value: Any = None

    def to_doc(self):
        if self.kind == "planned":
            return {"dry_run": True, **self.value.to_dict()}
        if self.kind == "served":
            return D.fleet_served_doc(self.value) if self.fleet else D.served_doc(self.value)
        if self.value is not None:  # one model of a pool
            return {"stopped": True, **self.value}
        return {"stopped": True, "replicas": self.inv.cluster.replicas if self.fleet else None}


@dataclass
class AdapterResult:
    """`adapter add|remove|list`: each replica of the model with the adapters it serves after it."""
    result: Any

    def to_doc(self):
        r = self.result
        return {"action": r.action, "model": r.model, "name": r.name,
                "replicas": [{"replica": k, "adapters": a} for k, a in sorted(r.replicas.items())],
                "routers": sorted(r.routers)}


@dataclass
class RolloutResult:
    result: Any

    def to_doc(self):
        return D.rollout_doc(self.result)


@dataclass
class BenchResult(_Verdict):
    """`bench`: serve.bench's result, how the requests spread over the replicas (None: one cluster), the PNG."""
    result: Any
    spread: Any = None
    png: str | None = None

    @property
    def ok(self) -> bool:
        return self.result.ok != 0  # not one request answered

    def to_doc(self):
        return D.bench_doc(self.result, self.spread)


@dataclass
class MonitorResult:
    """`monitor up`/`status` (kind "up", "status"): monitor.run's result (its own to_dict); `monitor down`
    (kind "down"): the hosts cleaned, and whether Prometheus' samples were purged."""
    inv: Any
    result: Any
    kind: str
    purge: bool = False

    @property
    def exit_status(self) -> ExitStatus:
        bad = {"up": lambda r: r.down_infrastructure, "status": lambda r: r.down}.get(self.kind, lambda r: False)
        return ExitStatus.ERROR if bad(self.result) else ExitStatus.OK

    def to_doc(self):
        return D.monitor_down_doc(self.result, self.purge) if self.kind == "down" else self.result.to_dict()


@dataclass
class SandboxResult:
    """`sandbox up` (info: sandbox.SandboxInfo) or `sandbox down` (info None)."""
    info: Any = None


@dataclass
class ValidateResult:
    """`validate`: the inventory (None when it has errors), every error found, and what was not checked."""
    path: str
    inventory: object
    errors: list
    offline: bool = False
    #: what is right but may not be what was meant, one line each (FILE:LINE: FIELD: text)
    notes: tuple = ()

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.OK if not self.errors else ExitStatus.BAD_INPUT

    def to_doc(self):
        doc = {"path": self.path, "ok": not self.errors, "notes": list(self.notes),
               "checked": {"key_files": not self.offline, "secrets": not self.offline},
               "errors": [{"line": e.line, "column": e.column, "field": e.field, "message": e.message, "text": str(e)}
                          for e in self.errors]}
        inv = self.inventory
        if inv is not None:
            doc.update(hosts=len(inv.hosts), head=inv.head.name, replicas=inv.cluster.replicas)
        return doc
