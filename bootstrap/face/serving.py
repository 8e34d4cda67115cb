"""The library face's serving commands: serve (one cluster or a fleet behind its router), rollout and bench.
"""
from __future__ import annotations

from bootstrap.errors import FleetError, ModelSplitError, ServeFailed
from bootstrap.face import results as R
from bootstrap.face.cluster import fleet, inventory
from bootstrap.remote.fanout import DEFAULT_PARALLEL


def serve(inv, model, *, stop: bool = False, dry_run: bool = False, parallel: int = DEFAULT_PARALLEL,
          reporter=None, on_plan=None, on_failed=None, on_changes=None, drain: float = 120.0,
          stop_model: str | None = None, offline: bool = False, model_config: str | None = None,
          **opts) -> R.ServeOutcome:
    """`serve` MODEL (stop: stop serving), on the cluster or, with replicas, on every replica and the
    router in front. on_plan(plan) before anything starts (a ServePlan or, with replicas, a FleetPlan);
    on_failed(exc, with_findings) when vLLM does not come up, before the error is raised. A split or
    an option the inventory refuses raises OptionError. A pool of models that serves already is
    converged (fleet/converge.py): on_changes(changes, why) first, drain: seconds a replica taken out
    may take to finish its requests (with stop: every replica, out of the routers before it stops);
    stop_model: with stop, only that model of the pool (OptionError where the inventory has no such).
    offline (with dry_run): the plan from the inventory and model_config (a config.json here) alone,
    contacting no host (serve/run.py plan_offline); one cluster only."""
    if offline:
        return _plan_offline(inventory(inv, require_secrets=False, check_files=False), model, model_config,
                             on_plan, opts)
    inv = inventory(inv, require_secrets=not dry_run)
    if stop and stop_model is not None:
        return _stop_model(inv, stop_model, parallel, reporter, drain)
    if fleet(inv):
        if inv.models and not stop:
            opts.update(on_changes=on_changes, drain=drain)
        if stop:
            opts.update(drain=drain)
        return _serve_fleet(inv, model, stop=stop, dry_run=dry_run, parallel=parallel, reporter=reporter,
                            on_plan=on_plan, on_failed=on_failed, **opts)
    from bootstrap.serve import run as V

    if stop:
        V.stop(inv, parallel=parallel, reporter=reporter)
        return R.ServeOutcome(inv, "stopped", False)
    try:
        res = V.serve(inv, model, parallel=parallel, dry_run=dry_run, on_plan=on_plan, reporter=reporter, **opts)
    except ModelSplitError as exc:
        raise _split_refused(exc, opts) from None
    except ServeFailed as exc:
        if on_failed is not None:
            on_failed(exc, True)
        raise
    return R.ServeOutcome(inv, "planned" if isinstance(res, V.ServePlan) else "served", False, res)


def _split_refused(exc: ModelSplitError, opts: dict) -> R.OptionError:
    """A split the model refuses, named by the option that asked for it (--tp/--pp, --dp) where one did."""
    msg = str(exc)
    given = [opts.get(k) is not None for k in ("tp", "pp", "dp")]
    if any(given) and msg.startswith(("TP=", "DP=")):  # the split the user's option asked for
        msg = f"{'--dp' if given[2] else '--tp/--pp'}: {msg}"
    return R.OptionError(msg)


def _plan_offline(inv, model, model_config, on_plan, opts) -> R.ServeOutcome:
    """serve --dry-run --offline: one cluster's plan, no host contacted."""
    from bootstrap.serve import run as V

    if fleet(inv) or inv.models:
        raise R.OptionError("--offline: plans one cluster's serve; for replicas and what each serves, run "
                            "bootstrap plan (it contacts no host either)")
    keep = ("tp", "pp", "dp", "ep", "all2all", "backend", "extra", "listen", "served_name")
    try:
        plan = V.plan_offline(inv, model, config=model_config, **{k: opts[k] for k in keep if k in opts})
    except ModelSplitError as exc:
        raise _split_refused(exc, opts) from None
    if on_plan is not None:
        on_plan(plan)
    return R.ServeOutcome(inv, "planned", False, plan)


def _stop_model(inv, name, parallel, reporter, drain) -> R.ServeOutcome:
    """serve --stop --model NAME: one model of a pool (fleet/converge.stop_model)."""
    from bootstrap.face.cluster import stop_model_groups
    from bootstrap.fleet import converge as CV

    stop_model_groups(inv, name)
    replicas = CV.stop_model(inv, name, parallel=parallel, reporter=reporter, drain=drain)
    return R.ServeOutcome(inv, "stopped", True, {"model": name, "replicas": replicas,
                                                 "hosts": [h.name for k in replicas for h in inv.replicas[k]]})


def _serve_fleet(inv, model, *, stop, dry_run, parallel, reporter, on_plan, on_failed, ep=False, all2all=None,
                 sync_model=False, listen=None, **opts) -> R.ServeOutcome:
    """serve with cluster.replicas > 1: every replica, then the router in front."""
    from bootstrap.fleet import plan as FP
    from bootstrap.fleet import run as FL

    if sync_model:
        raise R.OptionError("--sync-model copies from one head: with replicas, put the model on every host "
                            "(or in the image, or the HF cache)")
    if listen is not None:
        raise R.OptionError("--listen: with replicas every vLLM binds its head's data-plane IP, where the router "
                            "reaches it; set cluster.router.host/port for the endpoint")
    if stop:
        FL.stop_fleet(inv, parallel=parallel, reporter=reporter, drain=opts.get("drain", 120.0))
        return R.ServeOutcome(inv, "stopped", True)
    check_pool(inv)
    try:
        res = FL.serve_fleet(inv, model, parallel=parallel, dry_run=dry_run, on_plan=on_plan, reporter=reporter,
                             **opts)
    except FleetError as exc:
        raise R.OptionError(str(exc)) from None
    except ModelSplitError as exc:
        raise R.OptionError(f"serve: {exc}") from None
    except ServeFailed as exc:
        if on_failed is not None:
            on_failed(exc, False)
        raise
    return R.ServeOutcome(inv, "planned" if isinstance(res, FP.FleetPlan) else "served", True, res)


def check_pool(inv) -> None:
    """A pool's models' own vLLM flags (models[].args; fleet.plan.pool_problems, which loading the inventory
    runs too), for an Inventory built without face.load_inventory: before any host is contacted."""
    from bootstrap.fleet.plan import pool_problems

    problems = pool_problems(inv)
    if problems:
        raise problems[0]


def adapter(inv, action: str, model: str, name: str | None = None, source: str | None = None, *,
            parallel: int = DEFAULT_PARALLEL, reporter=None) -> R.AdapterResult:
    """`adapter add|remove|list`: a pool model's LoRA adapters at runtime, on every replica of the
    model and in every router (fleet.adapters); what it refuses is an OptionError, nothing contacted."""
    from bootstrap.fleet import adapters as FA

    inv = inventory(inv)
    try:
        FA.check(inv, action, model, name, source)
    except FleetError as exc:
        raise R.OptionError(str(exc)) from None
    return R.AdapterResult(FA.adapter(inv, action, model, name, source, parallel=parallel, reporter=reporter))


def check_rollout(inv, model: str | None = None, extra=None, dp=False) -> None:
    """What rollout refuses from the inventory alone: a cluster that is no fleet; in a pool of models,
    no --model naming one of them, or flags and shapes that its models: entry holds instead."""
    if not fleet(inv):
        raise R.OptionError("rollout replaces replicas one by one: set cluster.replicas (2 or more) in the "
                            "inventory; with one replica use bootstrap serve")
    if not inv.models:
        return
    names = ", ".join(m.name for m in inv.models)
    if model is None:
        raise R.OptionError(f"{inv.path} serves a pool of models ({names}): name the one to roll out with --model; "
                            "its replicas change to what its models: entry says, one at a time")
    from bootstrap.fleet import plan as FP

    try:
        found, _ = FP.pool_model(inv, model)
    except FleetError as exc:
        raise R.OptionError(f"--model: {exc}") from None
    if extra:
        raise R.OptionError(f"a pool's model takes its vLLM flags from {found.where}.args: edit them there and give "
                            "no flags after --")
    if dp is not False:
        raise R.OptionError("--dp/--no-dp: a pool's models are planned from models: (tp, pp, args)")


def rollout(inv, *, before=None, on_failed=None, **opts) -> R.RolloutResult:
    """`rollout`: change the model, flags or image of a fleet replica by replica (fleet.run.rollout).
    before(inv): the caller's own checks of its options against the fleet, after the face's and before
    any host is contacted; on_failed(exc) when a replica fails, before the error is raised."""
    from bootstrap.errors import RolloutFailed
    from bootstrap.fleet import rollout as FRO

    inv = inventory(inv)
    check_rollout(inv, opts.get("model"), opts.get("extra"), opts.get("dp", False))
    if before is not None:
        before(inv)
    try:
        return R.RolloutResult(FRO.rollout(inv, **opts))
    except RolloutFailed as exc:
        if on_failed is not None:
            on_failed(exc)
        raise


def bench(url: str | None, load=None, *, png: str | None = None, prompt: str | None = None,
          workload: str | None = None, trace: str | None = None, prompt_words: int = 200, **cfg) -> R.BenchResult:
    """`bench`: a bounded load of streaming completions on `url` (None: the inventory's endpoint: its
    head's vLLM port, or with replicas the router, and then how the requests spread over the replicas).
    load(check_files) gives the inventory, read only when url is None; png: write the histograms there;
    workload or trace: what to send (serve/workloads.py), else cfg's requests of one prompt alike."""
    from bootstrap.cluster import plan as PL
    from bootstrap.serve import bench as B
    from bootstrap.serve import workloads as W

    target, fleet_inv = url, None
    if target is None:
        inv = inventory(load(False))
        _served_by(inv, cfg.get("model"))
        target = "http://" + PL.hostport(inv.head.ip, inv.cluster.ports.vllm)
        if fleet(inv):
            from bootstrap.fleet import names as FN
            from bootstrap.fleet import routers as FRT
            target, fleet_inv = FN.router_url(inv), inventory(load(True))
    kw = {"prompt": prompt} if prompt else {}
    if fleet_inv is not None:
        kw["api_key"] = FRT.api_key(fleet_inv, cfg.get("model"))
    config = B.BenchConfig(url=target, **cfg, **kw)
    if fleet_inv is not None:
        from bootstrap.fleet import status as FS
        before = FS.status(fleet_inv)
    reqs = (W.read_trace(trace) if trace else W.build(workload, config.requests, prompt_words) if workload
            else None)
    res = B.run_bench(config, requests=reqs)
    spread = FS.spread(before, FS.status(fleet_inv)) if fleet_inv is not None else None
    if png:
        B.write_png(res, png)
    return R.BenchResult(res, spread, png)


def _served_by(inv, model: str | None) -> None:
    """A pool's --model names one of its models or their adapters (what its router routes), before any load."""
    names = [n for m in inv.models for n in (m.name, *(a for a, _ in m.adapters))]
    if model is not None and names and model not in names:
        raise R.OptionError(f"--model {model!r}: the pool of {inv.path} serves {', '.join(names)}; its router "
                            "answers no other name")


def bench_ab(load, policies, *, workload: str = "shared-prefix", trace: str | None = None, repeats: int = 2,
             warmup: int = 0, prompt_words: int = 200, slo_ms: float = 1000.0, png: str | None = None,
             approve=None, parallel: int = DEFAULT_PARALLEL, reporter=None, on_arm=None, **cfg):
    """`bench --ab`: the workload (or a trace) through the fleet's routers under each policy in turn,
    interleaved over `repeats` (fleet/ab.py), one row per policy (serve/abtest.py). load(check_files)
    gives the inventory; approve(inv, restarts, router hosts) before the first router restarts (the caller may refuse
    by raising); on_arm(arm) after each arm; png: bars of the rows there."""
    from bootstrap.fleet import ab as FAB
    from bootstrap.fleet import names as FN
    from bootstrap.fleet import routers as FRT
    from bootstrap.serve import abtest as AB
    from bootstrap.serve import bench as B
    from bootstrap.serve import workloads as W

    inv = inventory(load(True))
    FAB.check(inv, policies)
    if trace is not None:
        reqs = W.read_trace(trace)
        make = lambda seed: reqs  # noqa: E731 -- a trace is replayed as it is, in every arm
        warmup = 0
    else:
        W.build(workload, 1, prompt_words)  # an unknown workload is refused before any host is contacted
        make = lambda seed: W.build(workload, warmup + cfg["requests"], prompt_words, seed)  # noqa: E731
    config = B.BenchConfig(url=FN.router_url(inv), api_key=FRT.api_key(inv, cfg.get("model")), **cfg)
    if approve is not None:
        approve(inv, len(AB.order(policies, repeats)) + 1, [h.name for h in FN.router_hosts(inv)])
    arms = FAB.run_ab(inv, policies, make, config, repeats=repeats, warmup=warmup, parallel=parallel,
                      reporter=reporter, on_arm=on_arm)
    rows = AB.table(policies, arms, slo_ms)
    if png:
        B.write_ab_png(rows, trace or workload, png)
    return AB.AbResult(trace or workload, list(policies), arms, rows, inv.cluster.router.policy, png)


def drain(inv, host: str, *, undo: bool = False, timeout: float = 120.0, parallel: int = DEFAULT_PARALLEL,
          reporter=None) -> R.DrainOutcome:
    """`drain HOST` (undo: `undrain HOST`): its replica out of every router until undrained, across
    serve and rollouts (fleet/drain.py)."""
    from bootstrap.fleet import drain as FDR

    inv = inventory(inv)
    if undo:
        res = FDR.undrain(inv, host, parallel=parallel, reporter=reporter)
        return R.DrainOutcome("undrain", res, res.done or bool(res.still_drained))
    res = FDR.drain(inv, host, timeout=timeout, parallel=parallel, reporter=reporter)
    return R.DrainOutcome("drain", res, res.done)
