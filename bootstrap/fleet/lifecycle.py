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

import time
from dataclasses import dataclass
from typing import Callable

from bootstrap.cluster import run as CR
from bootstrap.errors import BootstrapError, GroupError, UsageError
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import status as FS
from bootstrap.fleet import steps as FST
from bootstrap.model import Host, Inventory
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
             on_done: Callable[[ReplicaUp], None] | None = None) -> list[ReplicaUp]:
    """Bring every replica group's cluster up, one group after the other, each with its own head and
    Ray cluster (cluster.run.up with the same options, on FP.replica_inventory). The fleet's own
    containers start with `serve` (fleet.run.serve_fleet).

    on_replica(k, replica_inventory) is called before replica k starts, on_done(ReplicaUp) when it
    is up (the CLI prints each replica's table there). A replica that fails raises its error; the
    groups before it stay up and a re-run continues (it keeps what is up to date)."""
    _fleet_only(inv, "up_fleet", "up")
    done: list[ReplicaUp] = []
    for k in range(inv.cluster.replicas):
        group = FP.replica_inventory(inv, k)
        if on_replica is not None:
            on_replica(k, group)
        t0, started_at = time.monotonic(), time.time()
        res = CR.up(group, parallel=parallel, reporter=reporter, dry_run=dry_run, load_image=load_image, pull=pull,
                    wait=wait, accept_new_host_keys=accept_new_host_keys, allow_partial=allow_partial,
                    lock_wait=lock_wait, skip_checks=skip_checks)
        rep = ReplicaUp(k, group, res, time.monotonic() - t0, started_at)
        if on_done is not None:
            on_done(rep)
        done.append(rep)
    return done


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
               lock_wait: float = 0.0) -> FleetDownResult:
    """Tear the whole fleet down: on every host the keeper, then the router and the serve containers
    (fleet_containers), then each replica group's cluster (cluster.run.down: `ray stop` and the node
    container, workers first, under the group head's lock). Nothing of the fleet stays on a host that
    answered.

    A host that fails (unreachable, Docker not answering, a container that will not go) does not stop
    the others: everything else is still torn down, then the error is raised: the one error when there
    is one, else a GroupError with every host's outcome. A second run is a no-op."""
    _fleet_only(inv, "down_fleet", "down")
    keeper, rest = fleet_containers(inv)[:1], fleet_containers(inv)[1:]
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)
        reachable = [h for h in inv.hosts if h.name not in conn.failed]
        # the keeper first: with it gone nothing starts the others again while they are removed
        kept = sess.stage("stop-keeper", reachable, lambda h: _remove(sess, h, keeper), strict=False)
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
    for k in range(inv.cluster.replicas):
        group = FP.replica_inventory(inv, k)
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
