"""A fleet's whole life: up, status and down of an inventory with cluster.replicas > 1.

A fleet is two things on its hosts: each replica group's cluster (its own node containers, head and
Ray cluster, brought up and torn down by cluster/run.py, once per group) and the fleet's own
containers (per host: the serve container `<container_name>-serve`, its standby
`<container_name>-serve-standby` (and `-serve-spent` for a moment after a take-over), a replaced
one kept for a rollback `<container_name>-serve-old` (`-serve-standby-old`), the keeper
`<container_name>-keeper`; on the router host the
router `<container_name>-router`; started by fleet/run.py). The functions here drive both, so the
CLI, a Python caller and the tests do the same thing. cluster/run.py refuses a fleet inventory and
names these functions: the cluster layer cannot call the fleet above it.

What the fleet leaves nowhere: no named volume (the keeper bind-mounts the Docker socket, the serve
containers the inventory's own mounts), no network (every container runs with `--network host` or
`none`), and no secret in Docker's records: they are files on the hosts' /run (a tmpfs), which
`down` removes (cluster/guard/secretstore.py).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

from bootstrap.cluster import run as CR
from bootstrap.errors import BootstrapError, GroupError, Interrupted, UsageError
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import status as FS
from bootstrap.fleet import steps as FST
from bootstrap.model import Host, Inventory
from bootstrap.parallel import outcomes
from bootstrap.remote import node as N
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Reporter, Session


def _fleet_only(inv: Inventory, fn: str, single: str) -> None:
    if inv.cluster.replicas < 2:
        raise UsageError(f"fleet.lifecycle.{fn} drives replicas (cluster.replicas 2 or more) and this inventory has "
                         f"one: use bootstrap.cluster.run.{single}")


def fleet_containers(inv: Inventory) -> tuple[str, ...]:
    """The fleet's own containers, in the order `down` removes them: the keeper first (it starts a
    serve or router container again that stopped behind its back), then the router and the serve
    containers, the standbys and those kept for a rollback included. keepalived (a floating address) before the
    router: it is stopped first (fleet.run.stop_vip) so that it gives the address up and removes its forwarding."""
    return (FN.keeper_name(inv), FN.vip_name(inv), FN.router_name(inv), *FN.serve_names(inv))


# -- up -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaUp:
    """One replica group's `up`: its own inventory (the group alone, its head first) and result."""

    index: int
    inv: Inventory
    result: CR.UpResult
    #: how long its `up` took, and when it started (time.time())
    seconds: float
    started_at: float


def up_fleet(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
             dry_run: bool = False, load_image: bool | None = None, pull: bool = False, wait: float = 180.0,
             accept_new_host_keys: bool | None = None, allow_partial: bool = False, lock_wait: float = 0.0,
             skip_checks: frozenset[str] = frozenset(), on_replica: Callable[[int, Inventory], None] | None = None,
             on_done: Callable[[ReplicaUp], None] | None = None, approve: CR.Approve | None = None) -> list[ReplicaUp]:
    """Bring every replica group's cluster up at once, each with its own head and Ray cluster
    (cluster.run.up_in with the same options, on FP.replica_inventory, each group in its own session
    and lock). The fleet's own containers start with `serve` (fleet.run.serve_fleet).

    on_replica(k, replica_inventory) is called for every group before any starts, on_done(ReplicaUp)
    as each is up, in the order they finish (the CLI prints each replica's table there). A group that
    fails does not stop the others: when every group has finished, its error is raised (the failures of
    several groups in one stage as one GroupError naming each host); the groups that came up stay up
    and a re-run continues (it keeps what is up to date). Ctrl-C / SIGTERM stops every group's remote
    work and raises one Interrupted with every host's state."""
    _fleet_only(inv, "up_fleet", "up")
    groups = [FP.replica_inventory(inv, k) for k in range(inv.cluster.replicas)]
    opts = dict(dry_run=dry_run, load_image=load_image, pull=pull, wait=wait, allow_partial=allow_partial,
                lock_wait=lock_wait, skip_checks=skip_checks)
    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(Session(g, parallel=parallel, reporter=reporter,
                                                accept_new_host_keys=accept_new_host_keys)) for g in groups]
        try:
            return _up_groups(inv, sessions, opts, on_replica, on_done, approve)
        except KeyboardInterrupt:
            raise _interrupted(sessions) from None


def _up_groups(inv: Inventory, sessions: list[Session], opts: dict,
               on_replica: Callable[[int, Inventory], None] | None, on_done: Callable[[ReplicaUp], None] | None,
               approve: CR.Approve | None) -> list[ReplicaUp]:
    """cluster.run.stage_up in every session at once, then one question (approve(inv, the actions of every
    group that stop a running container)) before any group changes a host, then apply_up in every staged
    session at once; on_done as each group is up; the first error after all (a group that fails does
    not stop the others)."""
    if on_replica is not None:
        for k, sess in enumerate(sessions):
            on_replica(k, sess.inv)
    started: dict[int, tuple[float, float]] = {}
    done: dict[int, ReplicaUp] = {}

    def stage(k: int) -> CR.Staged | CR.UpResult:
        started[k] = (time.monotonic(), time.time())
        return CR.stage_up(sessions[k], **opts)

    def arrived(k: object, outcome: object) -> None:
        if isinstance(outcome, BaseException) or not isinstance(outcome, CR.UpResult):
            return
        assert isinstance(k, int)
        t0, at = started[k]
        done[k] = ReplicaUp(k, sessions[k].inv, outcome, time.monotonic() - t0, at)
        if on_done is not None:
            on_done(done[k])
    ks = range(len(sessions))
    staged = outcomes(ks, stage, key=lambda k: k, threads=len(sessions), name="up-replica", on_outcome=arrived)
    failed = {k: x for k, x in staged.items() if isinstance(x, BaseException)}
    todo = {k: x for k, x in staged.items() if isinstance(x, CR.Staged)}
    stopping = tuple(a for k in sorted(todo) for a in todo[k].stopping)
    if stopping and approve is not None:
        approve(inv, stopping)
    got = outcomes(sorted(todo), lambda k: CR.apply_up(sessions[k], todo[k]), key=lambda k: k,
                   threads=max(1, len(todo)), name="up-replica", on_outcome=arrived)
    failed.update({k: x for k, x in got.items() if isinstance(x, BaseException)})
    if failed:
        raise _one_error([failed[k] for k in sorted(failed)])
    return [done[k] for k in sorted(done)]


def _one_error(errors: list[BaseException]) -> BaseException:
    """The error of the first group that failed; GroupErrors of one stage merged into one that names
    every failing host of every group (a KeyboardInterrupt inside a group, the interrupt path, first)."""
    for exc in errors:
        if not isinstance(exc, Exception):
            return exc
    first = errors[0]
    same = [e for e in errors if isinstance(e, GroupError) and isinstance(first, GroupError) and e.stage == first.stage]
    if len(same) > 1:
        merged: dict[str, object] = {}
        for e in same:
            merged.update(e.results)
        return GroupError(first.stage, merged)
    return first


def _interrupted(sessions: list[Session]) -> Interrupted:
    """Ctrl-C / SIGTERM: every group's remote work stopped (cluster.run.interrupted of each), one
    Interrupted with every host's state, in the stage the first unfinished group was in."""
    parts = [CR.interrupted(sess, "up") for sess in sessions]
    states: dict[str, str] = {}
    for part in parts:
        states.update(part.states)
    return Interrupted("up", next((p.stage for p in parts if p.stage), ""), states)


# -- status ---------------------------------------------------------------------------------------


@dataclass
class FleetStatus:
    #: per replica group: its nodes and its Ray cluster (cluster.run.cluster_status)
    groups: list[CR.ClusterStatus]
    #: the serve containers, the router and each replica as the router sees it
    fleet: FS.FleetState

    @property
    def ok(self) -> bool:
        """Every node alive, every replica healthy, and a floating address (if any) held by a router
        host (`status` exits 1 otherwise)."""
        return (all(n.ray_alive for g in self.groups for n in g.nodes)
                and all(r.health == "healthy" for r in self.fleet.replicas)
                and (self.fleet.vip is None or self.fleet.vip_holder is not None))


def fleet_status(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL,
                 reporter: Reporter | None = None) -> FleetStatus:
    """Each replica group's nodes (cluster.run.cluster_status; what a single-replica `serve` runs is
    not asked: the fleet serves through its own containers), then the fleet's state."""
    _fleet_only(inv, "fleet_status", "cluster_status")
    groups = [CR.cluster_status(FP.replica_inventory(inv, k), parallel=parallel, reporter=reporter)
              for k in range(inv.cluster.replicas)]
    return FleetStatus(groups, FS.status(inv, parallel=parallel, reporter=reporter))


# -- down -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetDownResult:
    #: host -> the fleet containers removed there (names from fleet_containers; absent ones left out)
    fleet_removed: dict[str, tuple[str, ...]]
    #: per replica group, cluster.run.down's result: the node containers (workers first, then the head)
    replicas: tuple[CR.DownResult, ...]


def _remove(sess: Session, host: Host, names: tuple[str, ...]) -> tuple[str, ...]:
    """`docker rm -f NAMES` on one host: those it removed (Docker prints each one it removed on
    stdout; an absent one is fine). Any other failure raises, naming the host."""
    r = N.of(sess, host).rm(*names, timeout=120)
    out = set(r.stdout.split())
    return tuple(n for n in names if n in out)


def down_fleet(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
               lock_wait: float = 0.0, drain: float = 120.0) -> FleetDownResult:
    """Tear the whole fleet down: on every host the keeper, then the router and the serve containers
    (fleet_containers), then each replica group's cluster (cluster.run.down: `ray stop` and the node
    container, workers first, under the group head's lock). Nothing of the fleet stays on a host that
    answered.

    A host that fails (unreachable, Docker not answering, a container that will not go) does not stop
    the others: everything else is still torn down, then the error is raised: the one error when there
    is one, else a GroupError with every host's outcome. A second run is a no-op. Before the routers and
    the serve containers go, every replica leaves the routers and finishes its requests (steps.drain_out;
    drain: the seconds that may take, 0: not waited for)."""
    _fleet_only(inv, "down_fleet", "down")
    keeper, rest = fleet_containers(inv)[:1], fleet_containers(inv)[1:]
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)
        reachable = [h for h in inv.hosts if h.name not in conn.failed]
        # the keeper first: with it gone nothing starts the others again while they are removed
        kept = sess.stage("stop-keeper", reachable, lambda h: _remove(sess, h, keeper), strict=False)
        FST.drain_out(sess, inv, reachable, drain)
        if inv.cluster.router.vip is not None:
            vips = [h for h in FN.router_hosts(inv) if h in reachable]
            sess.stage("stop-vip", vips, lambda h: FST.stop_vip(sess, h), strict=False)
        gone = sess.stage("stop", reachable, lambda h: _remove(sess, h, rest), strict=False)
    failed: dict[str, BaseException] = {**conn.failed, **kept.failed}
    for name, exc in gone.failed.items():
        failed.setdefault(name, exc)
    removed = {h.name: (*kept.succeeded.get(h.name, ()), *gone.succeeded.get(h.name, ()))
               for h in inv.hosts if h.name not in failed}
    errors: list[BootstrapError] = []
    if failed:
        errors.append(GroupError("down", {h.name: failed.get(h.name, removed.get(h.name)) for h in inv.hosts}))

    downs: list[CR.DownResult] = []
    # a pool's idle hosts last, as one group: what an `up` left there when a model used them
    idle = FP.idle_inventory(inv)
    for group in [FP.replica_inventory(inv, k) for k in range(inv.cluster.replicas)] + ([idle] if idle else []):
        try:
            downs.append(CR.down(group, parallel=parallel, reporter=reporter, lock_wait=lock_wait))
        except GroupError as exc:
            errors.append(exc)
            for name, r in exc.failures.items():
                failed.setdefault(name, r)
        except BootstrapError as exc:  # e.g. the group's lock is held by another run: the head names it
            errors.append(exc)
            failed.setdefault(group.head.name, exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise GroupError("down", {h.name: failed.get(h.name, True) for h in inv.hosts})
    return FleetDownResult(removed, tuple(downs))
