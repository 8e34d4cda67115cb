"""The serving commands: serve, rollout and bench (each one call to the library face).
"""
from __future__ import annotations

import click

from bootstrap import face
from bootstrap.cli import render
from bootstrap.cli.app import _run, exit_on, main
from bootstrap.cli.become import become_option
from bootstrap.cli.params import (
    SECONDS,
    FilePath,
    PassThrough,
    accept_keys_option,
    check_fleet_flags,
    check_listen,
    check_name,
    check_nonempty,
    check_parallelism,
    check_png,
    check_pool_serve,
    check_rollout_args,
    check_serve_args,
    check_url,
    confirm,
    host_options,
    inventory_option,
    json_option,
    read_inventory,
    renamed,
    yes_option,
)
from bootstrap.cli.render import LineReporter
from bootstrap.errors import UsageError


# -- serve ---------------------------------------------------------------------------------------
@main.command(cls=PassThrough, context_settings={"ignore_unknown_options": True})
@host_options
@click.argument("model", required=False)
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@click.option("--tp", type=click.IntRange(1), default=None,
              help="Tensor-parallel size (default: the split the planner picks from the model and the cluster: "
                   "GPUs per node where the model's attention heads allow it; the plan says why).")
@click.option("--pp", type=click.IntRange(1), default=None,
              help="Pipeline-parallel size (default: the planner's, nodes x GPUs per node / TP; the plan says why).")
@click.option("--dp", type=click.IntRange(1), default=None,
              help="Data parallel: this many vLLM engines (each --tp GPUs within one node, the same number on "
                   "every node; on CPU nodes one engine per node), balanced by the head's API server "
                   "(vLLM's own --data-parallel-size; native backend). For a model that fits one node.")
@click.option("--ep", is_flag=True,
              help="Expert parallel for a mixture-of-experts model: data parallel engines (TP=1 first, or --tp) "
                   "with the experts spread over every GPU (vLLM's --enable-expert-parallel). The default for a "
                   "mixture-of-experts model on GPU nodes when no --tp/--pp/--dp is given; refused on CPU nodes.")
@click.option("--all2all", default=None, metavar="BACKEND",
              help="Expert parallel's all-to-all (vLLM's --all2all-backend), checked against the image's vLLM "
                   "and the hardware (default: deepep_low_latency between nodes with RDMA and DeepEP in the image, "
                   "else allgather_reducescatter). Implies --ep.")
@click.option("--backend", type=click.Choice(["ray", "native"]), default=None,
              help="ray (default on GPU nodes that run Ray): the running Ray cluster; native (default on CPU "
                   "clusters and where the nodes run no Ray, e.g. a stock image with runtime unset): vLLM's own "
                   "multi-node mode (--nnodes/--node-rank/--headless).")
@click.option("--sync-model", is_flag=True, help="Copy the model directory from the head to nodes where it differs.")
@renamed("--wait", "--timeout", "wait", SECONDS)
@click.option("--timeout", "wait", type=SECONDS, default=900.0, show_default=True,
              help="Seconds to wait for /health and /v1/models.")
@click.option("--listen", default=None, callback=check_listen,
              help="Address vLLM binds (default: the head's data-plane IP).")
@click.option("--served-model-name", default=None, callback=check_name,
              help="The model name clients send in requests (vLLM's --served-model-name; default: the MODEL argument).")
@click.option("--stop", is_flag=True, help="Stop serving (it says what and asks [y/N]; --yes where no terminal can "
                                           "answer); the Ray cluster keeps running.")
@click.option("--model", "stop_model", default=None, metavar="NAME",
              help="With --stop in a pool of models: stop only NAME's replicas (out of the routers, their requests "
                   "finished, stopped); the other models serve on. `serve` with no MODEL starts it again.")
@click.option("--dry-run", is_flag=True,
              help="Connect to the hosts, read the model's config.json in the head's container (a model the hub "
                   "does not have is refused here too), print the plan (backend, TP/PP and why, each node's command) "
                   "and stop: nothing is started; secrets need not be set. `bootstrap plan` contacts no host.")
@click.option("--offline", is_flag=True,
              help="With --dry-run: plan from the inventory and a config.json on this machine alone (--model-config, "
                   "or MODEL where it is a folder here), contacting no host; one cluster (cluster.replicas 1).")
@click.option("--model-config", default=None, metavar="PATH",
              help="With --offline: the model's config.json (or the folder holding it) to plan the split from.")
@renamed("--drain", "--drain-timeout", "drain", SECONDS)
@click.option("--drain-timeout", "drain", type=SECONDS, default=120.0, show_default=True,
              help="Seconds a replica taken out of the routers may take to finish its requests before it stops: "
                   "a pool that serves already (before it is replaced), and --stop with replicas.")
@yes_option
@json_option
def serve(inventory, parallel, model, extra, tp, pp, dp, ep, all2all, backend, sync_model, wait, listen,
          served_model_name, stop, stop_model, dry_run, offline, model_config, drain, yes, as_json):
    """Serve MODEL (a Hugging Face id or a path inside the containers) across the cluster.

    Defaults: the split is read from the model's config.json: TP = GPUs per node and PP = nodes
    when the model takes it, else the largest TP its attention heads allow with the rest as PP
    (on a CPU cluster: TP across the nodes first). The backend follows the cluster: native on CPU
    or without Ray, ray on GPU clusters running Ray. The plan is printed before anything starts
    (--dry-run stops there). Extra vLLM flags go after `--`. Waits for /health and /v1/models,
    then prints the endpoint, a curl to paste, and the KV cache capacity.

    Example: bootstrap serve -i hosts.yaml meta-llama/Llama-3.1-405B-Instruct -- --max-model-len 8192
    """
    check_serve_args(click.get_current_context(), model, extra, stop, dry_run)
    if offline and not dry_run:
        raise click.UsageError("--offline plans without the hosts: it goes with --dry-run")
    if model_config is not None and not offline:
        raise click.UsageError("--model-config goes with --dry-run --offline (serve reads the model's config on "
                               "the head)")
    if stop_model is not None and not stop:
        raise click.UsageError("--model NAME goes with --stop (to serve, name MODEL, or run serve with no MODEL on a "
                               "pool of models)")

    def go():
        inv = read_inventory(inventory, check_files=not offline, require_secrets=not dry_run)
        if stop and not dry_run:
            confirm(face.stop_preview(inv, stop_model), yes)
        if not stop:
            check_pool_serve(inv, model, {"--tp": tp, "--pp": pp, "--dp": dp, "--ep": ep, "--all2all": all2all,
                                          "--backend": backend, "--sync-model": sync_model, "--listen": listen,
                                          "--served-model-name": served_model_name})
        check_parallelism(inv, tp, pp, dp, ep=ep or all2all is not None)
        reporter = render.progress_reporter(as_json)
        try:
            res = face.serve(inv, model, tp=tp, pp=pp, dp=dp, ep=ep, all2all=all2all, backend=backend, extra=extra,
                             sync_model=sync_model, wait=wait, listen=listen, served_name=served_model_name,
                             parallel=parallel, stop=stop, dry_run=dry_run, offline=offline,
                             model_config=model_config, reporter=reporter,
                             on_plan=None if as_json else (lambda plan: render.serve_plans(plan, dry_run)),
                             on_failed=render.serve_failed, drain=drain,
                             on_changes=render.pool_changes(yes or dry_run, as_json), stop_model=stop_model)
        finally:
            reporter.close()
        render.serve_outcome(res, as_json)
    _run(go)


# -- rollout -------------------------------------------------------------------------------------
@main.command(cls=PassThrough, context_settings={"ignore_unknown_options": True})
@host_options
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", default=None,
              help="The model to change to (default: the one served). With models: in the inventory, the pool's "
                   "model to roll out, to what its entry says.")
@click.option("--image", default=None, help="The image to change to (default: the one served).")
@click.option("--keep-flags", is_flag=True, help="Keep the vLLM flags served now (default: the flags after --).")
@click.option("--dp", type=click.IntRange(1), default=None,
              help="Change each replica to this many vLLM data parallel engines over its nodes (as serve --dp; "
                   "default: each replica keeps its shape).")
@click.option("--no-dp", is_flag=True, help="Change each replica back to one TP x PP engine (as serve without --dp).")
@click.option("--max-unavailable", type=click.IntRange(1), default=1, show_default=True,
              help="Replicas replaced at once (never all of them).")
@renamed("--drain", "--drain-timeout", "drain", SECONDS)
@click.option("--drain-timeout", "drain", type=SECONDS, default=120.0, show_default=True,
              help="Seconds a replica out of the router may take to finish its requests before it is stopped.")
@renamed("--wait", "--timeout", "wait", SECONDS)
@click.option("--timeout", "wait", type=SECONDS, default=900.0, show_default=True,
              help="Seconds a new replica may take to answer a completion.")
@json_option
def rollout(inventory, parallel, extra, model, image, keep_flags, dp, no_dp, max_unavailable, drain, wait, as_json):
    """Change the model, vLLM flags or image of a fleet (cluster.replicas > 1), replica by replica.

    Each replica leaves the router, drains (running + waiting requests at zero for 2 s, or --drain), stops,
    starts with the new spec, must answer a real completion, and goes back into the router. A
    replica that fails is rolled back and the rollout stops (exit 1, naming it); the others keep
    serving. Ctrl-C rolls back the replica in flight and lists each replica's state.

    Example: bootstrap rollout -i hosts.yaml -- --max-model-len 4096
    (bootstrap rollout -i hosts.yaml --dp 2 --keep-flags: each replica becomes 2 data parallel engines;
    bootstrap rollout -i pool.yaml --model chat: after editing chat's entry in models:, only its replicas)
    """
    check_rollout_args(model, extra, keep_flags, image)
    if dp is not None and no_dp:
        raise click.UsageError("--dp and --no-dp: give one (--dp N: data parallel engines; --no-dp: one TP x PP "
                               "engine)")

    def checked(inv):
        if dp is not None:
            check_parallelism(inv, None, None, dp)
        check_fleet_flags(inv, tuple(extra))

    def go():
        res = face.rollout(read_inventory(inventory), before=checked, model=model,
                           extra=None if keep_flags else tuple(extra), image=image,
                           dp=None if no_dp else dp if dp is not None else False, drain=drain, wait=wait,
                           max_unavailable=max_unavailable, parallel=parallel, reporter=LineReporter(quiet=True),
                           on_step=render.rollout_step(as_json), on_failed=render.rollout_failed)
        render.rollout(res.result, as_json)
    _run(go)


# -- adapter -------------------------------------------------------------------------------------
@main.group()
def adapter():
    """A pool model's LoRA adapters at runtime: load, unload, list, on every replica of the model,
    each router routing the adapter's name to them; no replica restarts (inventory models:).

    An adapter added here lasts until its replica restarts: list it in the model's `adapters:` to
    keep it (the next `serve` loads it with the model).

    Example: bootstrap adapter add -i pool.yaml chat chat-sql /models/loras/sql
    """


@adapter.command("add")
@host_options
@click.argument("model", callback=check_name)
@click.argument("name", callback=check_name)
@click.argument("source", callback=check_name)
@json_option
def adapter_add(inventory, parallel, model, name, source, as_json):
    """Load adapter NAME from SOURCE (a path in the containers or a Hugging Face id) on every replica
    of MODEL, then route NAME to them. Exit 1 naming the replica when vLLM refuses it.

    Example: bootstrap adapter add -i pool.yaml chat chat-sql /models/loras/sql
    """
    _adapter(inventory, parallel, "add", model, name, source, as_json)


@adapter.command("remove")
@host_options
@click.argument("model", callback=check_name)
@click.argument("name", callback=check_name)
@json_option
def adapter_remove(inventory, parallel, model, name, as_json):
    """Stop routing NAME (each replica of MODEL in turn), then unload it from every replica.

    Example: bootstrap adapter remove -i pool.yaml chat chat-sql
    """
    _adapter(inventory, parallel, "remove", model, name, None, as_json)


@adapter.command("list")
@host_options
@click.argument("model", callback=check_name)
@json_option
def adapter_list(inventory, parallel, model, as_json):
    """The adapters each replica of MODEL serves now (its vLLM's own list).

    Example: bootstrap adapter list -i pool.yaml chat
    """
    _adapter(inventory, parallel, "list", model, None, None, as_json)


def _adapter(inventory, parallel, action, model, name, source, as_json):
    def go():
        res = face.adapter(read_inventory(inventory), action, model, name, source, parallel=parallel,
                           reporter=LineReporter(quiet=as_json))
        render.adapter(res, as_json)
    _run(go)


# -- drain / undrain -----------------------------------------------------------------------------
@main.command()
@host_options
@click.argument("host", callback=check_name)
@click.option("--timeout", "--drain-timeout", "timeout", type=SECONDS, default=120.0, show_default=True,
              help="Seconds the replica's requests in flight may take to finish (--drain-timeout, as serve "
                   "and rollout call it, is the same).")
@json_option
def drain(inventory, parallel, host, timeout, as_json):
    """Take HOST's replica out of every router for maintenance, and wait until its requests finish.

    The host is marked first, then its replica leaves every router, then bootstrap waits until the
    replica's engines have no request running or waiting (vLLM's own gauges) or --timeout. The
    replica keeps running; `serve` and `rollout` leave it out of the routers until `undrain HOST`.
    Refused when no other healthy replica is in rotation. Exit 1: still busy at the timeout.

    Example: bootstrap drain -i fleet.yaml gpu-c
    """
    _drain(inventory, parallel, host, False, timeout, as_json)


@main.command()
@host_options
@click.argument("host", callback=check_name)
@json_option
def undrain(inventory, parallel, host, as_json):
    """Put HOST's replica back in every router (after `drain HOST`), once it answers.

    Example: bootstrap undrain -i fleet.yaml gpu-c
    """
    _drain(inventory, parallel, host, True, 0.0, as_json)


def _drain(inventory, parallel, host, undo, timeout, as_json):
    def go():
        res = face.drain(read_inventory(inventory), host, undo=undo, timeout=timeout, parallel=parallel,
                         reporter=LineReporter(quiet=as_json))
        render.drained(res, as_json)
        exit_on(res)
    _run(go)


# -- bench ---------------------------------------------------------------------------------------
def check_policies(ctx, param, value: str | None) -> list[str] | None:
    """`--ab a,b`: two router policies or more, each one vllm-router offers (with its settings:
    cache_aware:cache_threshold=0.8), none twice."""
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        try:
            face.arm_router(name)
        except UsageError as e:
            raise click.BadParameter(str(e)) from None
    if len(set(names)) != len(names):
        raise click.BadParameter(f"{value!r} names a policy twice")
    if len(names) < 2:
        raise click.BadParameter(f"an A/B needs two policies or more, comma-separated (got {value!r})")
    return names


def check_bench_args(ab, url, prompt, workload, trace) -> None:
    """What bench refuses from its options alone, before the inventory is read."""
    if workload and trace:
        raise click.UsageError("--workload and --trace both say what to send: give one of them")
    if prompt and (workload or trace):
        raise click.UsageError(f"--prompt is one prompt for every request; {'--workload' if workload else '--trace'} "
                               "brings its own: give one of them")
    if ab and url:
        raise click.UsageError("--ab restarts the inventory's routers and sends through them: give no --url")
    if ab and prompt:
        raise click.UsageError("--ab sends a workload (--workload or --trace), not one --prompt")
    ctx = click.get_current_context()
    given = [f"--{n.replace('_', '-')}" for n in ("repeats", "warmup", "slo_ttft_ms", "yes")
             if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]
    if given and not ab:
        raise click.UsageError(f"{given[0]} is an option of an A/B: give --ab POLICY,POLICY with it")


@main.command()
@inventory_option
@accept_keys_option
@become_option
@click.option("--url", default=None, callback=check_url,
              help="Endpoint to load (default: the inventory's head and vLLM port; with replicas, the router, "
                   "and the requests each replica served are reported).")
@click.option("--model", default=None, callback=check_name,
              help="Model name (default: the first one /v1/models lists).")
@click.option("-n", "--requests", "n_requests", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="Requests to send in all.")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Requests in flight at once.")
@click.option("--max-tokens", type=click.IntRange(1, face.MAX_BENCH_TOKENS), default=64, show_default=True,
              help="max_tokens of each request (tokens generated per request, fewer if the model stops early).")
@click.option("--prompt", default=None, callback=check_nonempty, help="Prompt text (default: a fixed paragraph).")
@click.option("--ignore-eos", is_flag=True, help="Always generate --max-tokens tokens (vLLM extension).")
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True, help="Seconds per request.")
@click.option("--png", type=FilePath(), default=None, callback=check_png,
              help="Write latency histograms (with --ab: the policies' bars side by side) to this PNG.")
@click.option("--workload", type=click.Choice(face.BENCH_WORKLOADS), default=None,
              help="Send a built-in workload instead of one prompt: shared-prefix (one system prompt, many users), "
                   "multi-turn (sessions, each turn extends the last), few-shot (long common examples) or random "
                   "(no common prefix: the control). With --ab the default is shared-prefix.")
@click.option("--trace", type=FilePath(), default=None,
              help="Replay a JSON-lines trace: per line timestamp (s), prompt or prompt_tokens, output_tokens, "
                   "session.")
@click.option("--prompt-words", type=click.IntRange(4, 100000), default=200, show_default=True,
              help="Length of a workload's prompts, in words.")
@click.option("--ab", "ab", default=None, callback=check_policies, metavar="POLICY,POLICY,...",
              help="A/B the routers' policies on a fleet: the same workload through the routers restarted with "
                   "each policy in turn, interleaved over --repeats, --requests per arm; one table side by side. "
                   "A policy may carry its settings: cache_aware:cache_threshold=0.8 (cache_threshold, "
                   "balance_abs_threshold, balance_rel_threshold, session_ttl). The routers get the inventory's "
                   "policy back at the end.")
@click.option("--repeats", type=click.IntRange(1, 20), default=2, show_default=True,
              help="With --ab: arms per policy (every other repeat in reverse order).")
@click.option("--warmup", type=click.IntRange(0, 10000), default=8, show_default=True,
              help="With --ab: requests of each arm's workload sent before it is measured.")
@click.option("--slo-ttft-ms", type=click.IntRange(1, 3_600_000), default=1000, show_default=True,
              help="With --ab: the time to first token a request must meet to count in goodput.")
@click.option("-y", "--yes", is_flag=True, help="With --ab: restart the routers without asking (needed where no "
              "terminal can answer: a script, CI).")
@json_option
def bench(inventory, url, model, n_requests, concurrency, max_tokens, prompt, ignore_eos, timeout, png, workload,
          trace, prompt_words, ab, repeats, warmup, slo_ttft_ms, yes, as_json):
    """A bounded load of streaming completions: requests/s, tokens/s, TTFT/ITL/E2E percentiles.

    Exactly --requests requests with at most --concurrency in flight; prints p50/p95/p99 with text
    histograms and says when high-percentile spikes with low throughput point at a coordinator
    bottleneck rather than the GPUs. With --ab, the routers' policies side by side on one workload
    (docs/replicas.md, "Choosing a policy").

    Example: bootstrap bench -i hosts.yaml --requests 200 --concurrency 16 --png latency.png

    Example: bootstrap bench -i fleet.yaml --ab round_robin,cache_aware --workload shared-prefix -n 200
    """
    cfg = dict(model=model, requests=n_requests, concurrency=concurrency, max_tokens=max_tokens, timeout=timeout,
               ignore_eos=ignore_eos)
    check_bench_args(ab, url, prompt, workload, trace)
    if ab:
        return _bench_ab(inventory, ab, cfg, workload or "shared-prefix", trace, prompt_words, repeats, warmup,
                         slo_ttft_ms, png, yes, as_json)

    def go():
        res = face.bench(url, lambda check_files: read_inventory(inventory, check_files=check_files), png=png,
                         prompt=prompt, workload=workload, trace=trace, prompt_words=prompt_words, **cfg)
        render.bench(res.result, res.spread, png, as_json)
        exit_on(res)
    _run(go)


def _bench_ab(inventory, policies, cfg, workload, trace, prompt_words, repeats, warmup, slo_ms, png, yes, as_json):
    def go():
        res = face.bench_ab(lambda check_files: read_inventory(inventory, check_files=check_files), policies,
                            workload=workload, trace=trace, repeats=repeats, warmup=warmup,
                            prompt_words=prompt_words, slo_ms=slo_ms, png=png,
                            approve=render.bench_ab_approve(inventory, yes), reporter=LineReporter(quiet=as_json),
                            on_arm=None if as_json else render.bench_ab_arm, **cfg)
        render.bench_ab(res, as_json)
    _run(go)
