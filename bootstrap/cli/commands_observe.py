"""The observing commands and the sandbox: top, monitor up/status/down, sandbox up/down (each one call to the face).
"""
from __future__ import annotations

import sys

import click

from bootstrap import face
from bootstrap.cli import render
from bootstrap.cli.app import _run, exit_on, main
from bootstrap.cli.become import become_option
from bootstrap.cli.params import (
    SECONDS,
    Seconds,
    accept_keys_option,
    confirm,
    host_options,
    inventory_option,
    json_option,
    read_inventory,
    renamed,
    yes_option,
)
from bootstrap.cli.render import LineReporter
from bootstrap.errors import ExitStatus


# -- top -----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
@become_option
@click.option("--interval", type=Seconds(0.5, 60), default=2.0, show_default=True,
              help="Seconds between looks.")
@click.option("--once", is_flag=True, help="Take two looks --interval apart, print one frame and exit.")
@click.option("--source", type=click.Choice(["auto", "prometheus", "probe"]), default="auto", show_default=True,
              help="prometheus: the cluster's Prometheus (bootstrap monitor up); probe: ask every container; "
                   "auto: Prometheus when it runs.")
@json_option
def top(inventory, interval, once, source, as_json):
    """A live view of every replica and node: requests running/waiting, requests/s, output tokens/s,
    TTFT and ITL p50/p95 over the last minute, KV cache use, CPU, memory and GPUs.

    With `bootstrap monitor up` running it reads Prometheus (rates and percentiles over the last
    minute); else each look runs a small probe in every host's container over SSH, in parallel. A
    host, container or vLLM that does not answer is a red row (exit 1 with --once/--json).

    Example: bootstrap top -i hosts.yaml            (bootstrap top -i hosts.yaml --once --json: one sample)
    """
    def go():
        inv = read_inventory(inventory, require_secrets=False)  # the probes read nothing secret
        with face.top(inv, source=source, interval=interval, on_fallback=render.top_without_prometheus) as view:
            if once or as_json:
                frame = view.once()
                render.top(inv, frame, as_json)
                if frame.down:
                    sys.exit(int(ExitStatus.ERROR))
                return
            render.top_live(inv, view.look, interval)
    _run(go)


# -- monitor -------------------------------------------------------------------------------------
@main.group()
def monitor():
    """Prometheus for the cluster: a node exporter on every host, Prometheus on one host
    (cluster.monitor.host, default the head) scraping vLLM, the router, Ray and the exporters.

    Example: bootstrap monitor up -i hosts.yaml
    """


@monitor.command("up")
@host_options
@renamed("--wait", "--timeout", "wait", SECONDS)
@click.option("--timeout", "wait", type=SECONDS, default=120.0, show_default=True,
              help="Seconds to wait for every target to be up.")
@json_option
def monitor_up(inventory, parallel, wait, as_json):
    """Start (or update) the exporters and Prometheus; the scrape configuration is generated from
    the inventory on every run, and a running Prometheus reloads it. Exit 1 if an exporter, Ray or
    Prometheus target is down (vLLM's and the router's come up when `serve` runs).

    Example: bootstrap monitor up -i hosts.yaml
    """
    def go():
        res = face.monitor_up(read_inventory(inventory, require_secrets=False), parallel=parallel, wait=wait,
                              reporter=LineReporter(quiet=as_json))
        render.monitor_up(res.inv, res.result, as_json)
        exit_on(res)
    _run(go)


@monitor.command("status")
@host_options
@json_option
def monitor_status(inventory, parallel, as_json):
    """List every scrape target up or down, as Prometheus sees it (exit 1 if one is down).

    Example: bootstrap monitor status -i hosts.yaml
    """
    def go():
        res = face.monitor_status(read_inventory(inventory, require_secrets=False), parallel=parallel)
        render.monitor_status(res.result, as_json)
        exit_on(res)
    _run(go)


@monitor.command("down")
@host_options
@click.option("--purge", is_flag=True, help="Also delete Prometheus' stored samples (its data volume); asks first.")
@yes_option
@json_option
def monitor_down(inventory, parallel, purge, yes, as_json):
    """Remove Prometheus and the exporters from every host.

    With --purge it also deletes Prometheus' stored samples, and asks first (`[y/N]`; --yes where no
    terminal can answer).

    Example: bootstrap monitor down -i hosts.yaml --purge --yes
    """
    def go():
        inv = read_inventory(inventory, require_secrets=False)
        if purge:
            confirm(face.purge_preview(inv), yes)
        res = face.monitor_down(inv, parallel=parallel, purge=purge, reporter=LineReporter(quiet=as_json))
        render.monitor_down(res.result, purge, as_json)
    _run(go)


# -- sandbox -------------------------------------------------------------------------------------
@main.group()
def sandbox():
    """A local cluster of simulated hosts (containers with their own IP, sshd and Docker daemon).

    Needs a running Docker engine on this machine; no GPU. Example: bootstrap sandbox up --nodes 3
    """


@sandbox.command("up")
@click.option("--nodes", type=click.IntRange(1, 200), default=3, show_default=True,
              help="Simulated hosts; the first is the head. A running sandbox grows without a restart.")
@click.option("--kind", type=click.Choice(["full", "sshd"]), default="full", show_default=True,
              help="full: sshd + Docker daemon per node; sshd: sshd only (fan-out benchmarks).")
@click.option("--without-ray", is_flag=True,
              help="Write the inventory with a Ray-less variant of the vLLM image, as stock vllm/vllm-openai "
                   "images are: `up` then runs vLLM's native multi-node mode. Again without it: the image with Ray.")
@click.option("--gpus", type=click.IntRange(0, 16), default=0, show_default=True,
              help="GPU-shaped nodes: each shows this many (recorded H100) GPUs to nvidia-smi, and its Docker "
                   "accepts --gpus all as with the NVIDIA Container Toolkit; no real GPU is used.")
@click.option("--ib", type=click.Choice(["infiniband", "roce"]), default=None,
              help="Give each node InfiniBand or RoCE ports under /sys/class/infiniband and /dev/infiniband.")
@click.option("--hcas", type=click.IntRange(1, 8), default=1, show_default=True,
              help="HCAs per node with --ib (mlx5_0, mlx5_1, ...).")
@click.option("--registry-link", metavar="RATE", default=None,
              help="Cap what the registry sends, shared by every node that pulls (Linux tc; e.g. 100mbit): a "
                   "registry uplink thinner than the fabric, as on a rack. Without it: unshaped.")
@click.option("--node-link", metavar="RATE", default=None,
              help="Cap what each node sends (Linux tc; e.g. 1gbit): the node-to-node fabric. Without it: unshaped.")
@click.option("--mixed", is_flag=True,
              help="A mixed rack: node3 runs Debian 13 with its Docker 26.1, the containerd image store on, and (with "
                   "--gpus) its GPUs through CDI only; the others Debian 12 and Docker 20.10. Needs --nodes 3 or more.")
def sandbox_up(nodes, kind, without_ray, gpus, ib, hcas, registry_link, node_link, mixed):
    """Build the images (cached), start the registry and N nodes, write their inventory.

    Example: bootstrap sandbox up --nodes 3

    Example (GPU-shaped): bootstrap sandbox up --nodes 2 --gpus 8 --ib roce

    Example (rack-shaped links): bootstrap sandbox up --nodes 4 --registry-link 100mbit --node-link 1gbit

    Example (a mixed rack): bootstrap sandbox up --nodes 3 --gpus 2 --mixed
    """
    _run(lambda: render.sandbox_up(face.sandbox_up(nodes, kind=kind, ray=not without_ray, gpus=gpus, ib=ib, hcas=hcas,
                                                   registry_link=registry_link, node_link=node_link, mixed=mixed,
                                                   log=render.sandbox_log).info))


@sandbox.command("down")
def sandbox_down():
    """Remove the sandbox nodes, registry container and network.

    Example: bootstrap sandbox down
    """
    def go():
        face.sandbox_down(log=render.sandbox_log)
        render.sandbox_down()
    _run(go)
