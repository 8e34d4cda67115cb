"""The library face's checks: check-nccl, check-kv, doctor and logs, each one call returning a result object.
"""
from __future__ import annotations

import time

from bootstrap.errors import UsageError
from bootstrap.face import results as R
from bootstrap.face.cluster import inventory
from bootstrap.remote.fanout import DEFAULT_PARALLEL


def check_nccl(inv, **opts) -> R.NcclResult:
    """`check-nccl`: an all-reduce over every GPU of every node, verified and timed (nccl.run.check_nccl)."""
    from bootstrap.nccl import run as X

    return R.NcclResult(X.check_nccl(inventory(inv), **opts))


def check_kv(inv, *, port: int | None = None, parallel: int = DEFAULT_PARALLEL, reporter=None) -> R.KvCheckResult:
    """`check-kv`: each decode node reads each prefill node's KV buffer over NIXL (fleet.run.check_kv)."""
    from bootstrap.fleet import run as FL

    inv = inventory(inv)
    return R.KvCheckResult(FL.check_kv(inv, port=port, parallel=parallel, reporter=reporter), inv.cluster.infiniband)


def doctor(inv, *, parallel: int = DEFAULT_PARALLEL) -> R.DoctorResult:
    """`doctor`: preflight, cluster and log checks, each finding with its fix."""
    from bootstrap.doctor import run as X

    inv = inventory(inv)
    return R.DoctorResult(inv, X.doctor(inv, parallel=parallel))


def model_hosts(inv, model: str, names=()) -> tuple[str, ...]:
    """The hosts of a pool model's replicas (among `names` when given): `logs --model`; what it
    refuses is an OptionError naming --model."""
    from bootstrap.errors import FleetError
    from bootstrap.fleet import plan as FP

    inv = inventory(inv)
    if not inv.models:
        raise R.OptionError(f"--model: {inv.path} has no models: section; name the hosts instead")
    try:
        _, groups = FP.pool_model(inv, model)
    except FleetError as exc:
        raise R.OptionError(f"--model: {exc}") from None
    hosts = tuple(h.name for k in groups for h in inv.replicas[k])
    if names:
        outside = [n for n in names if n not in hosts]  # each host named is shown, or the command is refused
        if outside:
            raise R.OptionError(f"--model: {', '.join(outside)} {'serves' if len(outside) == 1 else 'serve'} no "
                                f"replica of {model} (its hosts: {', '.join(hosts)}); name its hosts or leave out "
                                "--model")
        return tuple(n for n in hosts if n in set(names))
    return hosts


def logs(inv, emit, *, hosts=(), groups=(), since: str | None = None, stop=None, **opts) -> R.LogsResult:
    """`logs`: every log chosen (groups: node, serve, router, monitor; none: all) to emit(source, line);
    since: a duration back from now or a UTC time. Ctrl-C while following sets `stop` and ends it."""
    from bootstrap.doctor import logsources as LS
    from bootstrap.doctor import run as X

    inv = inventory(inv)
    try:
        start = LS.parse_since(since, time.time()) if since is not None else None
    except UsageError as exc:
        raise R.OptionError(str(exc), "--since") from None
    try:
        res = X.logs(inv, emit, hosts=hosts, sources=LS.sources_for(groups), since=start, stop=stop, **opts)
    except KeyboardInterrupt:
        if stop is not None:
            stop.set()
        return R.LogsResult(None, bool(groups))
    return R.LogsResult(res, bool(groups))
