"""`bootstrap rollout`: replace a fleet's replicas one batch at a time behind its routers, over SSH.

A replica is taken out of the router, drained, stopped (kept for rollback), started with the new
spec, gated on a completion, and put back; one that does not serve is rolled back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from bootstrap.cluster.guard import run as GD
from bootstrap.errors import (
    BootstrapError,
    Interrupted,
    PreflightFailed,
    ReplicaFailed,
    RolloutFailed,
    UsageError,
)
from bootstrap.fleet import kvevents as KV
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.fleet.status import FleetState, ReplicaState, fleet_state
from bootstrap.fleet.steps import (
    NotOut,
    _gate,
    _inspect,
    _node_facts,
    _pool_split,
    _preflight,
    _replica_failure,
    _rm,
    _split,
    _start_replica,
    _start_standbys,
    _stop,
    back_in_router,
    take_out,
)
from bootstrap.model import Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.fanout import DEFAULT_PARALLEL, GroupResult, fan_out
from bootstrap.remote.session import Reporter, Session

#: serve's processes inside the node containers (a single-replica serve) hold the vLLM port.


@dataclass
class RolloutResult:
    endpoint: str
    target: FP.Spec
    replaced: list[int]
    unchanged: list[int]
    seconds: float
    #: replica -> seconds for drain, stop, start+gate
    steps: dict[int, dict[str, float]] = field(default_factory=dict)


def rollout(inv: Inventory, *, model: str | None = None, extra: Sequence[str] | None = None,
            image: str | None = None, served_name: str | None = None, dp: int | None | bool = False,
            drain: float = 120.0, wait: float = 900.0, max_unavailable: int = 1, parallel: int = DEFAULT_PARALLEL,
            reporter: Reporter | None = None, on_step: Callable[[int, str], None] | None = None) -> RolloutResult:
    """Replace the replicas one batch at a time (max_unavailable per batch): out of the router,
    drained, stopped (kept for rollback), started with the new spec, gated on a completion, back in
    the router. dp: False keeps each replica's shape, an int changes it to that many data parallel
    engines, None to a TP x PP group. A replica that does not serve is rolled back and the rollout stops, naming it;
    the others keep serving. Ctrl-C rolls the replica in flight back and lists every replica."""
    t0 = time.monotonic()
    step = on_step or (lambda k, what: None)
    if max_unavailable < 1:
        raise UsageError("--max-unavailable must be at least 1")
    FP.check_pd_flags(inv, extra or ())  # before any host is contacted (the image's table checks it again)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        _preflight(sess, inv)
        state: FleetState = fleet_state(sess)
        current = [r.spec for r in state.replicas]
        # a pool: the replicas of one model (--model), to what its models: entry says
        among = pool_groups(inv, model) if inv.models else list(range(len(inv.replicas)))
        base = next((current[k] for k in among if current[k] is not None), None)
        if base is None:
            raise PreflightFailed("fleet", "no replica is serving", "run `bootstrap serve MODEL` first")
        target = _target(inv, among, base, model, extra, image, served_name, dp)
        todo = [k for k in FP.rollout_order(current, target) if k in among]
        if todo and len(among) < 2:
            raise UsageError(f"{target.served_name or target.model} has one replica: a rollout keeps one serving while "
                             "another is replaced; give it two replicas, or run bootstrap serve (it restarts it)")
        if todo and FN.is_pd(inv):
            raise UsageError("rollout replaces replicas one at a time behind the router, which is not built for a "
                             "disaggregated fleet (cluster.router.prefill) yet: `bootstrap serve` with the new model "
                             "or flags restarts every replica")
        if todo and inv.cluster.router.policy == "kv_aware" and _kv(inv, target) != _kv(inv, base):
            raise UsageError("the routers' kv_aware subscribes with the served name and the KV block size, which "
                             "this rollout changes: `bootstrap serve` with the new model or flags restarts the "
                             "replicas and the routers")
        down = [r for r in state.routers if r.state != "running"]
        if down:
            raise PreflightFailed(down[0].host, f"the router container is {down[0].state}: a rollout changes "
                                  "every router's workers", "run `bootstrap serve` to start it")
        healthy = [r.index for r in state.replicas if r.health == "healthy" and r.index in among]
        if todo and not healthy:
            raise PreflightFailed("fleet", f"no replica of {len(among)} is healthy: a rollout needs one serving "
                                  "while another is replaced", "see `bootstrap status`; `bootstrap serve` starts over")
        # never every replica at once: one keeps serving
        max_unavailable = min(max_unavailable, len(among) - 1)
        plan = _plan(sess, inv if not image else _with_image(inv, target.image), target)
        if todo:
            GD.check_secret_store(sess, inv.hosts)
            GD.put_secrets(sess, inv.hosts, prune=False)  # a secret changed since `serve`: the new replicas get it
        states = {k: "new" if k not in todo else "old" for k in range(len(inv.replicas))}
        steps: dict[int, dict[str, float]] = {}
        for i in range(0, len(todo), max_unavailable):
            batch = todo[i:i + max_unavailable]
            others = _others_serving(sess, inv, batch, step, among)
            if not others:
                raise RolloutFailed(f"no other replica is healthy and in the router's rotation: replica "
                                    f"{', '.join(map(str, batch))} stays as it is", states)
            try:
                res = _replace_batch(sess, inv, [plan.replicas[k] for k in batch], drain, wait, step, steps)
            except KeyboardInterrupt:
                for k in batch:
                    states[k] = _roll_back(sess, inv, k, wait, step)
                raise Interrupted("rollout", "replace",
                                  {f"replica {k}": v for k, v in states.items()}) from None
            failed = res.failed
            for k in batch:
                err = failed.get(k)
                states[k] = "new" if err is None else getattr(err, "state", f"unknown ({err})")
            if failed:
                k = min(failed)
                err = failed[k]
                raise RolloutFailed(f"replica {k} ({', '.join(h.name for h in inv.replicas[k])}) did not serve "
                                    f"{target.describe()}: {getattr(err, 'cause', err)}; replica {k} is {states[k]}, "
                                    "the other replicas keep serving", states, getattr(err, "log_tail", ""))
        return RolloutResult(FN.router_url(inv) + "/v1", target, todo,
                             [k for k in range(len(inv.replicas)) if k not in todo], time.monotonic() - t0, steps)


def _kv(inv: Inventory, spec: FP.Spec) -> KV.KvEvents:
    return KV.of(inv, spec.model, spec.served_name, spec.extra)


def _target(inv: Inventory, among: Sequence[int], base: FP.Spec, model: str | None, extra: Sequence[str] | None,
            image: str | None, served_name: str | None, dp: int | None | bool) -> FP.Spec:
    """What the replicas change to: the options over what they serve now (`base`); a pool's model to
    its models: entry (its source, LoRA flags and args, its name), the image given or kept."""
    if inv.models:
        m = inv.model_of(among[0])
        return FP.Spec(m.source, (*FP.lora_flags(m), *m.args), image or base.image or inv.cluster.image, m.name)
    return FP.Spec(model or base.model, tuple(extra) if extra is not None else base.extra,
                   image or base.image or inv.cluster.image,
                   served_name if served_name is not None else base.served_name, base.dp if dp is False else dp)


def _plan(sess: Session, inv: Inventory, target: FP.Spec) -> FP.FleetPlan:
    """The fleet's plan with the target spec (inv: with the target's image): every replica's launch,
    of which the rollout starts those it replaces (a pool's: each model's own, from models:)."""
    if inv.models:
        splits, _ = _pool_split(sess, inv, target.image)
        return FP.plan_fleet(inv, FP.pool_specs(inv, target.image), splits, **_node_facts(sess, inv))
    split, _ = _split(sess, inv, target.model, None, None, target.extra, target.dp, target.image)
    return FP.plan_fleet(inv, target, split, **_node_facts(sess, inv))


def pool_groups(inv: Inventory, model: str | None) -> list[int]:
    """The replica groups of a pool's model (face.check_rollout has checked the name)."""
    return FP.pool_model(inv, model)[1]


def _others_serving(sess: Session, inv: Inventory, batch: Sequence[int],
                    step: Callable[[int, str], None], among: Sequence[int] | None = None) -> list[int]:
    """The replicas outside `batch` that serve now, as they and the router see them (healthy, in
    the rotation, the router's circuit for them closed). A replica whose circuit is open (it failed
    requests, say it was restarted a moment ago) is waited for, up to the breaker's timeout: taking
    the batch out before that leaves the router no replica to send a request to."""
    deadline = time.monotonic() + FRT.CB_TIMEOUT + 3 * inv.cluster.router.health_interval + 10
    said = False
    while True:
        reps: list[ReplicaState] = [r for r in fleet_state(sess).replicas
                                    if r.index not in batch and (among is None or r.index in among)]
        ready = [r.index for r in reps if r.health == "healthy" and r.in_rotation is not False
                 and r.router_available is not False]
        held = [r.index for r in reps if r.health == "healthy" and r.in_rotation and r.router_available is False]
        if ready or not held or time.monotonic() > deadline:
            return ready
        if not said:
            step(batch[0], f"waiting: the router holds replica {', '.join(map(str, held))} out (circuit open after "
                           f"failed requests, or its health checks); it tries again within {FRT.CB_TIMEOUT}s")
            said = True
        time.sleep(1.0)


def _replace_batch(sess: Session, inv: Inventory, rps: list[FP.ReplicaPlan], drain: float, wait: float,
                   step: Callable[[int, str], None], steps: dict) -> GroupResult:
    """Replace these replicas; {index: None or the error}. One replica runs in this thread, so that
    Ctrl-C stops it where it is and the caller rolls it back."""
    if len(rps) == 1:
        try:
            _replace(sess, inv, rps[0], drain, wait, step, steps)
            return GroupResult({rps[0].index: None})
        except BootstrapError as exc:
            return GroupResult({rps[0].index: exc})
    return fan_out(rps, lambda rp: _replace(sess, inv, rp, drain, wait, step, steps), key=lambda rp: rp.index,
                   parallel=len(rps))


def _with_image(inv: Inventory, image: str) -> Inventory:
    from dataclasses import replace
    return replace(inv, cluster=replace(inv.cluster, image=image))


def replace_one(sess: Session, inv: Inventory, rp: FP.ReplicaPlan, drain: float, wait: float,
                step: Callable[[int, str], None]) -> None:
    """Replace one replica as a rollout does (`serve` converging a pool): ReplicaFailed, rolled back,
    when the new one does not serve."""
    _replace(sess, inv, rp, drain, wait, step, {})


def _replace(sess: Session, inv: Inventory, rp: FP.ReplicaPlan, drain: float, wait: float,
             step: Callable[[int, str], None], steps: dict) -> None:
    k = rp.index
    hosts = list(inv.replicas[k])
    timing: dict[str, float] = {}
    steps[k] = timing
    t = time.monotonic()
    step(k, "out of the router")
    try:
        d = take_out(sess, inv, rp.url, drain, k=k, on_out=lambda: step(k, "draining"))
    except NotOut as e:
        raise RolloutFailed(f"the router did not take replica {k} out: {e.answer}", {}) from None
    timing["drain"] = time.monotonic() - t
    step(k, f"drained ({d.get('why', '?')})")
    t = time.monotonic()
    sname, oname = FN.serve_name(inv), FN.old_name(inv)
    # Renamed first: the keeper restarts only containers under the serving name. The head (the API
    # server) is stopped first and alone: its vLLM finishes what is still in flight (member.py's
    # --shutdown-timeout) while the other members, whose GPUs those requests need, are still there.
    sb, sbold = FN.standby_name(inv), FN.standby_old_name(inv)
    # the standbys too: they serve the old spec (the keeper would not take over with them anyway)
    sess.stage(f"retire-r{k}", hosts, lambda h: (DK.rm(sess.ssh[h.name], oname, sbold),
                                                DK.rename(sess.ssh[h.name], sname, oname),
                                                DK.rename_if_present(sess.ssh[h.name], sb, sbold)))
    sess.stage(f"stop-r{k}", hosts[:1], lambda h: _stop(sess, h, oname))
    if hosts[1:]:
        sess.stage(f"stop-r{k}-members", hosts[1:], lambda h: _stop(sess, h, oname))
    timing["stop"] = time.monotonic() - t
    t = time.monotonic()
    step(k, "starting the new spec")
    _start_replica(sess, inv, rp, stage=f"start-r{k}")
    ready = _gate(sess, inv, k, wait)
    timing["start"] = time.monotonic() - t
    if not ready.get("ready"):
        cause, tail = _replica_failure(sess, inv, k, ready)
        raise ReplicaFailed(cause, _roll_back(sess, inv, k, wait, step), tail)
    back = back_in_router(sess, inv, k)
    if not back.get("ok"):
        raise RolloutFailed(f"the router did not take replica {k} back: {back}", {})
    where = (f"kept out of the router: {', '.join(back['drained'])} drained" if back.get("drained") else
             "back in the router")
    step(k, f"serving the new spec, {where} ({ready.get('t', 0):.0f}s to serve)")
    _rm(sess, hosts, oname, sbold, stage=f"clean-r{k}")
    _start_standbys(sess, inv, [rp], stage=f"standby-r{k}")


def _roll_back(sess: Session, inv: Inventory, k: int, wait: float, step: Callable[[int, str], None]) -> str:
    """Put replica k's old containers back (kept stopped under the old name) and into the router."""
    hosts = list(inv.replicas[k])
    sname, oname = FN.serve_name(inv), FN.old_name(inv)
    if not all(_inspect(sess, h, oname) for h in hosts):
        if not all(_inspect(sess, h, sname) for h in hosts):
            return "down: nothing to roll back to"
        back = back_in_router(sess, inv, k)  # it may have left the router already
        return "old (left as it was)" if back.get("ok") else "old (left as it was, not in the router)"
    step(k, "rolling back")
    sb, sbold = FN.standby_name(inv), FN.standby_old_name(inv)
    sess.stage(f"rollback-r{k}", hosts, lambda h: (DK.rm(sess.ssh[h.name], sname, sb),
                                                  DK.rename(sess.ssh[h.name], oname, sname),
                                                  DK.rename_if_present(sess.ssh[h.name], sbold, sb),
                                                  N.of(sess, h, sname).start()))
    ready = _gate(sess, inv, k, wait)
    if not ready.get("ready"):
        return f"down: the old spec did not serve again ({ready.get('error')})"
    back = back_in_router(sess, inv, k)
    step(k, "rolled back, serving the old spec")
    return "old (rolled back)" if back.get("ok") else "old (rolled back, not in the router)"
