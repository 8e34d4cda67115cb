"""`drain HOST` and `undrain HOST`: a host's replica out of every router for maintenance, and back (SSH).

vllm-router has no draining state (its roadmap: vllm-project/router#244), so the drain is bootstrap's:
the host is marked first (a labelled Docker volume on it: fleet/steps.py drain_mark), then its
replica leaves every router, then bootstrap waits until the replica's engines have no request
running or waiting (vLLM's own gauges; checks/fleet_probe.py drain) or the timeout. The replica
keeps running. While a host of it is marked, `serve` and `rollout` start and replace the replica as
usual but leave it out of the routers (steps.back_in_router); `undrain` removes the mark and puts
the replica back once it answers. `down` removes the mark with everything else.
"""
from __future__ import annotations

from dataclasses import dataclass

from bootstrap.errors import FleetError, ServeFailed
from bootstrap.fleet import names as FN
from bootstrap.fleet import status as FS
from bootstrap.fleet.steps import NotOut, _in_router, drained_hosts, set_drained, take_out
from bootstrap.model import Inventory
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Reporter, Session


@dataclass(frozen=True)
class DrainResult:
    host: str
    replica: int
    url: str
    #: drain: the engines reached no request running or waiting before the timeout; undrain: the
    #: replica is back in every router
    done: bool
    why: str
    seconds: float = 0.0
    #: undrain: the replica's other hosts still drained (it stays out until none is)
    still_drained: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"host": self.host, "replica": self.replica, "url": self.url, "done": self.done, "why": self.why,
                "seconds": round(self.seconds, 2), "still_drained": list(self.still_drained)}


def check(inv: Inventory, host: str, verb: str) -> int:
    """The replica of `host`, or FleetError: not a fleet, no such host, a pool (not yet)."""
    if not FN.is_fleet(inv):
        raise FleetError(f"{verb}: the inventory has one replica and no router to take it out of (set "
                         "cluster.replicas > 1); `bootstrap serve --stop` stops serving")
    if inv.models:
        raise FleetError(f"{verb}: a pool of models (models:) re-routes its replicas as `serve` converges; "
                         "draining a host of a pool is not supported yet")
    names = [h.name for h in inv.hosts]
    if host not in names:
        raise FleetError(f"{verb}: no host {host!r} in the inventory (hosts: {', '.join(names)})")
    return next(k for k, group in enumerate(inv.replicas) if any(h.name == host for h in group))


def drain(inv: Inventory, host: str, *, timeout: float = 120.0, parallel: int = DEFAULT_PARALLEL,
          reporter: Reporter | None = None) -> DrainResult:
    """Mark HOST drained, take its replica out of every router and wait until its engines are idle.
    Refused (nothing changed) when no other replica would be left in rotation."""
    k = check(inv, host, "drain")
    url = FN.replica_url(inv, k)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        state = FS.fleet_state(sess)
        others = [r.index for r in state.replicas if r.index != k and r.in_rotation and r.health == "healthy"]
        if not others and state.replicas[k].in_rotation:
            raise FleetError(f"drain {host}: replica {k} is the only healthy one in the router's rotation; taking it "
                             "out would leave the endpoint nothing to send requests to (bring another replica back "
                             "first, or `bootstrap serve --stop` to stop serving)")
        h = inv.host(host)
        sess.stage("mark-drained", [h], lambda h: set_drained(sess, h, True))
        try:
            d = take_out(sess, inv, url, timeout, k=k)
        except NotOut as e:
            raise ServeFailed(f"drain {host}: the routers did not take replica {k} out: {e.answer} (the host stays "
                              "marked drained: `bootstrap undrain` puts it back)", "") from None
    return DrainResult(host, k, url, bool(d.get("drained")), str(d.get("why", d.get("error", "?"))),
                       float(d.get("t", 0.0)))


def undrain(inv: Inventory, host: str, *, parallel: int = DEFAULT_PARALLEL,
            reporter: Reporter | None = None) -> DrainResult:
    """Remove HOST's mark; its replica back in every router once no host of it is marked and it answers."""
    k = check(inv, host, "undrain")
    url = FN.replica_url(inv, k)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        sess.stage("unmark-drained", [inv.host(host)], lambda h: set_drained(sess, h, False))
        still = tuple(drained_hosts(sess, inv.replicas[k]))
        if still:
            return DrainResult(host, k, url, False, f"replica {k} stays out: {', '.join(still)} still drained",
                               still_drained=still)
        state = FS.fleet_state(sess).replicas[k]
        if state.health != "healthy":
            return DrainResult(host, k, url, False, f"replica {k} is {state.health}: not put back in the routers "
                               "(`bootstrap serve` or `rollout` puts it back once it serves)")
        back = _in_router(sess, inv, k, True)
    if not back.get("ok"):
        raise ServeFailed(f"undrain {host}: the routers did not take replica {k} back: {back}", "")
    return DrainResult(host, k, url, True, f"replica {k} back in every router")
