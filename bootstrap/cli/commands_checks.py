"""The check commands: check-nccl, check-kv, doctor and logs (each one call to the library face).
"""
from __future__ import annotations

import threading

import click

from bootstrap import face
from bootstrap.cli import render
from bootstrap.cli.app import _run, exit_on, main
from bootstrap.cli.become import become_option
from bootstrap.cli.params import (
    SECONDS,
    accept_keys_option,
    check_host_names,
    check_hosts,
    check_kv_port,
    check_sizes,
    host_options,
    inventory_option,
    json_option,
    parallel_option,
    read_inventory,
    renamed,
)
from bootstrap.cli.render import LineReporter


# -- check-nccl ----------------------------------------------------------------------------------
@main.command("check-nccl")
@host_options
@renamed("--deadline", "--timeout", "deadline", SECONDS)
@click.option("--timeout", "deadline", type=SECONDS, default=180.0, show_default=True,
              help="Seconds for the whole check; a node that does not answer in time is named.")
@click.option("--sizes", default=None, callback=check_sizes,
              help="Message sizes in bytes, comma-separated multiples of 4 (default: a sweep).")
@click.option("--iters", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="Timed all-reduce iterations per message size (after a warm-up); more gives steadier bandwidth.")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto", show_default=True,
              help="auto: NCCL on GPUs, gloo on CPU clusters.")
@json_option
def check_nccl(inventory, parallel, deadline, sizes, iters, backend, as_json):
    """Prove the nodes can all-reduce: one process per GPU on every node, result verified.

    Measures algbw/busbw per message size (busbw = algbw x 2(n-1)/n, as nccl-tests), reads the
    transport NCCL chose (NET/IB vs NET/Socket), and checks each node's VLLM_HOST_IP, Ray IP and
    socket interface. Exit 0 only on pass.

    Example: bootstrap check-nccl -i hosts.yaml
    """
    def go():
        res = face.check_nccl(read_inventory(inventory), parallel=parallel, reporter=LineReporter(quiet=as_json),
                              deadline=deadline, sizes=sizes, iters=iters, backend=backend)
        render.nccl(res.result, as_json)
        exit_on(res)
    _run(go)


# -- check-kv ------------------------------------------------------------------------------------
@main.command("check-kv")
@host_options
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="The side channel's TCP port on the prefill heads (default: cluster.ports.kv_transfer; "
                   "give another while a disaggregated fleet serves, since its members hold that one).")
@json_option
def check_kv(inventory, parallel, port, as_json):
    """Prove the KV cache can move: each decode node reads each prefill node's buffer over NIXL.

    For a disaggregated fleet (cluster.router.prefill), after `up`: the same check `serve` runs
    before it starts the replicas (checks/kv_check.py in the cluster containers: a 16 MiB buffer in
    the KV cache's memory, GPU on GPU nodes, read in 64 blocks with the members' UCX variables, every
    byte checked, the transfer's notification received). Prints each pair's GB/s and the transport
    UCX chose; with infiniband: true, reads over TCP are a warning. Exit 0 only when every pair passed.

    Example: bootstrap check-kv -i hosts.yaml
    """
    def go():
        inv = read_inventory(inventory)
        check_kv_port(inv, port)
        res = face.check_kv(inv, port=port, parallel=parallel, reporter=LineReporter(quiet=as_json))
        render.kv_check(res.pairs, res.infiniband, as_json)
        exit_on(res)
    _run(go)


# -- doctor --------------------------------------------------------------------------------------
@main.command()
@host_options
@json_option
def doctor(inventory, parallel, as_json):
    """Find out why the cluster misbehaves: preflight, cluster and log checks, each with a fix.

    Looks for known failure signatures (wrong VLLM_HOST_IP, Gloo on loopback, NCCL on sockets with
    InfiniBand configured, image without Ray, missing nodes, clock skew, low disk...). Exit 1 when
    any finding is an error.

    Example: bootstrap doctor -i hosts.yaml
    """
    def go():
        res = face.doctor(read_inventory(inventory), parallel=parallel)
        render.doctor(res.inv, res.report, as_json)
        exit_on(res)
    _run(go)


# -- logs ----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
@become_option
@click.argument("hosts", nargs=-1)
@renamed("--hosts", "--limit", "only", callback=check_host_names)
@click.option("--limit", "only", metavar="HOSTS", default=None, callback=check_host_names,
              help="Only these hosts, comma-separated (the same as naming them as arguments; default: all).")
@click.option("--node", "groups", flag_value="node", multiple=True,
              help="The node containers' logs (Ray, or the native mode's holder; the NCCL check).")
@click.option("--serve", "groups", flag_value="serve", multiple=True,
              help="vLLM's own output (the serve log in the cluster container, or each replica member's serve "
                   "container) and the keepers that restart it.")
@click.option("--router", "groups", flag_value="router", multiple=True, help="vllm-router's log (replicas).")
@click.option("--monitor", "groups", flag_value="monitor", multiple=True,
              help="Prometheus' log (after `bootstrap monitor up`).")
@click.option("--since", default=None, metavar="WHEN",
              help="Only lines since WHEN: a duration back from now (30s, 10m, 2h, 1d) or a UTC time "
                   "(2026-11-25T22:10:00Z).")
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines (Ctrl-C to stop).")
@click.option("--tail", type=click.IntRange(0), default=200, show_default=True, help="Lines of history per log.")
@click.option("--model", default=None, metavar="NAME",
              help="A pool (inventory models:): only the hosts of this model's replicas.")
@parallel_option
@json_option
def logs(inventory, hosts, only, groups, since, follow, tail, model, parallel, as_json):
    """Every log of the cluster, or the ones chosen, each line with its host and source.

    Sources: node (each host's cluster container: Ray or the native mode's holder), vllm (vLLM's own
    output: the serve log inside the cluster container, or each replica member's serve container),
    keeper and router (replicas), prometheus (after `monitor up`). --node, --serve, --router and
    --monitor choose (several combine); none: all there is. A source a host does not hold is
    skipped, and named on stderr when asked for. Exit 1 when a log could not be read.

    In a pool (inventory models:) each vLLM line names its model (vllm[chat]); --model NAME reads
    only that model's hosts.

    Example: bootstrap logs -i hosts.yaml --serve --since 10m node2
    """
    def go():
        inv = read_inventory(inventory)
        names = tuple(dict.fromkeys((*hosts, *(only or ()))))
        check_hosts(inv, names)
        if model is not None:
            names = face.model_hosts(inv, model, names)
        emit = render.log_echo(max(len(h.name) for h in inv.hosts), as_json, [m.name for m in inv.models])
        res = face.logs(inv, emit, hosts=names, groups=groups, tail=tail, since=since, follow=follow,
                        parallel=parallel, stop=threading.Event())
        if res.result is not None:
            render.logs_result(res.result, asked=res.asked)
        exit_on(res)
    _run(go)
