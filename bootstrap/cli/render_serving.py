"""What the serving commands print: serve's plan and result (one cluster or a fleet), rollout and bench.
"""
from __future__ import annotations

import time

from rich.table import Table

from bootstrap import face
from bootstrap.cli.show import _argv, _escape, _json, _log_tail, err, findings, kv_line, out
from bootstrap.face import docs as D
from bootstrap.face import split_label


# -- serve ---------------------------------------------------------------------------------------
def serve_plan(plan, dry_run: bool) -> None:
    """The serve plan, before anything starts: model, backend, split and why, each node's command."""
    shape = (f" ({plan.shape.describe()}; config.json from {plan.config_source})"
             if plan.shape is not None and plan.shape.known else " (config.json not read: split unchecked)")
    out.print(f"model:   {_escape(plan.model)}{_escape(shape)}")
    out.print(_escape(f"backend: {plan.backend} ({plan.backend_reason})"))
    out.print(f"split:   {_escape(plan.split.reason)}")
    if plan.fit is not None:
        out.print(f"fit:     {_escape(plan.fit.message)}")
    width = max(len(n.host) for n in plan.nodes)
    for n in plan.nodes:
        cmd = _argv(n.argv) if n.argv else "(a Ray worker: vLLM places its ranks here through Ray)"
        out.print(_escape(f"  {n.host:<{width}} {n.ip:<15} {cmd}"))
    out.print(_escape(f"endpoint: {plan.endpoint}"))
    for note in plan.notes:
        out.print(f"note: {_escape(note)}")
    if dry_run:
        if plan.secrets:
            out.print(_escape(f"a real run needs {', '.join(plan.secrets)} set in your environment (cluster.secrets)"))
        out.print("dry run: nothing was started")


def fleet_serve_plan(plan, dry_run: bool) -> None:
    """The fleet's serve plan, before anything starts: each replica's commands, the router, the endpoint."""
    pool = len(plan.models) > 1
    if pool:
        out.print(f"models:   {_escape(', '.join(plan.models))} (image {_escape(plan.spec.image)})")
    else:
        out.print(f"model:    {_escape(plan.spec.model)} (image {_escape(plan.spec.image)})")
    if plan.uniform and not pool:
        out.print(f"split:    {_escape(plan.split.reason)} on each replica (backend native)")
    for r in plan.replicas:
        spec = plan.spec_of(r)
        serves = f" serves {spec.served_name} ({spec.model})" if pool else ""
        out.print(_escape(f"replica {r.index}{f' ({r.role})' if r.role else ''}{serves}: {', '.join(r.hosts)} "
                          f"-> {r.url}"))
        if not plan.uniform or pool:
            out.print(f"  split: {_escape(plan.split_of(r).reason)} (backend native)")
        for m in r.members:
            out.print(_escape(f"  {m.host} rank {m.rank}: {_argv(m.vllm)}"))
    for r in plan.routers:
        out.print(_escape(f"router on {r.host}: {_argv(r.run)}"))
        if r.vip_create:
            out.print(_escape(f"keepalived on {r.host}: {_argv(r.vip_create)}"))
    out.print(_escape(f"endpoint: {plan.endpoint}" + (" (floating address)" if plan.vip else "")))
    for note in plan.notes:
        out.print(f"note: {_escape(note)}")
    if dry_run:
        out.print("dry run: nothing was started")


def dry_run(plan, as_json: bool) -> None:
    """serve --dry-run: the plan was printed before; with --json, the plan as a document."""
    if as_json:
        _json({"dry_run": True, **plan.to_dict()})


def serve_failed(exc, with_findings: bool = True) -> None:
    """Why vLLM did not come up: its log's last lines, and what they point at."""
    _log_tail(exc.log_tail, getattr(exc, "tail_of", "the vLLM log"))
    if with_findings:
        findings(exc.findings)


def serve_stopped() -> None:
    out.print("stopped serving on every node; the Ray cluster is still up")


def served(res, as_json: bool) -> None:
    """serve's result: the endpoint, the split, the KV cache and a curl to try."""
    kv = res.kv
    if as_json:
        _json(D.served_doc(res))
        return
    for n in res.notes:
        out.print(f"note: {_escape(n)}")
    dp_part = f"DP={res.parallelism.dp} x " if res.parallelism.dp > 1 else ""
    ep_part = f", EP={res.parallelism.ep_size}" if res.parallelism.ep else ""
    out.print(_escape(f"serving {res.served[0] if res.served else res.model} on {res.endpoint} "
                      f"(backend {res.backend}, {dp_part}TP={res.parallelism.tp}, PP={res.parallelism.pp}{ep_part}); "
                      f"ready in {res.ready_seconds:.0f}s"))
    if kv is not None:
        out.print(_escape(kv_line(kv)))
    out.print("try: " + _escape(res.curl()))


def fleet_serve_stopped(replicas: int) -> None:
    out.print(f"stopped serving on {replicas} replicas and the router; the node containers are still up")


def fleet_served(inv, res, as_json: bool) -> None:
    """serve's result with replicas: the router's endpoint, each replica's time to ready, a curl."""
    if as_json:
        _json(D.fleet_served_doc(res))
        return
    for n in res.notes:
        out.print(f"note: {_escape(n)}")
    for r in res.kv:
        out.print(_escape(f"kv-check: {r.describe()}"))
    ready = "ready: " + ", ".join(f"replica {k} {t:.0f}s" for k, t in sorted(res.ready_seconds.items()))
    if res.changes is not None:
        ready = _changed(res.changes)
    plan = res.plan
    shape = (f"{len(plan.replicas)} replicas x {split_label(plan.split.par)}" if plan.uniform else
             "replicas " + ", ".join(f"{r.index}{f' ({r.role})' if r.role else ''} {split_label(plan.split_of(r).par)}"
                                     for r in plan.replicas))
    what = ", ".join(plan.models) if len(plan.models) > 1 else res.served[0] if res.served else plan.spec.model
    out.print(_escape(f"serving {what} on {res.endpoint} "
                      f"({shape}, router "
                      f"{inv.cluster.router.policy} on {', '.join(r.host for r in res.plan.routers)}"
                      f"{', floating address' if res.plan.vip else ''}); {ready}; "
                      f"took {res.seconds:.0f}s"))
    out.print("try: " + _escape(res.curl()))


def _changed(changes) -> str:
    """What a converging serve did, in one phrase: 'replaced replica 2, started replica 3; kept 2'."""
    done = {}
    for c in changes:
        done.setdefault(c.action, []).append(str(c.index) if c.index is not None else
                                             ", ".join(c.hosts) if c.action == "stop" else c.url)
    verbs = {"replace": "replaced replica", "start": "started replica", "route": "put back in the routers replica",
             "remove": "took out of the routers", "stop": "stopped serving on",
             "policy": "changed the router policy in place of replica"}
    parts = [f"{verbs[a]} {', '.join(done[a])}" for a in verbs if a in done]
    kept = len(done.get("keep", [])) + len(done.get("policy", []))  # a new policy: the replica kept as it was
    return f"{', '.join(parts) or 'nothing changed'}; kept {kept} replica{'s' if kept != 1 else ''} as they were"


def pool_changes(yes: bool, as_json: bool):
    """serve's on_changes for a pool that serves already: each replica's change, then [y/N] before a
    replica is replaced or a worker removed (or every replica restarts); --yes or no terminal: as confirm."""
    from bootstrap.cli.params import confirm

    def show(changes, why) -> None:
        if changes is None:
            if not as_json:
                out.print(_escape(f"the pool serves already; every replica restarts: {why}"))
            confirm(f"serve restarts every replica of the pool ({why})", yes)
            return
        if not as_json:
            for c in changes:
                out.print(_escape(f"change: {c.describe()}"))
        stops = [c for c in changes if c.action in ("replace", "remove")]
        if stops:
            confirm(f"serve replaces or removes {len(stops)} replica{'s' if len(stops) != 1 else ''} of the pool "
                    f"({', '.join(sorted({c.model for c in stops}))}); the others keep serving", yes)
    return show


# -- rollout -------------------------------------------------------------------------------------
def rollout_step(as_json: bool):
    """rollout's on_step(k, what): a timed line per replica and step on stderr."""
    t0 = time.monotonic()

    def step(k: int, what: str) -> None:
        if not as_json:
            err.print(_escape(f"{time.monotonic() - t0:7.1f}s replica {k}: {what}"))
    return step


def rollout_failed(exc) -> None:
    """The failed replica's log tail, then each replica's state."""
    _log_tail(exc.log_tail, "the failed replica's vLLM log")
    for k, st in sorted(exc.states.items()):
        err.print(_escape(f"  replica {k}: {st}"))


def rollout(res, as_json: bool) -> None:
    if as_json:
        _json(D.rollout_doc(res))
        return
    if not res.replaced:
        out.print(_escape(f"every replica already serves {res.target.describe()}: nothing to do"))
        return
    out.print(_escape(f"rolled out {res.target.describe()} to replica(s) {', '.join(map(str, res.replaced))} "
                      f"in {res.seconds:.0f}s; serving on {res.endpoint}"))


def adapter(res, as_json: bool) -> None:
    """`adapter add|remove|list`: what was done, then each replica's adapters."""
    if as_json:
        _json(res.to_doc())
        return
    r = res.result
    if r.action != "list":
        done = "loaded on" if r.action == "add" else "unloaded from"
        out.print(_escape(f"{r.name} {done} every replica of {r.model}; routed by "
                          f"{', '.join(r.routers) or 'no router'}"))
    for k, adapters in sorted(r.replicas.items()):
        names = ", ".join(f"{a['name']} ({a['source']})" for a in adapters) or "none"
        out.print(_escape(f"replica {k} of {r.model}: {names}"))


# -- bench ---------------------------------------------------------------------------------------
def bench(res, spread, png: str | None, as_json: bool) -> None:
    """bench's result: the report with its histograms, how the requests spread over the replicas."""
    if as_json:
        _json(D.bench_doc(res, spread))
        return
    out.print(_escape(face.bench_stats.format_result(res), lines=True))
    if spread is not None:
        out.print(_escape(spread.describe()))
    if png:
        out.print(_escape(f"histograms: {png}"))


def drained(res, as_json: bool) -> None:
    """drain / undrain: what happened to the host's replica."""
    if as_json:
        _json(res.to_doc())
        return
    r = res.result
    if res.verb == "drain":
        line = (f"{r.host}: replica {r.replica} ({r.url}) is out of every router and drained in {r.seconds:.1f}s "
                f"({r.why}); it stays out across serve and rollouts until `bootstrap undrain {r.host}`"
                if r.done else f"{r.host}: replica {r.replica} ({r.url}) is out of every router but not idle at "
                f"the timeout ({r.why}); it stays out until `bootstrap undrain {r.host}`")
    else:
        line = f"{r.host}: {r.why}" if r.done or r.still_drained else f"{r.host}: no longer drained; {r.why}"
    (out if res.ok else err).print(_escape(line))


def bench_ab_approve(path: str | None, yes: bool):
    """bench --ab's approve(inv, restarts): what restarts, then [y/N]; --yes or no terminal: as confirm."""
    from bootstrap.cli.params import confirm

    def approve(inv, restarts: int, hosts) -> None:
        confirm(f"bench --ab restarts the routers of the cluster {inv.cluster.name!r} ({', '.join(hosts)}) "
                f"{restarts} times "
                f"(each arm, then back to {inv.cluster.router.policy}): requests sent through them meanwhile may "
                f"fail; inventory {path or inv.path}", yes)
    return approve


def bench_ab_arm(arm) -> None:
    """One arm of bench --ab, as it ends."""
    r = arm.result
    ttft = f"TTFT p50 {r.ttft.p50 * 1000:.1f} ms" if r.ttft else "no TTFT"
    hit = (f", prefix hit {100 * arm.prefix_hits / arm.prefix_queries:.0f} %" if arm.prefix_queries else "")
    if arm.kv_lookups:
        hit += f", the router's KV index found a cached prefix for {100 * arm.kv_hits / arm.kv_lookups:.0f} %"
    err.print(_escape(f"ab: {arm.policy} (repeat {arm.repeat + 1}): {r.ok}/{r.requests} ok, "
                      f"{r.requests_per_s:.2f} req/s, {ttft}{hit}"))


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def bench_ab(res, as_json: bool) -> None:
    """bench --ab's table: one row per policy, the best on each measure, the policy given back."""
    if as_json:
        _json(res.to_dict())
        return
    slo = res.rows[0].slo_ms if res.rows else 0
    t = Table(title=_escape(f"router policies on the {res.workload} workload ({len(res.arms)} arms)"),
              title_justify="left")
    kv = any(r.kv_index_hit_pct is not None for r in res.rows)
    for col in ("policy", "req/s", f"goodput (TTFT <= {slo:g} ms)", "TTFT p50/p99 ms", "ITL p50/p99 ms",
                "failed", "shed", "prefix hit %", *(("kv_aware index hit %",) if kv else ()),
                "requests per replica", "max/min"):
        t.add_column(col)
    for r in res.rows:
        per = " ".join(f"{k}:{v}" for k, v in sorted(r.per_replica.items())) or "-"
        t.add_row(_escape(r.policy), f"{r.requests_per_s:.2f}", f"{r.goodput:.2f}",
                  f"{_ms(r.ttft_p50_ms)}/{_ms(r.ttft_p99_ms)}", f"{_ms(r.itl_p50_ms)}/{_ms(r.itl_p99_ms)}",
                  str(r.failed), str(r.shed), _ms(r.prefix_hit_pct), *((_ms(r.kv_index_hit_pct),) if kv else ()),
                  per, "-" if r.spread is None else f"{r.spread:.2f}")
    out.print(t)
    for measure, policy in res.best.items():
        out.print(_escape(f"best {measure}: {policy}"))
    out.print(_escape(f"the routers serve with {res.restored} again (the inventory's policy)"))
    if res.png:
        out.print(_escape(f"bars: {res.png}"))


def serve_plans(plan, dry_run: bool) -> None:
    """serve's on_plan: the plan of one cluster, or with replicas the fleet's (face.FleetPlan)."""
    if isinstance(plan, face.FleetPlan):
        fleet_serve_plan(plan, dry_run)
    else:
        serve_plan(plan, dry_run)


def serve_outcome(res, as_json: bool) -> None:
    """serve's face.ServeOutcome: stopped, planned (--dry-run) or served, on one cluster or a fleet."""
    if res.kind == "stopped":
        if as_json:
            _json(res.to_doc())
        elif res.value is not None:
            v = res.value
            out.print(_escape(f"stopped serving {v['model']} (replica{'s' if len(v['replicas']) > 1 else ''} "
                              f"{', '.join(map(str, v['replicas']))} on {', '.join(v['hosts'])}); the other models "
                              f"serve as before; `bootstrap serve -i {res.inv.path}` starts it again"))
        elif res.fleet:
            fleet_serve_stopped(res.inv.cluster.replicas)
        else:
            serve_stopped()
    elif res.kind == "planned":
        dry_run(res.value, as_json)
    elif res.fleet:
        fleet_served(res.inv, res.value, as_json)
    else:
        served(res.value, as_json)
