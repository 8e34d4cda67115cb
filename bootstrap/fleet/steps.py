"""The fleet's remote steps, each written once: its containers, their probes, the replicas' gate and split (SSH).

serve_fleet (fleet/run.py) and rollout (fleet/rollout.py) both run these; the decisions are in
fleet/plan.py, the serving mode in serve/mode.py.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

from bootstrap import signatures as D
from bootstrap.cluster import facts as F
from bootstrap.cluster import plan as PL
from bootstrap.cluster import probe
from bootstrap.errors import (
    CommandFailed,
    ConnectionLost,
    FleetError,
    ModelSplitError,
    PreflightFailed,
    ServeFailed,
    ServePlanError,
)
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.model import Host, Inventory
from bootstrap.remote import argv as RA
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.fanout import fan_out
from bootstrap.remote.session import Session, check_script
from bootstrap.serve import experts as EX
from bootstrap.serve import flags as FG
from bootstrap.serve import mode as M
from bootstrap.serve import modelref as MR
from bootstrap.serve import split as SP
from bootstrap.serve import watch as W

#: serve's processes inside the node containers (a single-replica serve) hold the vLLM port.
from bootstrap.serve.state import check_extra_in_image, read_model_info


def _create_started(sess: Session, host: Host, create: Sequence[str], name: str, path: str, script: str) -> None:
    """`docker create`, copy a payload in (it stays across restarts), `docker start`. The secrets it
    mounts were put on the host first (guard.put_secrets)."""
    _create_with(sess, host, create, name, {path: check_script(script)})


def _create_with(sess: Session, host: Host, create: Sequence[str], name: str, files: dict[str, bytes]) -> None:
    s = sess.ssh[host.name]
    DK.rm(s, name)
    s.run(tuple(create), timeout=120)
    for path, data in files.items():
        DK.copy_file_in(s, name, path, data)
    DK.start(s, name)


def _probe(sess: Session, host: Host, container: str, args: Sequence[str], timeout: float) -> dict:
    reply = N.of(sess, host, container).ask("fleet_probe.py", *args, timeout=timeout)
    r, doc = reply.result, reply.answer_or_error()
    if doc.get("ready") is False and "error" in doc and not r.stdout.strip():
        doc["error"] = (r.stderr or "no answer").strip()[-300:]
    return doc


def _inspect(sess: Session, host: Host, name: str) -> F.ContainerState | None:
    return N.of(sess, host, name).inspect()


def _logs(sess: Session, host: Host, name: str, tail: int = 200) -> str:
    return N.of(sess, host, name).logs(tail)


def _rm(sess: Session, hosts: Sequence[Host], *names: str, stage: str = "remove") -> None:
    """`docker rm -f` on every host: absent is fine, any other failure is a GroupError naming the host."""
    sess.stage(stage, hosts, lambda h: DK.rm(sess.ssh[h.name], *names, timeout=120))


def _stop(sess: Session, host: Host, name: str) -> None:
    """Stop on purpose: SIGTERM (vLLM finishes in-flight work), kill after the grace."""
    DK.stop(sess.ssh[host.name], name, FN.STOP_GRACE + 10, timeout=FN.STOP_GRACE + 60)


def _router_call(sess: Session, inv: Inventory, verb: str, url: str) -> dict:
    """Add or remove a replica on every router; an added one counts once each router would send it
    requests (its own health view healthy, its circuit breaker closed): taking the next replica out
    before that leaves a router none. {"ok": every router did, HOST: each one's answer}."""
    def one(h: Host) -> dict:
        args = [verb, FN.router_url(inv, h), url]
        if verb == "add":
            wait = max(30, 4 * inv.cluster.router.health_interval + 10)
            args += [FN.http_url(h.ip, inv.cluster.router.metrics_port) + "/metrics", str(wait)]
        return _probe(sess, h, FN.router_name(inv), args, timeout=120)
    hosts = FN.router_hosts(inv)
    res = fan_out(hosts, one, key=lambda h: h.name, parallel=len(hosts))
    out: dict = {h: (r if isinstance(r, dict) else {"ok": False, "error": str(r)})
                 for h, r in {**res.succeeded, **res.failed}.items()}
    return {"ok": all(v.get("ok") for v in out.values()), **out}


def _in_router(sess: Session, inv: Inventory, k: int, add: bool) -> dict:
    """Replica k into (add) or out of every router: _router_call; in a pool (vllm-router's multi-model
    mode, where /add_worker would name it by its first model only) _route, under its model's name and
    the inventory's adapters, or under none. {"ok": every router did, HOST: ...}."""
    m = inv.model_of(k)
    if m is None:
        return _router_call(sess, inv, "add" if add else "remove", FN.replica_url(inv, k))
    return _route(sess, inv, k, [m.name, *(a for a, _ in m.adapters)] if add else [])


def _route(sess: Session, inv: Inventory, k: int, names: list[str]) -> dict:
    """Every router of a pool routes replica k under exactly `names` (fleet_probe.py's `route`), with its
    model's policy. {"ok": every router did, HOST: its answer}."""
    return _route_url(sess, inv, FN.replica_url(inv, k), FRT.model_policy(inv, inv.model_of(k)), names)


def _route_url(sess: Session, inv: Inventory, url: str, policy: str, names: list[str]) -> dict:
    """Every router of a pool routes URL under exactly `names` (none: out of every router)."""
    hosts = FN.router_hosts(inv)
    res = fan_out(hosts, lambda h: _probe(sess, h, FN.router_name(inv), ["route", FN.router_url(inv, h), url, policy,
                                                                          *names], timeout=120),
                  key=lambda h: h.name, parallel=len(hosts))
    out: dict = {h: (r if isinstance(r, dict) else {"ok": False, "error": str(r)})
                 for h, r in {**res.succeeded, **res.failed}.items()}
    return {"ok": all(v.get("ok") for v in out.values()), **out}


def rewrite_workers(sess: Session, inv: Inventory, replaced: dict[str, list[dict]]) -> None:
    """Each pool router's workers file (routers.WORKERS_PATH) with the entries of the replicas in
    `replaced` (url -> their entries now; [] drops them) put in place, the others' as the file held
    them: a router restarted later adds what the routers were just told."""
    urls = [FN.replica_url(inv, k) for k in range(len(inv.replicas))]
    name = FN.router_name(inv)

    def rewrite(h: Host) -> None:
        ssh = sess.ssh[h.name]
        now = ssh.run(DK.exec_argv(name, "cat", FRT.WORKERS_PATH), timeout=30, check=False)
        DK.copy_file_in(ssh, name, FRT.WORKERS_PATH,
                        FRT.rewritten_workers(now.stdout.encode() if now.exit_code == 0 else None, inv, urls, replaced))
    sess.stage("router-workers", list(FN.router_hosts(inv)), rewrite)


def stop_vip(sess: Session, host: Host) -> None:
    """Stop keepalived (SIGTERM, 10 s): it gives the floating address up and its entry removes the
    forwarding; `docker rm -f` alone would leave both on the host."""
    DK.stop(sess.ssh[host.name], FN.vip_name(sess.inv), 10, timeout=60)


def _rm_routers(sess: Session, inv: Inventory, stage: str) -> None:
    """Remove the routers and keepalived: keepalived stopped first, so that it gives the floating
    address up and its entry removes the forwarding (a kill would leave both on the host)."""
    if inv.cluster.router.vip is not None:
        sess.stage(f"{stage}-vip", list(FN.router_hosts(inv)), lambda h: stop_vip(sess, h))
    _rm(sess, inv.hosts, FN.router_name(inv), FN.vip_name(inv), stage=stage)


# -- drained hosts (bootstrap drain HOST): a labelled Docker volume on the host is the mark --------------
def drain_mark(inv: Inventory) -> str:
    """The name of the Docker volume whose presence on a host says it is drained."""
    return PL.drain_mark_volume(inv)


def is_drained(sess: Session, host: Host) -> bool:
    """Whether `bootstrap drain` marked this host (and no `undrain` since); CommandFailed when its
    Docker does not answer (never read as "not drained")."""
    r = sess.ssh[host.name].run(("docker", "volume", "inspect", "--format", "{{.Name}}", drain_mark(sess.inv)),
                                timeout=30, check=False)
    if r.ok:
        return True
    if DK.absent_only(r):
        return False
    raise CommandFailed(host.name, "docker volume inspect", r.exit_code, r.stderr or r.stdout)


def set_drained(sess: Session, host: Host, drained: bool) -> None:
    """Mark the host drained (a volume labelled with the cluster, so that `down` removes it) or not."""
    ssh = sess.ssh[host.name]
    if drained:
        ssh.run(("docker", "volume", "create", "--label", f"{PL.LABEL_CLUSTER}={sess.inv.cluster.name}",
                 drain_mark(sess.inv)), timeout=60)
    else:
        DK.volume_rm(ssh, drain_mark(sess.inv))


def drained_hosts(sess: Session, hosts: Sequence[Host]) -> list[str]:
    """Which of these hosts are drained (read on each at once)."""
    got = sess.stage("drained", list(hosts), lambda h: is_drained(sess, h))
    return [h.name for h in hosts if got.get(h.name)]


def back_in_router(sess: Session, inv: Inventory, k: int) -> dict:
    """Replica k into every router (_in_router), unless a host of it is drained: then it stays out
    ({"ok": True, "drained": [hosts]}) until `bootstrap undrain`."""
    drained = drained_hosts(sess, inv.replicas[k])
    if drained:
        return {"ok": True, "drained": drained}
    return _in_router(sess, inv, k, True)


class NotOut(Exception):
    """take_out: a router did not take the replica out; .answer: every router's answer."""

    def __init__(self, answer: dict):
        super().__init__(str(answer))
        self.answer = answer


def take_out(sess: Session, inv: Inventory, url: str, timeout: float, *, k: int | None = None,
             on_out: Callable[[], None] | None = None) -> dict:
    """A replica out of every router, then its engines idle (no request running or waiting, 2 s on end)
    or the timeout: the drain probe's answer. k: the replica of the inventory (asked from its head's serve
    container); None: a pool's URL the plan no longer holds (out under no name, asked from the first
    router's container). NotOut where a router did not take it out; on_out() once every router did."""
    if k is None:
        out = _route_url(sess, inv, url, inv.cluster.router.policy, [])
        where, container = FN.router_hosts(inv)[0], FN.router_name(inv)
    else:
        out = _in_router(sess, inv, k, False)
        where, container = inv.replicas[k][0], FN.serve_name(inv)
    if not out.get("ok"):
        raise NotOut(out)
    if on_out is not None:
        on_out()
    return _probe(sess, where, container, ["drain", url, str(timeout)], timeout=timeout + 60)


def drain_out(sess: Session, inv: Inventory, hosts: Sequence[Host], timeout: float) -> dict[int, dict]:
    """Before `down` or `serve --stop` removes the serve containers: every replica (whose head is among
    `hosts`) out of every router, then each one's engines idle (no request running or waiting, 2 s on
    end) or the timeout, all at once. Best effort: a router or a replica that does not answer has
    nothing to wait for, and never stops the removal. {replica: the drain probe's answer, or the error}."""
    live = {h.name for h in hosts}
    ks = [k for k, group in enumerate(inv.replicas) if group[0].name in live]
    if not ks or timeout <= 0:
        return {}
    sess.stage("out-of-routers", [inv.replicas[k][0] for k in ks],
               lambda h: _in_router(sess, inv, _head_of(inv, h), False), strict=False)
    got = sess.stage("drain", [inv.replicas[k][0] for k in ks], lambda h: _probe(
        sess, h, FN.serve_name(inv), ["drain", FN.replica_url(inv, _head_of(inv, h)), str(timeout)],
        timeout=timeout + 60), strict=False)
    return {_head_of(inv, inv.host(name)): (r if isinstance(r, dict) else {"drained": None, "error": str(r)})
            for name, r in got.items()}


def _head_of(inv: Inventory, h: Host) -> int:
    return next(k for k, group in enumerate(inv.replicas) if group[0].name == h.name)


def start_routers(sess: Session, inv: Inventory, launches: dict[str, FRT.RouterLaunch]) -> dict:
    """Start the router on each router host (launches: host name -> its launch), then check a
    completion through each (every model of a pool); the last probe's answer, or ServeFailed with the
    router's log. A pool's router is created, its entry and workers file copied in, then started
    (checks/router_entry.py adds the workers)."""
    rhosts = list(FN.router_hosts(inv))
    if inv.models:
        sess.stage("router", rhosts, lambda h: _create_with(sess, h, launches[h.name].run, FN.router_name(inv), {
            FRT.ROUTER_ENTRY_PATH: check_script("router_entry.py"), FRT.WORKERS_PATH: launches[h.name].workers}))
    else:
        sess.stage("router", rhosts, lambda h: sess.ssh[h.name].run(launches[h.name].run, timeout=120))
    throughs = fan_out(rhosts, lambda h: _probe(sess, h, FN.router_name(inv),
                                                ["ready", FN.router_url(inv, h), "120"], timeout=240),
                       key=lambda h: h.name, parallel=len(rhosts))
    through: dict = {}
    for h in rhosts:
        through = throughs.succeeded.get(h.name) or {"error": str(throughs.failed.get(h.name))}
        if not through.get("ready"):
            tail = _logs(sess, h, FN.router_name(inv), 30)
            raise ServeFailed(f"the router on {h.name} did not answer a completion: {through.get('error')}", tail)
    return through


def _check_vip_image(sess: Session, inv: Inventory, image: str) -> None:
    """Refuse a floating address whose image lacks what keepalived's container runs, before any change."""
    vip = inv.cluster.router.vip
    if vip is None:
        return
    img = vip.image or image
    h = FN.router_hosts(inv)[0]
    r = sess.ssh[h.name].run(RA.sh_in_image_argv(img, "for t in keepalived iptables curl; do command -v $t "
                                                      ">/dev/null || echo $t; done"), timeout=300, check=False)
    if not r.ok:
        raise PreflightFailed(h.name, f"could not run the floating address's image {img}: "
                              f"{(r.stderr or r.stdout).strip()[-300:]}")
    missing = r.stdout.split()
    if missing:
        raise PreflightFailed(h.name, f"the image {img} has no {', '.join(missing)}, which keepalived's container "
                              "runs (cluster.router.vip)", "install them in the image (Debian: apt-get install "
                              "keepalived iptables curl), or set cluster.router.vip.image to one that has them")


def _preflight(sess: Session, inv: Inventory) -> None:
    name = inv.cluster.container_name
    states = sess.stage("inspect", inv.hosts, lambda h: _inspect(sess, h, name))
    down = [h.name for h in inv.hosts if not (states.get(h.name) and states[h.name].running)]
    if down:
        raise PreflightFailed(", ".join(down), "the cluster container is not running", "run `bootstrap up` first")


def _split(sess: Session, inv: Inventory, model: str, tp: int | None, pp: int | None,
           extra: Sequence[str], dp: int | None = None,
           image: str | None = None) -> tuple[dict[int, SP.SplitChoice], list[str]]:
    """Each replica's split, by its number of nodes (one entry when the replicas are of one size):
    TP x PP, or with dp vLLM's data parallel engines within the replica's nodes behind its head's
    API server. --tp/--pp/--dp apply to every replica."""
    c = inv.cluster
    hosts = M.Hosts.of(inv)
    mode = M.check(hosts, M.Options(tp, pp, dp))  # serve/mode.py: the split rules, before the model is read
    info = read_model_info(sess, inv.replicas[0][0], model)
    refused = MR.refusal(model, info, inv.replicas[0][0].name)
    if refused is not None:
        raise refused
    config = info.get("config") if isinstance(info.get("config"), dict) else None
    shape = SP.model_shape(config) if config else None
    splits = {n: ch.split for n, ch in M.plan_groups(mode, hosts, M.Model(shape, config)).items()}
    notes: list[str] = []
    check_extra_in_image(sess, inv.replicas[0][0], image or c.image, extra, "native", notes, FP.plan_sets(inv))
    engine = EX.EngineCaps.from_doc(info.get("engine"))
    for split in splits.values():
        FG.check_engine_flags(c.accelerator, split.par, extra)
        FP.check_pd(inv, extra, nixl_connector=engine.nixl_connector, nixl="nixl" in engine.modules,
                    pp=split.par.pp)
    if config is None:
        notes.append(f"could not read the model's config.json ({info.get('error') or 'no answer'}): "
                     "the split is not checked against the model")
    return splits, notes


def _pool_split(sess: Session, inv: Inventory, image: str) -> tuple[list[SP.SplitChoice], list[str]]:
    """A pool's split for each replica group: each model's chosen over its own groups from its own
    config (its tp/pp as serve's --tp/--pp, its args as the words after --), in the groups' order."""
    by_model: list[dict[int, SP.SplitChoice]] = []
    notes: list[str] = []
    for mi, m in enumerate(inv.models):
        try:
            splits, more = _split(sess, FP.model_inventory(inv, mi), m.source, m.tp, m.pp, m.args, None, image)
        except (ModelSplitError, ServePlanError, FleetError) as exc:
            raise type(exc)(f"{m.where} ({m.name}): {exc}") from None
        by_model.append(splits)
        notes.extend(f"{m.name}: {n}" for n in more)
    return [by_model[mi][len(g)] for mi, g in zip(inv.placement, inv.replicas)], notes


def _node_facts(sess: Session, inv: Inventory) -> dict:
    """plan_fleet's per-host facts: nofile= (the limit to give), derived= (plan.derived_env), gpus= (plan.gpu_flags),
    ucx= (plan.ucx_env), ifaces= and nets= (each router host's interface and network) and cpus= (each
    host's CPU count)."""
    facts = probe.gather_hosts(sess, inv.hosts)
    return {"nofile": {h.name: PL.nofile_for(inv, facts.get(h.name)) for h in inv.hosts},
            "derived": {h.name: PL.derived_env(inv, h, facts.get(h.name)) for h in inv.hosts},
            "gpus": {h.name: PL.gpu_flags(facts.get(h.name)) for h in inv.hosts},
            "ucx": {h.name: PL.ucx_env(inv, h, facts.get(h.name)) for h in inv.hosts},
            "ifaces": {h.name: PL.interface_of(h, facts.get(h.name)) for h in FN.router_hosts(inv)},
            "nets": {h.name: PL.network_of(h, facts.get(h.name)) for h in FN.router_hosts(inv)},
            "cpus": {h.name: f.rack.cpus for h in inv.hosts
                     if (f := facts.get(h.name)) is not None and f.rack is not None}}


def _ensure_keeper(sess: Session, inv: Inventory) -> None:
    argv = FRT.keeper_create_argv(inv)
    sess.stage("keeper", inv.hosts, lambda h: _create_started(sess, h, argv, FN.keeper_name(inv),
                                                              FN.KEEPER_PATH, "keeper.py"))


def _start_replica(sess: Session, inv: Inventory, rp: FP.ReplicaPlan, stage: str = "start") -> None:
    hosts = [inv.host(m.host) for m in rp.members]
    by_host = {m.host: m for m in rp.members}
    sess.stage(stage, hosts, lambda h: _create_started(sess, h, by_host[h.name].create, FN.serve_name(inv),
                                                       FN.MEMBER_PATH, "member.py"))


def _start_standbys(sess: Session, inv: Inventory, rps: Sequence[FP.ReplicaPlan], stage: str = "standby") -> None:
    """Each member's standby (cluster.standby): its serve container's twin, vLLM imported and
    waiting, that the keeper puts in the place of a killed one (checks/keeper.py). Started once the
    replicas serve, so that its imports do not slow their start."""
    members = [m for rp in rps for m in rp.members if m.standby]
    if not members:
        return
    by_host = {m.host: m for m in members}
    files = {FN.MEMBER_PATH: check_script("member.py"), FN.ROLE_PATH: b"standby\n"}
    sess.stage(stage, [inv.host(h) for h in by_host],
               lambda h: _create_with(sess, h, by_host[h.name].standby, FN.standby_name(inv), files))


def _gate(sess: Session, inv: Inventory, k: int, wait: float) -> dict:
    """Wait for replica k to serve; meanwhile say what its vLLM is doing (serve/watch.py, its head's log)."""
    head = inv.replicas[k][0]
    until = time.monotonic() + wait

    def ask(seconds: float) -> dict:
        return _probe(sess, head, FN.serve_name(inv), ["ready", FN.replica_url(inv, k), f"{seconds:.0f}",
                                                        FN.EXITED_PATH], timeout=seconds + 120)
    with W.watching(lambda line: sess.reporter.event(head.name, "vllm-start", "waiting", line),
                    lambda: _logs(sess, head, FN.serve_name(inv), tail=100)):
        try:
            got = ask(wait)
        except ConnectionLost as exc:
            # The probe only reads, so it is asked once more over a new connection for the time left
            # (seen in CI: one SSH connection dropped under load halfway through a rollout's wait).
            sess.reporter.event(head.name, "vllm-start", "waiting", f"asking again: {exc.reason}")
            got = ask(max(10.0, until - time.monotonic()))
    sess.reporter.event(head.name, "vllm-start", "done" if got.get("ready") else "failed",
                        f"{wait - (until - time.monotonic()):.0f}s")
    return got


def start_gated(sess: Session, inv: Inventory, rps: Sequence[FP.ReplicaPlan], wait: float, *, own_stages: bool = False,
                after: str = "") -> dict:
    """Start these replicas (the keeper first), then wait for each to answer a completion, all at
    once: {index: its gate's answer}; ServeFailed naming the first that did not serve, its cause
    from its members' logs and the others that did not either (`after` appended: what stands)."""
    _ensure_keeper(sess, inv)
    for rp in rps:
        _start_replica(sess, inv, rp, **({"stage": f"start-r{rp.index}"} if own_stages else {}))
    ready = fan_out(rps, lambda rp: _gate(sess, inv, rp.index, wait), key=lambda rp: rp.index, parallel=len(rps))
    bad = {**ready.failed, **{k: r for k, r in ready.succeeded.items() if not r.get("ready")}}
    if bad:
        k = min(bad)
        r = bad[k]
        cause, tail = _replica_failure(sess, inv, k, r if isinstance(r, dict) else {"error": str(r)})
        others = f" (also replica {', '.join(map(str, sorted(set(bad) - {k})))})" if len(bad) > 1 else ""
        what = f"{m.name} on " if (m := inv.model_of(k)) is not None else ""
        hosts = ", ".join(h.name for h in inv.replicas[k])
        raise ServeFailed(f"replica {k} ({what}{hosts}) did not serve: {cause}{others}{after}", tail)
    return ready.succeeded


def _replica_failure(sess: Session, inv: Inventory, k: int, ready: dict) -> tuple[str, str]:
    """Why replica k did not serve: vLLM's own root cause from its members' logs, and the tail."""
    tails = {h.name: _logs(sess, h, FN.serve_name(inv)) for h in inv.replicas[k]}
    root = D.root_cause_of(tails)
    findings = D.scan_logs(tails, infiniband=inv.cluster.infiniband)
    cause = root or (findings[0].title if findings else ready.get("error") or "no answer")
    head_log = tails[inv.replicas[k][0].name]
    return cause, "\n".join(head_log.splitlines()[-30:])
