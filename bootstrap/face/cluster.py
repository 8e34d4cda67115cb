"""The library face's cluster commands: load an inventory, plan, up, status, exec, down, for one cluster or a fleet.

Each function takes an inventory (loaded, or the path of one), decides single cluster vs fleet
(cluster.replicas) and returns a result object of face/results.py; progress goes to `reporter`.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import replace

from bootstrap.cluster import plan as PL
from bootstrap.cluster import run as A
from bootstrap.errors import BootstrapError, InventoryError, InventoryErrors, UsageError
from bootstrap.face import results as R
from bootstrap.fleet.plan import pool_problems
from bootstrap.inventory import Inventory
from bootstrap.inventory import load_inventory as _load
from bootstrap.model import kv_events_on
from bootstrap.remote.fanout import DEFAULT_PARALLEL


def load_inventory(path, *, check_files: bool = True, require_secrets: bool = True,
                   accept_new_host_keys: bool = False, collect: bool = False,
                   become_password: str | None = None) -> Inventory:
    """The inventory at `path`, loaded and validated (inventory.load_inventory); accept_new_host_keys:
    its SSH settings trust host keys not yet known; become_password: sudo's password where the SSH user is
    not root (a host's own in the inventory wins); collect: every field error at once (InventoryErrors)."""
    inv = _load(path, check_files=check_files, require_secrets=require_secrets, collect=collect)
    pool = pool_problems(inv)
    if pool:
        raise InventoryErrors(pool) if collect else pool[0]
    if accept_new_host_keys:
        inv = replace(inv, cluster=replace(inv.cluster, ssh=replace(inv.cluster.ssh, accept_new_host_keys=True)))
    if become_password is not None:
        inv = replace(inv, cluster=replace(inv.cluster, ssh=replace(inv.cluster.ssh, become_password=become_password)))
    return inv


def inventory(inv, **load) -> Inventory:
    """`inv` when it is an Inventory, else the one at that path (load_inventory's options in `load`)."""
    if isinstance(inv, (str, os.PathLike)):
        return load_inventory(inv, **load)
    return inv


def fleet(inv) -> bool:
    """Whether the inventory is a fleet (cluster.replicas > 1): the one place the face routes on it."""
    return inv.cluster.replicas > 1


def validate(path, *, offline: bool = False) -> R.ValidateResult:
    """`validate`, a linter's run: every field error of the file at once, no host contacted; offline:
    the file alone (not the key files nor the secrets' values, which live on the machine that runs `up`)."""
    try:  # the file's rules, then the pool's (pool_problems) on a file that passed them
        inv = load_inventory(path, check_files=not offline, require_secrets=not offline, collect=True)
    except InventoryErrors as exc:
        return R.ValidateResult(str(path), None, exc.errors, offline)
    except InventoryError as exc:
        return R.ValidateResult(str(path), None, [exc], offline)
    return R.ValidateResult(str(path), inv, [], offline, tuple(_unnamed_sources(inv)))


def _unnamed_sources(inv: Inventory):
    """A pool's model without `source:` whose name is no Hugging Face org/name nor a path: vLLM will load the
    name itself as a model id, which is right for `gpt2` and a late download failure for `chat`."""
    for m in inv.models:
        if m.line_of("source") is None and "/" not in m.name:
            yield (f"{m.where}: no source: vLLM loads {m.name!r} itself as the model (a Hugging Face id); if it is "
                   "only the name clients send, say what to load with source: (org/name or /path)")


def sudoers(inv, user: str | None = None, nopasswd: bool = False) -> str:
    """`sudoers`: the sudoers snippet that lets the SSH user run exactly this cluster's root commands
    (guard.sudoers); from the inventory alone. Without `user`: every host's SSH user that is not root."""
    from bootstrap.cluster.guard import sudoers as SU

    inv = inventory(inv, check_files=False, require_secrets=False)
    if user is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", user):
        raise UsageError(f"--user: {user!r} is not a user name (letters, digits, _ . -; 32 at most)")
    users = [user] if user else sorted({h.ssh.user for h in inv.hosts if h.ssh.user and h.ssh.user != "root"})
    if not users:
        unnamed = [h.name for h in inv.hosts if not h.ssh.user]
        raise UsageError(f"--user: hosts {', '.join(unnamed)} name no SSH user (ssh's config decides): name the one "
                         "sudo is for" if unnamed else "--user: every host is reached as root, which needs no sudo "
                         "rule; name the user that will log in instead")
    return SU.snippet(inv, users, nopasswd=nopasswd)


def plan(inv) -> R.PlanResult | R.FleetPlanResult:
    """`plan`: each host's container from the inventory alone (with replicas: each replica's, the routers
    and the keeper); nothing is contacted."""
    inv = inventory(inv, check_files=False)
    if not fleet(inv):
        rt = inv.cluster.runtime
        return R.PlanResult(PL.plan_offline(inv), rt, f"cluster.runtime: {rt}" if rt else PL.UNDECIDED_NOTE)
    from bootstrap.fleet import kvevents as KV
    from bootstrap.fleet import names as FN
    from bootstrap.fleet import plan as FP
    from bootstrap.fleet import routers as FRT

    n = inv.cluster.replicas
    urls = [FN.replica_url(inv, k) for k in range(n)]
    groups = [PL.plan_offline(FP.replica_inventory(inv, k)) for k in range(n)]
    ifaces = {h.name: f"<the interface of {h.ip}>" for h in FN.router_hosts(inv)}
    # kv_aware subscribes to what the replicas serve, which `serve MODEL` names: a stand-in here
    kv = KV.of(inv, "<the model serve is given>", None, ()) if kv_events_on(inv) else None
    return R.FleetPlanResult(list(zip(urls, groups)), FRT.plan_routers(inv, urls, ifaces=ifaces, kv=kv),
                             FN.router_url(inv),
                             FRT.keeper_create_argv(inv), FN.standby_name(inv) if inv.cluster.standby else None,
                             inv.cluster.runtime, [{"model": m.name, "source": m.source} for m in
                                                   (inv.model_of(k) for k in range(n)) if m is not None],
                             [h.name for h in inv.idle])


def up(inv, *, reporter=None, on_replica=None, on_result=None, dry_run: bool = False, **opts) -> list[R.UpResult]:
    """`up`: the cluster (cluster.run.up), or every replica group of a fleet at once. on_replica(k, hosts)
    for each replica before any starts; on_result(UpResult) as each group is done (a fleet's, as each finishes)."""
    inv = inventory(inv)
    done: list[R.UpResult] = []

    def group_done(res: R.UpResult) -> None:
        done.append(res)
        if on_result is not None:
            on_result(res)
    if fleet(inv):
        # Each replica is a serving group of its own: its own head and Ray cluster.
        from bootstrap.fleet import lifecycle as FLC

        FLC.up_fleet(inv, reporter=reporter, dry_run=dry_run,
                     on_replica=None if on_replica is None else (lambda k, group: on_replica(k, inv.replicas[k])),
                     on_done=lambda r: group_done(R.UpResult(r.inv, r.result, f" replica {r.index}", r.seconds,
                                                             r.started_at, dry_run)),
                     **opts)
        return done
    t0 = time.monotonic()
    started_at = time.time()
    res = A.up(inv, reporter=reporter, dry_run=dry_run, **opts)
    group_done(R.UpResult(inv, res, "", time.monotonic() - t0, started_at, dry_run))
    return done


def status(inv, *, parallel: int = DEFAULT_PARALLEL, exposure: bool = False, prometheus: bool = True,
           reporter=None) -> R.StatusResult | R.FleetStatusResult | R.ExposureResult:
    """`status`: each node and what is served (with replicas: each group, then the fleet as the router
    sees it), with the Prometheus line unless prometheus=False; exposure: instead every listening socket."""
    inv = inventory(inv)
    if exposure:
        from bootstrap.cluster.guard import run as GD

        return R.ExposureResult(inv, GD.exposure_report(inv, parallel=parallel, reporter=reporter))
    if fleet(inv):
        from bootstrap.fleet import lifecycle as FLC

        st = FLC.fleet_status(inv, parallel=parallel)
        return R.FleetStatusResult(inv, st.groups, st.fleet, st.ok, _prometheus(inv) if prometheus else None)
    from bootstrap.serve.state import serving_state

    st = A.cluster_status(inv, parallel=parallel, serving=serving_state)
    return R.StatusResult(inv, st, _prometheus(inv) if prometheus else None)


def _prometheus(inv) -> R.Prometheus:
    """Whether Prometheus runs, and where; unknown when the monitor host or its Docker does not answer."""
    from bootstrap.monitor import plan as MP
    from bootstrap.monitor import run as MON

    try:
        url = MON.running_url(inv)
    except BootstrapError as exc:  # unknown, not "not running"
        return R.Prometheus(unknown=exc)
    return R.Prometheus(url, MP.monitor_host(inv) if url else None, inv.cluster.monitor.port)


def exec_all(inv, command, *, hosts=None, echo=None, **opts) -> R.ExecResult:
    """`exec`: COMMAND on every host (or `hosts`) at once; echo(width) gives the on_result that shows
    each host's output as it finishes (width: the longest name of the hosts chosen)."""
    from bootstrap.cluster import exec as E

    inv = inventory(inv)
    try:
        width = max(len(h.name) for h in E.select_hosts(inv, hosts))
    except UsageError as exc:
        raise R.OptionError(str(exc), "--limit") from None
    return R.ExecResult(E.exec_all(inv, command, hosts=hosts, on_result=None if echo is None else echo(width),
                                   **opts))


def down_preview(inv) -> str:
    """What `down` removes, in one sentence from the inventory alone (no host contacted): what the
    confirmation shows, so that a stale -i or $BOOTSTRAP_INVENTORY is seen before anything goes."""
    inv = inventory(inv)
    c = inv.cluster
    hosts = ", ".join(h.name if h.ssh.address == h.name else f"{h.name} ({h.ssh.address})" for h in inv.hosts[:6])
    more = f" and {len(inv.hosts) - 6} more" if len(inv.hosts) > 6 else ""
    what = (f"the fleet {c.name!r} ({c.replicas} replicas, the router and whatever they serve)" if fleet(inv)
            else f"the cluster {c.name!r} (its containers and whatever they serve)")
    return f"down removes {what} from {len(inv.hosts)} host(s): {hosts}{more}; inventory {inv.path}"


def stop_model_groups(inv, model: str) -> list[int]:
    """The replica groups of the pool's model `model` (serve --stop --model); OptionError naming the
    models there are."""
    from bootstrap.errors import FleetError
    from bootstrap.fleet import plan as FP

    try:
        return FP.pool_model(inventory(inv), model)[1]
    except FleetError as exc:
        raise R.OptionError(f"--model: {exc}") from None


def stop_preview(inv, model: str | None = None) -> str:
    """What `serve --stop` (--model: that model of a pool) stops, in one sentence from the inventory
    alone (no host contacted)."""
    inv = inventory(inv)
    c = inv.cluster
    if model is not None:
        ks = stop_model_groups(inv, model)
        hosts = ", ".join(h.name for k in ks for h in inv.replicas[k])
        return (f"serve --stop stops {model}'s {len(ks)} replica{'s' if len(ks) > 1 else ''} ({hosts}) of the pool "
                f"{c.name!r}; the other models serve on; inventory {inv.path}")
    if fleet(inv):
        models = f" ({', '.join(m.name for m in inv.models)})" if inv.models else ""
        what = f"every replica{models} and the router of the fleet {c.name!r} ({len(inv.hosts)} hosts)"
    else:
        what = f"vLLM on the cluster {c.name!r} (head {inv.head.name}; Ray keeps running)"
    return f"serve --stop stops {what}; inventory {inv.path}"


def down(inv, *, parallel: int = DEFAULT_PARALLEL, reporter=None, lock_wait: float = 0.0,
         drain: float = 120.0) -> R.DownResult:
    """`down`: Ray and the container off every host; with replicas first the fleet's own containers,
    each replica out of the routers and its requests finished first (drain: seconds at most)."""
    inv = inventory(inv)
    if fleet(inv):
        from bootstrap.fleet import lifecycle as FLC

        res = FLC.down_fleet(inv, parallel=parallel, reporter=reporter, lock_wait=lock_wait, drain=drain)
        return R.DownResult(list(res.replicas), res.fleet_removed)
    return R.DownResult([A.down(inv, parallel=parallel, reporter=reporter, lock_wait=lock_wait)])
