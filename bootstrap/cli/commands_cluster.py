"""The cluster commands: validate, plan, up, status, exec and down (each one call to the library face).
"""
from __future__ import annotations

import click

from bootstrap import face
from bootstrap.cli import render
from bootstrap.cli.app import _run, exit_on, main
from bootstrap.cli.become import become_option
from bootstrap.cli.params import (
    SECONDS,
    Seconds,
    check_command_words,
    check_host_names,
    confirm,
    host_options,
    inventory_option,
    inventory_path,
    json_option,
    lock_timeout_option,
    parallel_option,
    read_inventory,
    renamed,
    yes_option,
)
from bootstrap.cli.render import LineReporter


# -- validate ------------------------------------------------------------------------------------
@main.command()
@inventory_option
@click.option("--offline", is_flag=True,
              help="Check the file alone, not the key files nor the secrets' values: what a CI job can run.")
@json_option
def validate(inventory, offline, as_json):
    """Check an inventory (and its key files) without contacting any host: every mistake at once, one
    line each, in the order of the file (exit 2 when there is one).

    Example: bootstrap validate -i hosts.yaml; in a CI job: bootstrap validate --offline --json -i hosts.yaml
    """
    def go():
        res = face.validate(inventory_path(inventory), offline=offline)
        render.validated(res, as_json)
        exit_on(res)
    _run(go)


# -- plan ----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@json_option
def plan(inventory, as_json):
    """Print the exact container each host gets, from the inventory alone.

    Secrets are shown by name only. `bootstrap up --dry-run` also contacts the hosts and says what
    would change.

    Example: bootstrap plan -i inventory/example.yaml
    """
    _run(lambda: render.plan_result(face.plan(read_inventory(inventory, check_files=False)), as_json))


# -- sudoers -------------------------------------------------------------------------------------
@main.command()
@inventory_option
@click.option("--user", default=None, metavar="NAME",
              help="The SSH user the rule is for. Without it: every host's SSH user that is not root.")
@click.option("--nopasswd", is_flag=True, help="Let the user run them without its password (then no -K is needed).")
def sudoers(inventory, user, nopasswd):
    """Print the sudoers rule that lets a non-root SSH user run exactly what bootstrap runs as root.

    Every command this cluster runs as root (the fence, the secrets on /run, the exposure report's `ss`,
    sudo's own check), whole and for this cluster's name only: least privilege where the SSH user may not
    have `ALL`. Install it with `visudo -f /etc/sudoers.d/bootstrap` on every host; see docs/security.md.

    Example: bootstrap sudoers -i hosts.yaml --user ops > bootstrap.sudoers
    """
    _run(lambda: render.sudoers(face.sudoers(read_inventory(inventory, check_files=False, require_secrets=False),
                                             user, nopasswd)))


# -- up ------------------------------------------------------------------------------------------
@main.command()
@inventory_option
@parallel_option
@click.option("--dry-run", is_flag=True, help="Connect and gather facts, print what would change, change nothing.")
@click.option("--load-image", is_flag=True, default=None,
              help="Stream the image from this machine (docker save | ssh docker load) instead of pulling.")
@click.option("--pull", is_flag=True, help="Pull the image on every host even when present (picks up a moved tag).")
@click.option("--timeout", "wait", type=SECONDS, default=180.0, show_default=True,
              help="Seconds to wait for Ray to report every node.")
@renamed("--wait", "--timeout", "wait", SECONDS)
@click.option("--accept-new-host-keys", is_flag=True, default=None,
              help="Trust and record SSH host keys not yet known (changed keys are still refused).")
@become_option
@click.option("--allow-partial", is_flag=True,
              help="Start the cluster on the hosts that pass connect and preflight; workers that do not are "
                   "left as they are and named (the head is never optional).")
@click.option("--skip-check", "skip_checks", multiple=True, type=click.Choice(sorted(face.RACK_CHECKS)),
              help="Skip one check of the rack preflight (repeatable); every check runs by default: "
                   + "; ".join(f"{k}: {v}" for k, v in face.RACK_CHECKS.items()) + ".")
@lock_timeout_option
@click.option("-y", "--yes", is_flag=True,
              help="Do not ask before recreating running containers (a changed spec or image): needed where "
                   "no terminal can answer (a script, CI).")
@json_option
def up(inventory, parallel, dry_run, load_image, pull, wait, accept_new_host_keys, allow_partial, skip_checks,
       lock_wait, yes, as_json):
    """Start the vLLM container on every host: the Ray head, then the workers.

    Idempotent: a second run with the same inventory changes nothing; a changed spec recreates
    only the affected containers (and all workers when the head changes). Before it stops a running
    container it names each and asks [y/N] (--yes: do not ask; no terminal: refused, exit 2, nothing
    stopped). Before anything changes,
    a preflight refuses hosts that would break the cluster later (Docker, GPUs, the data-plane
    interface and MTU, InfiniBand/RoCE ports, clocks, /dev/shm, nofile), one line per host with the fix.

    Example: bootstrap up -i hosts.yaml
    """
    opts = dict(parallel=parallel, dry_run=dry_run, load_image=load_image, pull=pull, wait=wait,
                accept_new_host_keys=accept_new_host_keys, allow_partial=allow_partial, lock_wait=lock_wait,
                skip_checks=frozenset(skip_checks))

    def starting(k, hosts):
        if not as_json:
            render.up_replica(k, hosts)

    def shown(res):
        render.left_out(res.result.skipped)
        if dry_run:
            render.plan_result(res.plan, as_json)
        else:
            render.up(res.inv, res.result, res.label, res.seconds, res.started_at, as_json)
    def go():
        inv = read_inventory(inventory)
        face.up(inv, reporter=LineReporter(quiet=as_json), on_replica=starting, on_result=shown,
                approve=None if dry_run else render.up_approve(inv.path, yes, as_json), **opts)
    _run(go)


# -- status --------------------------------------------------------------------------------------
@main.command()
@host_options
@json_option
@click.option("--exposure", is_flag=True,
              help="Instead: every port of the cluster's listening on every host, how it is bound, whether it asks "
                   "for credentials, and who can reach it (exit 1 when one is open to non-members beyond SSH and "
                   "the served endpoint).")
def status(inventory, parallel, as_json, exposure):
    """Show each host's container state and whether Ray sees it (exit 1 if any node is not alive).

    Then what `serve` runs (model, endpoint, health, backend, TP/PP, nodes, uptime, KV cache), the
    Ray dashboard address, and the Prometheus address when `monitor up` runs. With replicas: each
    replica's nodes, then each replica as the router sees it (exit 1 unless every one is healthy).

    With --exposure: the cluster's listening sockets as a stranger would meet them (see
    docs/security.md, "The fence").

    Example: bootstrap status -i hosts.yaml --json
    """
    def go():
        res = face.status(read_inventory(inventory), parallel=parallel, exposure=exposure, prometheus=not as_json,
                          reporter=LineReporter(quiet=as_json))
        render.status_result(res, as_json)
        exit_on(res)
    _run(go)


# -- exec ----------------------------------------------------------------------------------------
@main.command("exec")
@inventory_option
@click.option("--container", is_flag=True,
              help="Run inside each host's cluster container (docker exec <container_name>).")
@renamed("--hosts", "--limit", "only", callback=check_host_names)
@click.option("--limit", "only", metavar="HOSTS", default=None, callback=check_host_names,
              help="Only these hosts, comma-separated (default: all).")
@parallel_option
@click.option("--timeout", type=Seconds(0.1), default=None,
              help="Seconds the command may run on each host (default: the inventory's command_timeout).")
@click.option("--accept-new-host-keys", is_flag=True, default=None,
              help="Trust and record SSH host keys not yet known (changed keys are still refused).")
@become_option
@json_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, callback=check_command_words)
def exec_(inventory, container, only, parallel, timeout, accept_new_host_keys, as_json, command):
    """Run COMMAND on every host at once; each output line prefixed with its host, then a summary.

    COMMAND goes after `--` and reaches each host as argv, quoted once: nothing is expanded by a
    shell here or there. For pipes, `$VAR` or `&&`, ask for a shell: `-- sh -c 'df -h / | tail -1'`.
    Exit 0 when every host exited 0; 1 otherwise (unreachable hosts are named).

    Example: bootstrap exec -i hosts.yaml -- nvidia-smi -L
    """
    def go():
        res = face.exec_all(read_inventory(inventory), command, container=container, hosts=only, parallel=parallel,
                            timeout=timeout, accept_new_host_keys=accept_new_host_keys,
                            echo=lambda width: render.exec_echo(width, as_json))
        render.exec_results(res.results, as_json)
        exit_on(res)
    _run(go)


# -- down ----------------------------------------------------------------------------------------
@main.command()
@host_options
@lock_timeout_option
@click.option("--drain-timeout", "drain", type=SECONDS, default=120.0, show_default=True,
              help="With replicas: seconds each replica may take to finish its requests once out of the routers.")
@yes_option
@json_option
def down(inventory, parallel, lock_wait, drain, yes, as_json):
    """Stop Ray and remove the container on every host (workers first). A second run is a no-op.

    With replicas (cluster.replicas > 1) first every replica leaves the routers and finishes its
    requests (or --drain-timeout), then the keepers, the router and the serve containers go, then
    each replica's node containers: nothing of the fleet stays on a host that answers. It says what it
    removes and asks [y/N] first; where no terminal can answer (a script, CI) pass --yes.

    Example: bootstrap down -i hosts.yaml
    """
    def go():
        inv = read_inventory(inventory)
        confirm(face.down_preview(inv), yes)
        res = face.down(inv, parallel=parallel, reporter=LineReporter(quiet=as_json), lock_wait=lock_wait,
                        drain=drain)
        render.down_result(res.groups, as_json, fleet=res.fleet)
    _run(go)
