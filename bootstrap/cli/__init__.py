"""The `bootstrap` command: a thin click layer over the library; the only package that prints.

Each command reads its options (params), calls the library, prints the result (render) and exits
with its code. Progress and errors go to stderr, `--json` documents to stdout. Exit codes: see
errors.ExitStatus.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time

import click

from bootstrap.cli import render
from bootstrap.cli.params import (
    INVENTORY_BEFORE,
    SECONDS,
    FilePath,
    PassThrough,
    Seconds,
    accept_keys_option,
    check_command_words,
    check_fleet_flags,
    check_host_names,
    check_hosts,
    check_kv_port,
    check_listen,
    check_name,
    check_nonempty,
    check_parallelism,
    check_png,
    check_rollout_args,
    check_serve_args,
    check_sizes,
    check_url,
    inventory_before_option,
    inventory_option,
    json_option,
    lock_wait_option,
    parallel_option,
    read_inventory,
    text_params,
)
from bootstrap.cli.render import LineReporter
from bootstrap.cluster import plan as PL
from bootstrap.cluster import run as A
from bootstrap.cluster.rack import CHECKS as RACK_CHECKS
from bootstrap.errors import BootstrapError, ExitStatus, UsageError
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Session
from bootstrap.serve import plan as P
from bootstrap.serve.bench import MAX_TOKENS as MAX_BENCH_TOKENS


def _fail(exc: BootstrapError) -> "NoReturn":  # noqa: F821
    render.failure(exc)
    sys.exit(int(exc.exit_status))


class _Interrupts:
    """The handler of SIGINT and SIGTERM while a command runs. The first raises KeyboardInterrupt
    where the main thread is: the command stops its remote work and reports each host's state. The
    next one is only noted, not raised into that clean-up: a KeyboardInterrupt raised inside
    threading's own clean-up (Condition.wait's, Thread.join's) breaks it -- `RuntimeError: release
    unlocked lock` instead of exit 130, and locks left held. One more exits at once with 130; the
    cluster lock goes with the process's SSH connection (its remote holder exits when it closes)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.seen = 0
        self.before: dict[int, object] = {}

    def install(self) -> None:
        for signum in self.SIGNALS:
            before = signal.getsignal(signum)
            if signum == signal.SIGINT and before == signal.SIG_IGN:
                continue  # started with Ctrl-C ignored (in the background): it stays ignored
            self.before[signum] = before
            signal.signal(signum, self)

    def uninstall(self) -> None:
        """Put the handlers back, unless a signal came: the process is on its way out with 130 then,
        and one more must not change that. This handler stays while the interpreter joins its threads
        (a third signal still exits at once), then (atexit) the signals are ignored: Python puts the
        default handlers back as it finalizes, and a SIGTERM then would end it with -15, not 130."""
        if self.seen:
            atexit.register(self.ignore_late)
            return
        for signum, before in self.before.items():
            signal.signal(signum, before)  # type: ignore[arg-type]

    def ignore_late(self) -> None:
        for signum in self.before:
            signal.signal(signum, signal.SIG_IGN)

    def __call__(self, signum, frame) -> None:  # noqa: ANN001 - signal handler signature
        self.seen += 1
        if self.seen == 1:
            raise KeyboardInterrupt
        # os.write, not print: the interrupted main thread may be inside a print to stderr
        if self.seen == 2:
            os.write(2, render.INTERRUPTED_AGAIN.encode())
            return
        os.write(2, render.INTERRUPTED_AT_ONCE.encode())
        os._exit(int(ExitStatus.INTERRUPTED))


def _run(fn):
    """Call fn, mapping domain errors and interrupts to one line + a documented exit code.

    SIGTERM is handled like Ctrl-C: commands that change hosts stop their remote work and report
    each host's state (see _Interrupts)."""
    interrupts = _Interrupts()
    if threading.current_thread() is threading.main_thread():
        interrupts.install()
    try:
        return fn()
    except BootstrapError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        render.interrupted()
        sys.exit(int(ExitStatus.INTERRUPTED))
    finally:
        interrupts.uninstall()


class _KnowsCommand:
    """Usage errors from click's parser carry no context: give them this command's, so the line
    names the command (`up: Option '--parallel' requires an argument`)."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            if e.ctx is None:
                e.ctx = ctx
            raise


class _Command(_KnowsCommand, click.Command):
    pass


#: The root help's sections: every command in one (a test checks), in the order a newcomer meets them.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cluster", ("validate", "plan", "up", "status", "exec", "down")),
    ("checks", ("check-nccl", "check-kv", "doctor", "logs")),
    ("serving", ("serve", "rollout", "bench")),
    ("observe", ("top", "monitor")),
    ("sandbox (try it on one machine)", ("sandbox",)),
)
#: What each exit code means, for --help (errors.ExitStatus documents them in the code).
EXIT_MEANINGS = {
    ExitStatus.OK: "done",
    ExitStatus.ERROR: "a step on a host failed, or a check found an error",
    ExitStatus.BAD_INPUT: "bad input (inventory, arguments): nothing was touched on any host",
    ExitStatus.PREFLIGHT: "a host is not ready (unreachable, no Docker, wrong GPUs, no Ray): nothing changed",
    ExitStatus.TIMEOUT: "a deadline passed",
    ExitStatus.LOCKED: "another up/down holds the cluster lock: nothing changed",
    ExitStatus.INTERRUPTED: "interrupted (Ctrl-C, SIGTERM): each host's state is listed",
}


class _Group(_KnowsCommand, click.Group):
    """A group below the root (`monitor`, `sandbox`): its commands under click's "Commands:"
    heading, in the order they are defined (not the root's sections). Its commands and groups are
    of the same kind; `-i` given before the command reaches none of them that reads no inventory."""

    command_class = _Command
    group_class = type

    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        if (cmd is not None and not isinstance(cmd, click.Group) and ctx.meta.get(INVENTORY_BEFORE) is not None
                and not any(p.name == "inventory" for p in cmd.params)):
            raise click.UsageError(f"{ctx.command_path} {name} reads no inventory: remove -i/--inventory", ctx)
        return name, cmd, rest


class _Main(_Group):
    """The root command: click's usage errors (bad value, missing argument, unknown option or
    command) become one line on stderr and exit 2, like every other error here. Its groups
    (`monitor`, `sandbox`) are _Groups."""

    group_class = _Group

    def list_commands(self, ctx) -> list[str]:
        return click.Group.list_commands(self, ctx)

    def format_commands(self, ctx, formatter) -> None:
        """The commands in SECTIONS, a section each; one not placed there goes under "other"."""
        listed = {n for _, names in SECTIONS for n in names}
        rest = sorted(n for n in self.list_commands(ctx) if n not in listed)
        for title, names in (*SECTIONS, ("other", tuple(rest))):
            rows = [(n, self.commands[n].get_short_help_str(formatter.width - 6 - 12))
                    for n in names if n in self.commands and not self.commands[n].hidden]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx, formatter) -> None:
        with formatter.section("Exit codes"):
            formatter.write_dl([(str(int(s)), EXIT_MEANINGS[s]) for s in ExitStatus])
        with formatter.section("Shell completion"):
            formatter.write_text('bash: eval "$(_BOOTSTRAP_COMPLETE=bash_source bootstrap)" in ~/.bashrc '
                                 '(zsh_source, fish_source for zsh and fish)')

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name or render.PROG, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # a bare group: its help, as click does
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            render.usage_error(e)
            sys.exit(int(ExitStatus.BAD_INPUT) if isinstance(e, click.UsageError) else e.exit_code)
        except click.Abort:
            render.aborted()
            sys.exit(int(ExitStatus.INTERRUPTED))
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@inventory_before_option
@click.version_option(package_name="bootstrap-vllm")
def main() -> None:
    """Turn GPU machines reachable over SSH and running Docker into one vLLM serving service.

    \b
    bootstrap up -i hosts.yaml           start a vLLM container on every host, joined as one cluster
    bootstrap check-nccl -i hosts.yaml   prove the nodes can all-reduce, with bandwidth
    bootstrap serve -i hosts.yaml MODEL  serve MODEL with a split the model can take

    Every command takes -i/--inventory (default $BOOTSTRAP_INVENTORY, then ./hosts.yaml), before
    or after its name, and -h/--help. The documentation: docs/ in the repository (mkdocs serve).
    """


# -- validate ------------------------------------------------------------------------------------
@main.command()
@inventory_option
def validate(inventory):
    """Check an inventory (and its key files) without contacting any host.

    Example: bootstrap validate -i hosts.yaml
    """
    _run(lambda: render.validated(read_inventory(inventory)))


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
    def go():
        inv = read_inventory(inventory, check_files=False)
        if inv.cluster.replicas == 1:
            rt = inv.cluster.runtime
            render.plan_rows(PL.plan_offline(inv), as_json, live=False, runtime=rt,
                             why=f"cluster.runtime: {rt}" if rt else PL.UNDECIDED_NOTE)
            return
        from bootstrap.fleet import plan as FP

        urls = [FP.replica_url(inv, k) for k in range(inv.cluster.replicas)]
        groups = [PL.plan_offline(FP.replica_inventory(inv, k)) for k in range(inv.cluster.replicas)]
        ifaces = {h.name: f"<the interface of {h.ip}>" for h in FP.router_hosts(inv)}
        render.fleet_plan(list(zip(urls, groups)), FP.plan_routers(inv, urls, ifaces=ifaces), FP.router_url(inv),
                          FP.keeper_create_argv(inv), as_json,
                          standby=FP.standby_name(inv) if inv.cluster.standby else None)
    _run(go)


# -- up ------------------------------------------------------------------------------------------
@main.command()
@inventory_option
@parallel_option
@click.option("--dry-run", is_flag=True, help="Connect and gather facts, print what would change, change nothing.")
@click.option("--load-image", is_flag=True, default=None,
              help="Stream the image from this machine (docker save | ssh docker load) instead of pulling.")
@click.option("--pull", is_flag=True, help="Pull the image on every host even when present (picks up a moved tag).")
@click.option("--wait", type=SECONDS, default=180.0, show_default=True,
              help="Seconds to wait for Ray to report every node.")
@click.option("--accept-new-host-keys", is_flag=True, default=None,
              help="Trust and record SSH host keys not yet known (changed keys are still refused).")
@click.option("--allow-partial", is_flag=True,
              help="Start the cluster on the hosts that pass connect and preflight; workers that do not are "
                   "left as they are and named (the head is never optional).")
@click.option("--skip-check", "skip_checks", multiple=True, type=click.Choice(sorted(RACK_CHECKS)),
              help="Skip one check of the rack preflight (repeatable); every check runs by default: "
                   + "; ".join(f"{k}: {v}" for k, v in RACK_CHECKS.items()) + ".")
@lock_wait_option
@json_option
def up(inventory, parallel, dry_run, load_image, pull, wait, accept_new_host_keys, allow_partial, skip_checks,
       lock_wait, as_json):
    """Start the vLLM container on every host: the Ray head, then the workers.

    Idempotent: a second run with the same inventory changes nothing; a changed spec recreates
    only the affected containers (and all workers when the head changes). Before anything changes,
    a preflight refuses hosts that would break the cluster later (Docker, GPUs, the data-plane
    interface and MTU, InfiniBand/RoCE ports, clocks, /dev/shm, nofile), one line per host with the fix.

    Example: bootstrap up -i hosts.yaml
    """
    opts = dict(parallel=parallel, dry_run=dry_run, load_image=load_image, pull=pull, wait=wait,
                accept_new_host_keys=accept_new_host_keys, allow_partial=allow_partial, lock_wait=lock_wait,
                skip_checks=frozenset(skip_checks))

    def go():
        inv = read_inventory(inventory)
        rep = LineReporter(quiet=as_json)
        if inv.cluster.replicas > 1:
            # Each replica is a serving group of its own: its own head and Ray cluster.
            from bootstrap.fleet import lifecycle as FLC

            def starting(k, group):
                if not as_json:
                    render.up_replica(k, inv.replicas[k])
            FLC.up_fleet(inv, reporter=rep, on_replica=starting,
                         on_done=lambda r: shown(r.inv, r.result, f" replica {r.index}", r.seconds, r.started_at),
                         **opts)
            return
        t0 = time.monotonic()
        started_at = time.time()
        res = A.up(inv, reporter=rep, **opts)
        shown(inv, res, "", time.monotonic() - t0, started_at)

    def shown(inv, res, label, total, started_at):
        render.left_out(res.skipped)
        if dry_run:
            render.plan_rows(res.actions, as_json, live=True, runtime=res.runtime, why=res.runtime_why)
        else:
            render.up(inv, res, label, total, started_at, as_json)
    _run(go)


# -- status --------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
@parallel_option
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
    from bootstrap.serve.state import serving_state

    def go():
        inv = read_inventory(inventory)
        if exposure:
            from bootstrap.cluster.guard import run as GD

            found = GD.exposure_report(inv, parallel=parallel, reporter=LineReporter(quiet=as_json))
            render.exposure(inv, found, as_json)
            if any(e.open_beyond for e in found):
                sys.exit(int(ExitStatus.ERROR))
            return
        if inv.cluster.replicas > 1:
            return _status_fleet(inv, parallel, as_json)
        st = A.cluster_status(inv, parallel=parallel, serving=serving_state)
        render.status(inv, st, as_json)
        if not as_json:
            _prometheus(inv)
        if not all(r.ray_alive for r in st.nodes):
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


def _status_fleet(inv, parallel: int, as_json: bool) -> None:
    """status with replicas: each group's nodes (its own Ray cluster), then each replica as the
    router sees it. Exit 1 when a node is not alive or a replica does not serve."""
    from bootstrap.fleet import lifecycle as FLC

    st = FLC.fleet_status(inv, parallel=parallel)
    render.fleet_status(inv, st.groups, st.fleet, as_json)
    if not as_json:
        _prometheus(inv)
    if not st.ok:
        sys.exit(int(ExitStatus.ERROR))


def _prometheus(inv) -> None:
    """The Prometheus line under status: whether it runs, and where."""
    from bootstrap.monitor import plan as MP
    from bootstrap.monitor import run as MON

    try:
        url = MON.running_url(inv)
    except BootstrapError as exc:  # the monitor host or its Docker does not answer: unknown, not "not running"
        render.prometheus_unknown(exc)
        return
    render.prometheus(url, MP.monitor_host(inv) if url else None, inv.cluster.monitor.port)


# -- exec ----------------------------------------------------------------------------------------
@main.command("exec")
@inventory_option
@click.option("--container", is_flag=True,
              help="Run inside each host's cluster container (docker exec <container_name>).")
@click.option("--hosts", "only", default=None, callback=check_host_names,
              help="Only these hosts, comma-separated (default: all).")
@parallel_option
@click.option("--timeout", type=Seconds(0.1), default=None,
              help="Seconds the command may run on each host (default: the inventory's command_timeout).")
@click.option("--accept-new-host-keys", is_flag=True, default=None,
              help="Trust and record SSH host keys not yet known (changed keys are still refused).")
@json_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, callback=check_command_words)
def exec_(inventory, container, only, parallel, timeout, accept_new_host_keys, as_json, command):
    """Run COMMAND on every host at once; each output line prefixed with its host, then a summary.

    COMMAND goes after `--` and reaches each host as argv, quoted once: nothing is expanded by a
    shell here or there. For pipes, `$VAR` or `&&`, ask for a shell: `-- sh -c 'df -h / | tail -1'`.
    Exit 0 when every host exited 0; 1 otherwise (unreachable hosts are named).

    Example: bootstrap exec -i hosts.yaml -- nvidia-smi -L
    """
    from bootstrap.cluster import exec as E

    def go():
        inv = read_inventory(inventory)
        try:
            width = max(len(h.name) for h in E.select_hosts(inv, only))
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="--hosts") from None
        res = E.exec_all(inv, command, container=container, hosts=only, parallel=parallel, timeout=timeout,
                         accept_new_host_keys=accept_new_host_keys, on_result=render.exec_echo(width, as_json))
        render.exec_results(res, as_json)
        if not all(r.ok for r in res):
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


# -- down ----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
@parallel_option
@lock_wait_option
@json_option
def down(inventory, parallel, lock_wait, as_json):
    """Stop Ray and remove the container on every host (workers first). A second run is a no-op.

    With replicas (cluster.replicas > 1) first the keepers, the router and the serve containers, then
    each replica's node containers: nothing of the fleet stays on a host that answers.

    Example: bootstrap down -i hosts.yaml
    """
    def go():
        inv = read_inventory(inventory)
        rep = LineReporter(quiet=as_json)
        if inv.cluster.replicas > 1:
            from bootstrap.fleet import lifecycle as FLC

            res = FLC.down_fleet(inv, parallel=parallel, reporter=rep, lock_wait=lock_wait)
            render.down_result(list(res.replicas), as_json, fleet=res.fleet_removed)
            return
        render.down_result([A.down(inv, parallel=parallel, reporter=rep, lock_wait=lock_wait)], as_json)
    _run(go)


# -- check-nccl ----------------------------------------------------------------------------------
@main.command("check-nccl")
@inventory_option
@accept_keys_option
@parallel_option
@click.option("--deadline", type=SECONDS, default=180.0, show_default=True,
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
    from bootstrap.nccl import run as X

    def go():
        inv = read_inventory(inventory)
        res = X.check_nccl(inv, parallel=parallel, reporter=LineReporter(quiet=as_json), deadline=deadline,
                           sizes=sizes, iters=iters, backend=backend)
        render.nccl(res, as_json)
        if not res.ok:
            sys.exit(int(ExitStatus.TIMEOUT if res.timed_out else ExitStatus.ERROR))
    _run(go)


# -- check-kv ------------------------------------------------------------------------------------
@main.command("check-kv")
@inventory_option
@accept_keys_option
@parallel_option
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
    from bootstrap.fleet import run as FL

    def go():
        inv = read_inventory(inventory)
        check_kv_port(inv, port)
        res = FL.check_kv(inv, port=port, parallel=parallel, reporter=LineReporter(quiet=as_json))
        render.kv_check(res, inv.cluster.infiniband, as_json)
        if not all(r.ok for r in res):
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


# -- doctor --------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
@parallel_option
@json_option
def doctor(inventory, parallel, as_json):
    """Find out why the cluster misbehaves: preflight, cluster and log checks, each with a fix.

    Looks for known failure signatures (wrong VLLM_HOST_IP, Gloo on loopback, NCCL on sockets with
    InfiniBand configured, image without Ray, missing nodes, clock skew, low disk...). Exit 1 when
    any finding is an error.

    Example: bootstrap doctor -i hosts.yaml
    """
    from bootstrap.doctor import run as X

    def go():
        inv = read_inventory(inventory)
        rep = X.doctor(inv, parallel=parallel)
        render.doctor(inv, rep, as_json)
        if not rep.ok:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


# -- logs ----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
@click.argument("hosts", nargs=-1)
@click.option("--hosts", "only", default=None, callback=check_host_names,
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
@parallel_option
@json_option
def logs(inventory, hosts, only, groups, since, follow, tail, parallel, as_json):
    """Every log of the cluster, or the ones chosen, each line with its host and source.

    Sources: node (each host's cluster container: Ray or the native mode's holder), vllm (vLLM's own
    output: the serve log inside the cluster container, or each replica member's serve container),
    keeper and router (replicas), prometheus (after `monitor up`). --node, --serve, --router and
    --monitor choose (several combine); none: all there is. A source a host does not hold is
    skipped, and named on stderr when asked for. Exit 1 when a log could not be read.

    Example: bootstrap logs -i hosts.yaml --serve --since 10m node2
    """
    from bootstrap.doctor import logsources as LS
    from bootstrap.doctor import run as X

    def go():
        inv = read_inventory(inventory)
        names = tuple(dict.fromkeys((*hosts, *(only or ()))))
        check_hosts(inv, names)
        try:
            start = LS.parse_since(since, time.time()) if since is not None else None
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
        emit = render.log_echo(max(len(h.name) for h in inv.hosts), as_json)
        stop = threading.Event()
        try:
            res = X.logs(inv, emit, hosts=names, sources=LS.sources_for(groups), tail=tail, since=start,
                         follow=follow, parallel=parallel, stop=stop)
        except KeyboardInterrupt:
            stop.set()
            return
        render.logs_result(res, asked=bool(groups))
        if res.failed or not res.read:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


# -- serve ---------------------------------------------------------------------------------------
@main.command(cls=PassThrough, context_settings={"ignore_unknown_options": True})
@inventory_option
@accept_keys_option
@parallel_option
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
@click.option("--wait", type=SECONDS, default=900.0, show_default=True,
              help="Seconds to wait for /health and /v1/models.")
@click.option("--listen", default=None, callback=check_listen,
              help="Address vLLM binds (default: the head's data-plane IP).")
@click.option("--served-model-name", default=None, callback=check_name,
              help="The model name clients send in requests (vLLM's --served-model-name; default: the MODEL argument).")
@click.option("--stop", is_flag=True, help="Stop serving; the Ray cluster keeps running.")
@click.option("--dry-run", is_flag=True,
              help="Read the model's config.json, print the plan (backend, TP/PP and why, each node's command) "
                   "and stop; secrets need not be set.")
@json_option
def serve(inventory, parallel, model, extra, tp, pp, dp, ep, all2all, backend, sync_model, wait, listen,
          served_model_name, stop, dry_run, as_json):
    """Serve MODEL (a Hugging Face id or a path inside the containers) across the cluster.

    Defaults: the split is read from the model's config.json: TP = GPUs per node and PP = nodes
    when the model takes it, else the largest TP its attention heads allow with the rest as PP
    (on a CPU cluster: TP across the nodes first). The backend follows the cluster: native on CPU
    or without Ray, ray on GPU clusters running Ray. The plan is printed before anything starts
    (--dry-run stops there). Extra vLLM flags go after `--`. Waits for /health and /v1/models,
    then prints the endpoint, a curl to paste, and the KV cache capacity.

    Example: bootstrap serve -i hosts.yaml meta-llama/Llama-3.1-405B-Instruct -- --max-model-len 8192
    """
    from bootstrap.serve import run as V

    check_serve_args(click.get_current_context(), model, extra, stop, dry_run)

    def go():
        inv = read_inventory(inventory, require_secrets=not dry_run)
        check_parallelism(inv, tp, pp, dp, ep=ep or all2all is not None)
        if inv.cluster.replicas > 1:
            return _serve_fleet(inv, model, extra, tp, pp, dp, backend, sync_model, wait, listen, served_model_name,
                                stop, dry_run, as_json, parallel)
        if stop:
            V.stop(inv, parallel=parallel, reporter=LineReporter(quiet=as_json))
            render.serve_stopped()
            return
        show = None if as_json else (lambda plan: render.serve_plan(plan, dry_run))
        try:
            res = V.serve(inv, model, tp=tp, pp=pp, dp=dp, ep=ep, all2all=all2all, backend=backend, extra=extra,
                          sync_model=sync_model, wait=wait, listen=listen, served_name=served_model_name,
                          parallel=parallel, dry_run=dry_run, on_plan=show, reporter=LineReporter(quiet=as_json))
        except P.ModelSplitError as exc:
            msg = str(exc)
            given = tp is not None or pp is not None or dp is not None
            if given and msg.startswith(("TP=", "DP=")):  # the split the user's option asked for
                msg = f"{'--dp' if dp is not None else '--tp/--pp'}: {msg}"
            raise click.UsageError(msg) from None
        except V.ServeFailed as exc:
            render.serve_failed(exc)
            raise
        if isinstance(res, V.ServePlan):
            render.dry_run(res, as_json)
        else:
            render.served(res, as_json)
    _run(go)


def _serve_fleet(inv, model, extra, tp, pp, dp, backend, sync_model, wait, listen, served_name, stop, dry_run,
                 as_json, parallel) -> None:
    """serve with cluster.replicas > 1: every replica, then the router in front."""
    from bootstrap.fleet import plan as FP
    from bootstrap.fleet import run as FL
    from bootstrap.serve import run as V

    if sync_model:
        raise click.UsageError("--sync-model copies from one head: with replicas, put the model on every host "
                               "(or in the image, or the HF cache)")
    if listen is not None:
        raise click.UsageError("--listen: with replicas every vLLM binds its head's data-plane IP, where the router "
                               "reaches it; set cluster.router.host/port for the endpoint")
    rep = LineReporter(quiet=as_json)
    if stop:
        FL.stop_fleet(inv, parallel=parallel, reporter=rep)
        render.fleet_serve_stopped(inv.cluster.replicas)
        return
    show = None if as_json else (lambda plan: render.fleet_serve_plan(plan, dry_run))
    try:
        res = FL.serve_fleet(inv, model, tp=tp, pp=pp, dp=dp, backend=backend, extra=extra, wait=wait,
                             served_name=served_name, parallel=parallel, dry_run=dry_run, on_plan=show, reporter=rep)
    except FP.FleetError as exc:
        raise click.UsageError(str(exc)) from None
    except P.ModelSplitError as exc:
        raise click.UsageError(f"serve: {exc}") from None
    except V.ServeFailed as exc:
        render.serve_failed(exc, with_findings=False)
        raise
    if isinstance(res, FP.FleetPlan):
        render.dry_run(res, as_json)
    else:
        render.fleet_served(inv, res, as_json)


# -- rollout -------------------------------------------------------------------------------------
@main.command(cls=PassThrough, context_settings={"ignore_unknown_options": True})
@inventory_option
@accept_keys_option
@parallel_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", default=None, help="The model to change to (default: the one served).")
@click.option("--image", default=None, help="The image to change to (default: the one served).")
@click.option("--keep-flags", is_flag=True, help="Keep the vLLM flags served now (default: the flags after --).")
@click.option("--dp", type=click.IntRange(1), default=None,
              help="Change each replica to this many vLLM data parallel engines over its nodes (as serve --dp; "
                   "default: each replica keeps its shape).")
@click.option("--no-dp", is_flag=True, help="Change each replica back to one TP x PP engine (as serve without --dp).")
@click.option("--max-unavailable", type=click.IntRange(1), default=1, show_default=True,
              help="Replicas replaced at once (never all of them).")
@click.option("--drain", type=SECONDS, default=120.0, show_default=True,
              help="Seconds a replica out of the router may take to finish its requests before it is stopped.")
@click.option("--wait", type=SECONDS, default=900.0, show_default=True,
              help="Seconds a new replica may take to answer a completion.")
@json_option
def rollout(inventory, parallel, extra, model, image, keep_flags, dp, no_dp, max_unavailable, drain, wait, as_json):
    """Change the model, vLLM flags or image of a fleet (cluster.replicas > 1), replica by replica.

    Each replica leaves the router, drains (running + waiting requests at zero for 2 s, or --drain), stops,
    starts with the new spec, must answer a real completion, and goes back into the router. A
    replica that fails is rolled back and the rollout stops (exit 1, naming it); the others keep
    serving. Ctrl-C rolls back the replica in flight and lists each replica's state.

    Example: bootstrap rollout -i hosts.yaml -- --max-model-len 4096
    (bootstrap rollout -i hosts.yaml --dp 2 --keep-flags: each replica becomes 2 data parallel engines)
    """
    from bootstrap.fleet import run as FL

    check_rollout_args(model, extra, keep_flags, image)
    if dp is not None and no_dp:
        raise click.UsageError("--dp and --no-dp: give one (--dp N: data parallel engines; --no-dp: one TP x PP "
                               "engine)")

    def go():
        inv = read_inventory(inventory)
        if inv.cluster.replicas < 2:
            raise click.UsageError("rollout replaces replicas one by one: set cluster.replicas (2 or more) in the "
                                   "inventory; with one replica use bootstrap serve")
        if dp is not None:
            check_parallelism(inv, None, None, dp)
        check_fleet_flags(inv, tuple(extra))
        step = render.rollout_step(as_json)
        try:
            res = FL.rollout(inv, model=model, extra=None if keep_flags else tuple(extra), image=image,
                             dp=None if no_dp else dp if dp is not None else False, drain=drain,
                             wait=wait, max_unavailable=max_unavailable, parallel=parallel,
                             reporter=LineReporter(quiet=True), on_step=step)
        except FL.RolloutFailed as exc:
            render.rollout_failed(exc)
            raise
        render.rollout(res, as_json)
    _run(go)


# -- top -----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
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
    from bootstrap.monitor import top as T

    def go():
        inv = read_inventory(inventory, require_secrets=False)  # the probes read nothing secret
        prom = None
        if source != "probe":
            from bootstrap.monitor import run as MON

            try:
                prom = MON.running_url(inv)
            except BootstrapError as exc:  # unreachable monitor host, or its Docker does not answer
                if source == "prometheus":
                    raise  # names the host and why: not "Prometheus is not running"
                render.top_without_prometheus(exc)
            if prom is None and source == "prometheus":
                raise UsageError("top --source prometheus: Prometheus is not running (bootstrap monitor up)")
        with T.Watcher(inv) as w:
            if prom is not None:
                def look():
                    return w.prometheus_frame(lambda expr: MON.query(w.sess, expr), prom, interval)
            else:
                def look():
                    w.sample()
                    return w.frame(interval)
            if once or as_json:
                if prom is None:
                    w.sample()
                    time.sleep(interval)
                frame = look()
                render.top(inv, frame, as_json)
                if frame.down:
                    sys.exit(int(ExitStatus.ERROR))
                return
            render.top_live(inv, look, interval)
    _run(go)


# -- bench ---------------------------------------------------------------------------------------
@main.command()
@inventory_option
@accept_keys_option
@click.option("--url", default=None, callback=check_url,
              help="Endpoint to load (default: the inventory's head and vLLM port; with replicas, the router, "
                   "and the requests each replica served are reported).")
@click.option("--model", default=None, callback=check_name,
              help="Model name (default: the first one /v1/models lists).")
@click.option("-n", "--requests", "n_requests", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="Requests to send in all.")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Requests in flight at once.")
@click.option("--max-tokens", type=click.IntRange(1, MAX_BENCH_TOKENS), default=64, show_default=True,
              help="max_tokens of each request (tokens generated per request, fewer if the model stops early).")
@click.option("--prompt", default=None, callback=check_nonempty, help="Prompt text (default: a fixed paragraph).")
@click.option("--ignore-eos", is_flag=True, help="Always generate --max-tokens tokens (vLLM extension).")
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True, help="Seconds per request.")
@click.option("--png", type=FilePath(), default=None, callback=check_png, help="Write latency histograms to this PNG.")
@json_option
def bench(inventory, url, model, n_requests, concurrency, max_tokens, prompt, ignore_eos, timeout, png, as_json):
    """A bounded load of streaming completions: requests/s, tokens/s, TTFT/ITL/E2E percentiles.

    Exactly --requests requests with at most --concurrency in flight; prints p50/p95/p99 with text
    histograms and says when high-percentile spikes with low throughput point at a coordinator
    bottleneck rather than the GPUs.

    Example: bootstrap bench -i hosts.yaml --requests 200 --concurrency 16 --png latency.png
    """
    from bootstrap.serve import bench as B

    def go():
        target = url
        fleet_inv = None
        if target is None:
            inv = read_inventory(inventory, check_files=False)
            target = "http://" + PL.hostport(inv.head.ip, inv.cluster.ports.vllm)
            if inv.cluster.replicas > 1:
                from bootstrap.fleet import plan as FP
                target, fleet_inv = FP.router_url(inv), read_inventory(inventory)
        kw = {"prompt": prompt} if prompt else {}
        if fleet_inv is not None:
            kw["api_key"] = FP.api_key(fleet_inv)
        cfg = B.BenchConfig(url=target, model=model, requests=n_requests, concurrency=concurrency,
                            max_tokens=max_tokens, timeout=timeout, ignore_eos=ignore_eos, **kw)
        if fleet_inv is not None:
            from bootstrap.fleet import run as FL
            before = FL.status(fleet_inv)
        res = B.run_bench(cfg)
        spread = None
        if fleet_inv is not None:
            spread = FL.spread(before, FL.status(fleet_inv))
        if png:
            B.write_png(res, png)
        render.bench(res, spread, png, as_json)
        if res.ok == 0:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


# -- monitor -------------------------------------------------------------------------------------
@main.group()
def monitor():
    """Prometheus for the cluster: a node exporter on every host, Prometheus on one host
    (cluster.monitor.host, default the head) scraping vLLM, the router, Ray and the exporters.

    Example: bootstrap monitor up -i hosts.yaml
    """


def _monitor_session(inventory, reporter=None, *, connect: bool = True, parallel: int = DEFAULT_PARALLEL):
    """connect=False: connect on first use (`monitor status` asks the monitor host only, and says so
    when that host is unreachable)."""
    inv = read_inventory(inventory, require_secrets=False)  # nothing secret goes to the monitoring containers
    sess = Session(inv, reporter=reporter, parallel=parallel)
    if connect:
        sess.connect()
    return inv, sess


@monitor.command("up")
@inventory_option
@accept_keys_option
@parallel_option
@click.option("--wait", type=SECONDS, default=120.0, show_default=True,
              help="Seconds to wait for every target to be up.")
@json_option
def monitor_up(inventory, parallel, wait, as_json):
    """Start (or update) the exporters and Prometheus; the scrape configuration is generated from
    the inventory on every run, and a running Prometheus reloads it. Exit 1 if an exporter, Ray or
    Prometheus target is down (vLLM's and the router's come up when `serve` runs).

    Example: bootstrap monitor up -i hosts.yaml
    """
    from bootstrap.monitor import run as MON

    def go():
        inv, sess = _monitor_session(inventory, LineReporter(quiet=as_json), parallel=parallel)
        with sess:
            res = MON.monitor_up(sess, wait=wait)
        render.monitor_up(inv, res, as_json)
        if res.down_infrastructure:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


@monitor.command("status")
@inventory_option
@accept_keys_option
@parallel_option
@json_option
def monitor_status(inventory, parallel, as_json):
    """List every scrape target up or down, as Prometheus sees it (exit 1 if one is down).

    Example: bootstrap monitor status -i hosts.yaml
    """
    from bootstrap.monitor import run as MON

    def go():
        inv, sess = _monitor_session(inventory, connect=False, parallel=parallel)
        with sess:
            res = MON.monitor_status(sess)
        render.monitor_status(res, as_json)
        if res.down:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


@monitor.command("down")
@inventory_option
@accept_keys_option
@parallel_option
@click.option("--purge", is_flag=True, help="Also delete Prometheus' stored samples (its data volume).")
@json_option
def monitor_down(inventory, parallel, purge, as_json):
    """Remove Prometheus and the exporters from every host.

    Example: bootstrap monitor down -i hosts.yaml --purge
    """
    from bootstrap.monitor import run as MON

    def go():
        inv, sess = _monitor_session(inventory, LineReporter(quiet=as_json), parallel=parallel)
        with sess:
            res = MON.monitor_down(sess, purge=purge)
        render.monitor_down(res, purge, as_json)
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
def sandbox_up(nodes, kind, without_ray, gpus, ib, hcas, registry_link, node_link):
    """Build the images (cached), start the registry and N nodes, write their inventory.

    Example: bootstrap sandbox up --nodes 3

    Example (GPU-shaped): bootstrap sandbox up --nodes 2 --gpus 8 --ib roce

    Example (rack-shaped links): bootstrap sandbox up --nodes 4 --registry-link 100mbit --node-link 1gbit
    """
    from bootstrap import sandbox as S

    def go():
        if without_ray and kind != "full":
            raise UsageError("--without-ray needs --kind full (sshd-only nodes run no containers)")
        if (gpus or ib) and kind != "full":
            raise UsageError("--gpus and --ib need --kind full (GPUs are seen through each node's Docker)")
        if hcas != 1 and not ib:
            raise UsageError("--hcas needs --ib")
        shape = S.GpuShape(gpus=gpus, ib=ib, hcas=hcas)
        try:
            links = S.LinkShape(
                registry_bits=S.parse_rate(registry_link, "--registry-link") if registry_link is not None else None,
                node_bits=S.parse_rate(node_link, "--node-link") if node_link is not None else None)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        try:
            info = S.sandbox_up(nodes, log=render.sandbox_log, kind=kind, ray=not without_ray, gpu=shape,
                                links=links)
        except (RuntimeError, OSError, ValueError) as exc:
            raise BootstrapError(f"sandbox: {exc}") from None
        render.sandbox_up(info)
    _run(go)


@sandbox.command("down")
def sandbox_down():
    """Remove the sandbox nodes, registry container and network.

    Example: bootstrap sandbox down
    """
    from bootstrap import sandbox as S

    def go():
        try:
            S.sandbox_down(log=render.sandbox_log)
        except (RuntimeError, OSError) as exc:
            raise BootstrapError(f"sandbox: {exc}") from None
        render.sandbox_down()
    _run(go)


text_params(main)  # every string option and argument: an empty value is refused (params.Text)

if __name__ == "__main__":  # pragma: no cover
    main()
