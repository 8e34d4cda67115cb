"""The `bootstrap` command: a thin click layer over the library; the only module that prints.

Progress and errors go to stderr, `--json` documents to stdout. Exit codes: see errors.ExitStatus.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from bootstrap.cluster import run as A
from bootstrap.cluster import plan as PL
from bootstrap.remote.session import Session
from bootstrap.serve import plan as P
from bootstrap.errors import BootstrapError, ExitStatus, GroupError, Interrupted, UsageError
from bootstrap.remote.fanout import DEFAULT_PARALLEL

# Wide when not on a terminal, so tables in logs and CI output do not wrap evidence mid-word.
# No emoji codes: a `:name:` in a value is printed as it is.
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True, width=None if sys.stderr.isatty() else 200)
out = Console(highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


class LineReporter:
    """A line per host and stage on stderr (safe from many threads)."""

    SHOW_START = {"pull", "load-image", "copy-image", "start-head", "start-workers", "down"}

    def __init__(self, console: Console = err, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def event(self, host: str, stage: str, status: str, detail: str = "") -> None:
        if self.quiet or (status == "start" and stage not in self.SHOW_START):
            return
        color = {"done": "green", "failed": "red", "start": "cyan", "warning": "yellow"}.get(status, "white")
        t = time.monotonic() - self.t0
        line = f"[dim]{t:7.1f}s[/] {_escape(f'{host:<16}')} {_escape(f'{stage:<14}')} [{color}]{_escape(status)}[/]"
        if detail:
            line += f" [dim]{_escape(detail[:300])}[/]"
        with self.lock:
            self.console.print(line)


# rich reads `[` + one of a-z # / @ ... `]` as a tag; backslashes before a `[` escape it (an even
# run before a tag is halved and the tag stays a tag); `\[` in plain text prints `[`.
_TAG = re.compile(r"\[[a-z#/@][^[]*?]")
_BRACKET = re.compile(r"(\\*)\[")
_TRAILING_BACKSLASHES = re.compile(r"\\+\Z")
# An empty span of the null style: ends a value's trailing backslashes, so that markup after the
# value (`[/]`) is neither escaped by them nor halves them.
_STOP = "[none][/none]"


def _printable(text: str, keep: str = "") -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def _escape(text: object, *, lines: bool = False, markup: bool = True) -> str:
    """A string from a user, an inventory or a host, made safe to print: shown as it is, on one line.

    Control and other unprintable characters (ESC, newline, NUL, lone surrogates) are shown as
    Python escapes (`\\x1b`, `\\n`): a value stays on its line and cannot drive the terminal.
    lines=True keeps the text's line breaks and tabs (a log tail, a report). markup=True (text
    for rich's print, tables included): brackets and backslashes are escaped so that rich shows
    them literally, whatever markup comes before or after.
    """
    text = str(text)
    if lines:
        text = "\n".join(_printable(ln, "\t") for ln in text.splitlines())
    else:
        text = _printable(text)
    if not markup:
        return text
    plain = text

    def bracket(m: re.Match) -> str:
        tag = _TAG.match(plain, m.end() - 1) is not None
        return m.group(1) * (2 if tag else 1) + "\\["
    text = _BRACKET.sub(bracket, plain)
    trailing = _TRAILING_BACKSLASHES.search(text)
    return text + trailing.group() + _STOP if trailing else text


def _load(path: str | None, check_files: bool = True, require_secrets: bool = True):
    from bootstrap.inventory import load_inventory

    given = "--inventory"
    if path is None:
        path, given = os.environ.get("BOOTSTRAP_INVENTORY"), "$BOOTSTRAP_INVENTORY"
        if not path:
            if not Path("hosts.yaml").exists():
                raise click.UsageError("no inventory: pass -i FILE, set BOOTSTRAP_INVENTORY, or create ./hosts.yaml")
            path, given = "hosts.yaml", None
    if given is not None:  # named by the user: a path that cannot be an inventory is a bad argument
        why = ("is empty" if not path.strip() else "no such file" if not os.path.lexists(path)
               else "is a directory, not an inventory file" if os.path.isdir(path) else None)
        if why is not None:
            raise click.BadParameter(f"{path if path.strip() else repr(path)}: {why}", param_hint=given)
    return load_inventory(path, check_files=check_files, require_secrets=require_secrets)


def _fail(exc: BootstrapError) -> "NoReturn":  # noqa: F821
    err.print(f"[red]error:[/] {_escape(str(exc))}")
    if isinstance(exc, Interrupted):
        for host, state in exc.states.items():
            color = "green" if state.startswith("done") else "yellow"
            err.print(f"  {_escape(f'{host:<16}')} [{color}]{_escape(state)}[/]")
    if isinstance(exc, GroupError):
        for host, r in exc.results.items():
            mark = "[red]FAILED[/]" if isinstance(r, BaseException) else "[green]ok[/]"
            err.print(f"  {_escape(f'{host:<16}')} {mark} {_escape(r) if isinstance(r, BaseException) else ''}")
    sys.exit(int(exc.exit_status))


def _sigterm(signum, frame):  # noqa: ANN001 - signal handler signature
    raise KeyboardInterrupt


def _run(fn):
    """Call fn, mapping domain errors and interrupts to one line + a documented exit code.

    SIGTERM is handled like Ctrl-C: commands that change hosts stop their remote work and report
    each host's state."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm)
    try:
        return fn()
    except BootstrapError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]: remote commands in flight were abandoned; run the same "
                  "command again to continue from where each host is")
        sys.exit(int(ExitStatus.INTERRUPTED))


PROG = "bootstrap"


def _param_name(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def _usage_line(e: click.ClickException) -> str:
    """`up: --parallel: 0 is not in the range 1<=x<=1024 (bootstrap up --help)`: the command, the
    option or argument, the value and what to read; one line whatever click's message was."""
    names: list[str] = []
    ctx = getattr(e, "ctx", None)
    while ctx is not None and ctx.parent is not None:
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    if isinstance(e, click.BadParameter) and not isinstance(e, click.MissingParameter) and (
            e.param is not None or e.param_hint):
        hint = (e.param_hint if isinstance(e.param_hint, str) else "/".join(e.param_hint) if e.param_hint
                else _param_name(e.param))
        msg = f"{hint}: {e.message}"
    else:
        msg = e.format_message()
    # A newline in a value stays in the message: the caller's _escape shows it as \n, on one line.
    msg = msg.strip().rstrip(".")
    where = f"{' '.join(names)}: " if names else ""
    return f"{where}{msg} ({' '.join([PROG, *names, '--help'])})"


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


class _Main(_KnowsCommand, click.Group):
    """The root command: click's usage errors (bad value, missing argument, unknown option or
    command) become one line on stderr and exit 2, like every other error here. Its commands and
    groups (`sandbox`) are of the same kind."""

    command_class = _Command
    group_class = type

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name or PROG, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # a bare group: its help, as click does
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            err.print(f"[red]error:[/] {_escape(_usage_line(e))}")
            sys.exit(int(ExitStatus.BAD_INPUT) if isinstance(e, click.UsageError) else e.exit_code)
        except click.Abort:
            err.print("[yellow]interrupted[/]")
            sys.exit(int(ExitStatus.INTERRUPTED))
        sys.exit(rv if isinstance(rv, int) else 0)


def _quote(value: str, limit: int = 60) -> str:
    """repr of a value for a message, cut to `limit` characters (a 5000-digit number is not echoed whole)."""
    return repr(value if len(value) <= limit else value[:limit - 3] + "...")


class _Seconds(click.ParamType):
    """A finite number of seconds: above 0, or from `least` (inclusive); at most `most`. Every
    option that takes seconds has this type: nan, inf and 1e999 are refused like any value out of
    range, and only ASCII numbers are read."""

    name = "seconds"

    def __init__(self, least: float | None = None, most: float | None = None):
        self.least, self.most = least, most
        if least is None:
            self.kind = "a positive number of seconds" + (f" up to {most:g}" if most is not None else "")
        elif most is None:
            self.kind = f"a number of seconds of {least:g} or more"
        else:
            self.kind = f"a number of seconds from {least:g} to {most:g}"

    def convert(self, value, param, ctx):
        try:
            if isinstance(value, str) and not value.isascii():
                raise ValueError(value)
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{_quote(str(value))} is not a number of seconds", param, ctx)
        if not (math.isfinite(v) and (v > 0 if self.least is None else v >= self.least)
                and (self.most is None or v <= self.most)):
            shown = str(value).strip()
            self.fail(f"{shown if len(shown) <= 40 else _quote(shown, 40)} is not {self.kind}", param, ctx)
        return v


SECONDS = _Seconds()


class _FilePath(click.Path):
    """A file to read or write: not blank, no NUL, not a folder (an existing one, or a name ending in /)."""

    def __init__(self):
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            if not value.strip():
                self.fail(f"{value!r} is empty", param, ctx)
            if "\0" in value:
                self.fail(f"{value!r} contains a NUL character", param, ctx)
            if value.endswith("/"):
                self.fail(f"{value!r} names a folder, not a file", param, ctx)
        return super().convert(value, param, ctx)


def _nonempty(ctx, param, value):
    """An option that, when given, must not be blank."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} is empty", ctx, param)
    return value


def _name(ctx, param, value):
    """A name (a model's): not blank, on one line, no control characters."""
    if _nonempty(ctx, param, value) is not None and not value.isprintable():
        raise click.BadParameter(f"{_quote(value)} contains a control character", ctx, param)
    return value


inventory_option = click.option(
    "-i", "--inventory", "inventory", type=_FilePath(), default=None,
    help="Inventory file (native or Ansible YAML). Default: $BOOTSTRAP_INVENTORY or ./hosts.yaml.")
parallel_option = click.option(
    "--parallel", type=click.IntRange(1, 1024), default=DEFAULT_PARALLEL, show_default=True,
    help="How many hosts to work on at once.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON document on stdout.")
lock_wait_option = click.option(
    "--lock-wait", type=_Seconds(0, 86400), default=0.0, show_default=True,
    help="Seconds to wait for another `up`/`down` on this cluster to finish (0: refuse at once, exit 5).")


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bootstrap-vllm")
def main() -> None:
    """Turn GPU machines reachable over SSH and running Docker into one vLLM/Ray cluster.

    \b
    bootstrap validate -i hosts.yaml    check the inventory (no host contacted)
    bootstrap plan   -i hosts.yaml      what each host would get (no host contacted)
    bootstrap up     -i hosts.yaml      start the Ray cluster of vLLM containers
    bootstrap status -i hosts.yaml      containers and Ray nodes, per host
    bootstrap down   -i hosts.yaml      stop Ray and remove the containers
    bootstrap exec   -i hosts.yaml -- CMD  run CMD on every host (--container: in its container)
    bootstrap check-nccl -i hosts.yaml  prove the nodes can all-reduce, with bandwidth
    bootstrap doctor -i hosts.yaml      known failure signatures -> cause and fix
    bootstrap logs   -i hosts.yaml -f   every node's container log in one stream
    bootstrap serve  -i hosts.yaml MODEL  vllm serve across the cluster (TP=GPUs/node, PP=nodes)
    bootstrap bench  -i hosts.yaml      load the endpoint: TTFT / ITL / E2E percentiles
    bootstrap sandbox up --nodes 3      a local cluster of simulated hosts to try it on
    """


# -- validate ------------------------------------------------------------------------------------
@main.command()
@inventory_option
def validate(inventory):
    """Check an inventory (and its key files) without contacting any host.

    Example: bootstrap validate -i hosts.yaml
    """
    def go():
        inv = _load(inventory)
        gpus = f", {inv.gpus_per_node} GPU(s) per node" if inv.cluster.accelerator == "gpu" else ""
        out.print(_escape(f"{inv.path}: ok: {len(inv.hosts)} host(s), head {inv.head.name} ({inv.head.ip}){gpus}"))
    _run(go)


# -- plan ----------------------------------------------------------------------------------------
def _plan_rows(actions, as_json: bool, live: bool):
    if as_json:
        doc = [{"host": a.host, "role": a.spec.role, "action": a.action, "reason": a.reason,
                "spec_hash": a.spec.spec_hash, "argv": list(a.spec.run_argv())} for a in actions]
        out.print_json(json.dumps(doc))
        return
    import shlex

    for a in actions:
        head = f"[bold]{_escape(a.host)}[/] ({_escape(a.spec.role)})"
        if live:
            color = {"keep": "green", "create": "cyan", "recreate": "yellow"}[a.action]
            head += f"  [{color}]{a.action}[/]: {_escape(a.reason)}"
        out.print(head)
        out.print("  " + _escape(shlex.join(a.spec.run_argv())), soft_wrap=True)


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
        inv = _load(inventory, check_files=False)
        if inv.cluster.replicas == 1:
            _plan_rows(PL.plan_offline(inv), as_json, live=False)
            return
        import shlex

        from bootstrap.fleet import plan as FP
        groups = [PL.plan_offline(FP.replica_inventory(inv, k)) for k in range(inv.cluster.replicas)]
        router = FP.router_run_argv(inv, [FP.replica_url(inv, k) for k in range(inv.cluster.replicas)])
        if as_json:
            out.print_json(json.dumps({
                "replicas": [{"replica": k, "url": FP.replica_url(inv, k),
                              "hosts": [{"host": a.host, "role": a.spec.role, "spec_hash": a.spec.spec_hash,
                                         "argv": list(a.spec.run_argv())} for a in acts]}
                             for k, acts in enumerate(groups)],
                "router": {"host": FP.router_host(inv).name, "endpoint": FP.router_url(inv) + "/v1",
                           "argv": list(router)},
                "keeper": list(FP.keeper_create_argv(inv))}))
            return
        for k, acts in enumerate(groups):
            out.print(f"[bold]replica {k}[/] -> {_escape(FP.replica_url(inv, k))}")
            _plan_rows(acts, False, live=False)
        out.print(f"[bold]router[/] on {_escape(FP.router_host(inv).name)} -> {_escape(FP.router_url(inv))}/v1 "
                  "(worker URLs as `bootstrap serve` starts them)")
        out.print("  " + _escape(shlex.join(router)), soft_wrap=True)
        out.print("[bold]keeper[/] on every host (restarts serve/router containers stopped outside bootstrap)")
        out.print("  " + _escape(shlex.join(FP.keeper_create_argv(inv))), soft_wrap=True)
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
@lock_wait_option
@json_option
def up(inventory, parallel, dry_run, load_image, pull, wait, accept_new_host_keys, allow_partial, lock_wait,
       as_json):
    """Start the vLLM container on every host: the Ray head, then the workers.

    Idempotent: a second run with the same inventory changes nothing; a changed spec recreates
    only the affected containers (and all workers when the head changes).

    Example: bootstrap up -i hosts.yaml
    """
    def go():
        inv = _load(inventory)
        if inv.cluster.replicas > 1:
            # Each replica is a serving group of its own: its own head and Ray cluster.
            from bootstrap.fleet import plan as FP
            for k in range(inv.cluster.replicas):
                if not as_json:
                    err.print(_escape(f"replica {k}: {', '.join(h.name for h in inv.replicas[k])}"))
                one(FP.replica_inventory(inv, k), f" replica {k}")
            return
        one(inv, "")

    def one(inv, label):
        rep = LineReporter(quiet=as_json)
        t0 = time.monotonic()
        started_at = time.time()
        res = A.up(inv, parallel=parallel, reporter=rep, dry_run=dry_run, load_image=load_image,
                   pull=pull, wait=wait, accept_new_host_keys=accept_new_host_keys,
                   allow_partial=allow_partial, lock_wait=lock_wait)
        total = time.monotonic() - t0
        for host, why in res.skipped.items():
            err.print(f"[yellow]warning:[/] {_escape(host)} left out (--allow-partial): {_escape(why)}")
        if dry_run:
            _plan_rows(res.actions, as_json, live=True)
            return
        alive = {n.ip: n for n in (res.ray.nodes if res.ray else ()) if n.alive}
        if as_json:
            # times: time.time() seconds; run_start/run_end/started_at/ready_at on this machine's
            # clock, ray_seen on the head's (head_clock_offset = head minus this machine)
            no_time = A.HostTiming().as_dict()
            out.print_json(json.dumps({
                "changed": res.changed, "seconds": round(total, 3),
                "stages": {k: round(v, 3) for k, v in res.timings.stages.items()},
                "hosts": [{"host": a.host, "ip": inv.host(a.host).ip, "role": a.spec.role,
                           "action": a.action, "reason": a.reason, "ray_alive": inv.host(a.host).ip in alive,
                           "gpus": alive[inv.host(a.host).ip].gpus if inv.host(a.host).ip in alive else 0,
                           "image_from": res.image_from.get(a.host),
                           **(res.host_timings[a.host].as_dict() if a.host in res.host_timings else no_time)}
                          for a in res.actions],
                "started_at": round(started_at, 3),
                "ready_at": None if res.ready_at is None else round(res.ready_at, 3),
                "head_clock_offset": None if res.head_clock_offset is None else round(res.head_clock_offset, 3),
                "skipped": dict(res.skipped), "warnings": res.warnings}))
            return
        t = Table(title=f"cluster {_escape(inv.cluster.name)}{label}")
        for col in ("host", "ip", "role", "action", "ray", "GPUs"):
            t.add_column(col)
        for a in res.actions:
            ip = inv.host(a.host).ip
            n = alive.get(ip)
            t.add_row(_escape(a.host), _escape(ip), _escape(a.spec.role), _escape(f"{a.action} ({a.reason})"),
                      "[green]alive[/]" if n else "[red]missing[/]", f"{n.gpus:g}" if n else "-")
        out.print(t)
        if res.image_from:
            by_src: dict[str, list[str]] = {}
            for host, src in res.image_from.items():
                by_src.setdefault(src, []).append(host)
            out.print(_escape("image: " + "; ".join(
                f"{', '.join(hs)} from {'the registry' if src == 'registry' else src}" for src, hs in by_src.items())))
        verb = "ready" if res.changed else "already up: nothing changed"
        gpus = sum(n.gpus for n in alive.values())
        part = f" ({len(res.skipped)} host(s) left out: {', '.join(res.skipped)})" if res.skipped else ""
        out.print(_escape(f"Ray cluster {verb}: {len(alive)} node(s), {gpus:g} GPU(s), head {inv.head.ip}:"
                          f"{inv.cluster.ports.ray_gcs}{part}; took {total:.1f}s"))
    _run(go)


# -- status --------------------------------------------------------------------------------------
@main.command()
@inventory_option
@parallel_option
@json_option
def status(inventory, parallel, as_json):
    """Show each host's container state and whether Ray sees it (exit 1 if any node is not alive).

    Example: bootstrap status -i hosts.yaml --json
    """
    def go():
        inv = _load(inventory)
        if inv.cluster.replicas > 1:
            return _status_fleet(inv, parallel, as_json)
        st = A.cluster_status(inv, parallel=parallel)
        rows = st.nodes
        if as_json:
            out.print_json(json.dumps({"nodes": [r.as_dict() for r in rows],
                                       "serving": st.serving.to_dict() if st.serving else None,
                                       "ray_dashboard": st.dashboard}))
        else:
            t = Table(title=f"cluster {_escape(inv.cluster.name)}")
            for col in ("host", "ip", "role", "container", "ray", "GPUs", "note"):
                t.add_column(col)
            for r in rows:
                cont = _escape(r.container) if r.reachable else "[red]unreachable[/]"
                t.add_row(_escape(r.host), _escape(r.ip), _escape(r.role), cont,
                          "[green]alive[/]" if r.ray_alive else "[red]no[/]",
                          f"{r.gpus:g}" if r.ray_alive else "-", _escape(r.error[:120]))
            out.print(t)
            for line in _status_lines(inv, st):
                out.print(line)
            _print_prometheus(inv)
        if not all(r.ray_alive for r in rows):
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


def _status_fleet(inv, parallel: int, as_json: bool) -> None:
    """status with replicas: each group's nodes (its own Ray cluster), then each replica as the
    router sees it. Exit 1 when a node is not alive or a replica does not serve."""
    from bootstrap.fleet import run as FL
    from bootstrap.fleet import plan as FP

    groups = [A.cluster_status(FP.replica_inventory(inv, k), parallel=parallel) for k in range(inv.cluster.replicas)]
    fs = FL.status(inv, parallel=parallel)
    nodes = [(k, r) for k, g in enumerate(groups) for r in g.nodes]
    if as_json:
        out.print_json(json.dumps({"nodes": [{"replica": k, **r.as_dict()} for k, r in nodes],
                                   "fleet": fs.to_dict(), "ray_dashboard": [g.dashboard for g in groups]}))
    else:
        t = Table(title=f"cluster {_escape(inv.cluster.name)}: {inv.cluster.replicas} replicas")
        for col in ("replica", "host", "ip", "role", "container", "ray", "note"):
            t.add_column(col)
        for k, r in nodes:
            cont = _escape(r.container) if r.reachable else "[red]unreachable[/]"
            t.add_row(str(k), _escape(r.host), _escape(r.ip), _escape(r.role), cont,
                      "[green]alive[/]" if r.ray_alive else "[red]no[/]", _escape(r.error[:120]))
        out.print(t)
        t = Table(title=f"serving through the router on {_escape(fs.router_host)} ({_escape(fs.router)})")
        for col in ("replica", "hosts", "url", "health", "in router", "router says", "running", "waiting", "served",
                    "restarts", "model"):
            t.add_column(col)
        for r in fs.replicas:
            color = "green" if r.health == "healthy" else ("yellow" if r.health.startswith("starting") else "red")
            rot = "-" if r.in_rotation is None else ("[green]yes[/]" if r.in_rotation else "[yellow]no[/]")
            num = (lambda v: "-" if v is None else f"{v:g}")
            model = f"{r.spec.model} {' '.join(r.spec.extra)}".strip() if r.spec else "-"
            says = "-" if r.router_healthy is None else ("[green]healthy[/]" if r.router_healthy else "[red]unhealthy[/]")
            t.add_row(str(r.index), _escape(", ".join(r.hosts)), _escape(r.url), f"[{color}]{_escape(r.health)}[/]",
                      rot, says, num(r.running), num(r.waiting), num(r.succeeded), str(r.restarts), _escape(model))
        out.print(t)
        out.print(_escape(f"endpoint: {fs.endpoint} (router {fs.router})"))
        for k, g in enumerate(groups):
            if g.dashboard:
                out.print(_dashboard_line(f"Ray dashboard of replica {k}", g.dashboard, inv.replicas[k][0]))
        _print_prometheus(inv)
    if not all(r.ray_alive for _, r in nodes) or not all(r.health == "healthy" for r in fs.replicas):
        sys.exit(int(ExitStatus.ERROR))


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _status_lines(inv, st) -> list[str]:
    """The serving and dashboard lines under the node table."""
    lines = []
    v = st.serving
    if v is None:
        lines.append("serving: nothing (bootstrap serve MODEL)")
    else:
        color = "green" if v.health == "healthy" else ("yellow" if v.health.startswith("starting") else "red")
        name = v.served[0] if v.served else v.model
        lines.append(f"serving: {_escape(name)} on {_escape(v.endpoint)} [{color}]{_escape(v.health)}[/] "
                     + _escape(f"(backend {v.backend}, TP={v.tp} PP={v.pp}, {len(v.nodes)} node(s), "
                               f"up {_uptime(v.uptime_s)})"))
        if v.kv is not None:
            lines.append(f"KV cache: {v.kv.tokens:,} tokens")
    if st.dashboard:
        lines.append(_dashboard_line("Ray dashboard", st.dashboard, inv.head))
    return lines


def _dashboard_line(label: str, address: str, head) -> str:
    """The Ray dashboard's address, with the `ssh -L` line when it listens on localhost."""
    host, _, port = address.rpartition(":")
    line = f"{label}: http://{address}"
    if host.startswith("127."):
        line += f" on {head.name} ({_ssh_tunnel(head, host, port)})"
    return _escape(line)


def _print_prometheus(inv) -> None:
    from bootstrap.monitor import run as MON
    from bootstrap.monitor import plan as MP

    url = MON.running_url(inv)
    if url:
        mh = MP.monitor_host(inv)
        out.print(_escape(f"Prometheus: {url} on {mh.name} ({_ssh_tunnel(mh, mh.ip, inv.cluster.monitor.port)})"))
    else:
        out.print("Prometheus: not running (bootstrap monitor up)")


def _ssh_tunnel(h, ip: str, port) -> str:
    """How to open a service on `h` listening on ip:port from this machine."""
    who = f"{h.ssh.user}@{h.ssh.address}" if h.ssh.user else h.ssh.address
    return f"from here: ssh -L {port}:{ip}:{port} {who}, then http://localhost:{port}"


# -- exec ----------------------------------------------------------------------------------------
@main.command("exec")
@inventory_option
@click.option("--container", is_flag=True,
              help="Run inside each host's cluster container (docker exec <container_name>).")
@click.option("--hosts", "only", default=None, callback=lambda ctx, param, v: _host_names(v),
              help="Only these hosts, comma-separated (default: all).")
@parallel_option
@click.option("--timeout", type=_Seconds(0.1), default=None,
              help="Seconds the command may run on each host (default: the inventory's command_timeout).")
@click.option("--accept-new-host-keys", is_flag=True, default=None,
              help="Trust and record SSH host keys not yet known (changed keys are still refused).")
@json_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED,
                callback=lambda ctx, param, v: _command_words(v))
def exec_(inventory, container, only, parallel, timeout, accept_new_host_keys, as_json, command):
    """Run COMMAND on every host at once; each output line prefixed with its host, then a summary.

    COMMAND goes after `--` and reaches each host as argv, quoted once: nothing is expanded by a
    shell here or there. For pipes, `$VAR` or `&&`, ask for a shell: `-- sh -c 'df -h / | tail -1'`.
    Exit 0 when every host exited 0; 1 otherwise (unreachable hosts are named).

    Example: bootstrap exec -i hosts.yaml -- nvidia-smi -L
    """
    from bootstrap.cluster import exec as E

    def go():
        inv = _load(inventory)
        try:
            width = max(len(h.name) for h in E.select_hosts(inv, only))
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="--hosts") from None
        lock = threading.Lock()

        def emit(r) -> None:
            if as_json:
                return
            with lock:
                for stream, text in ((sys.stdout, r.stdout), (sys.stderr, r.stderr)):
                    for line in text.splitlines():
                        stream.write(_escape(f"{r.host:<{width}} | {line}", lines=True, markup=False) + "\n")
                    stream.flush()
                if r.error:
                    err.print(f"{_escape(f'{r.host:<{width}}')} [red]![/] {_escape(r.error)}")

        res = E.exec_all(inv, command, container=container, hosts=only, parallel=parallel,
                         timeout=timeout, accept_new_host_keys=accept_new_host_keys, on_result=emit)
        if as_json:
            out.print_json(json.dumps([r.as_dict() for r in res]))
        else:
            t = Table()
            for col in ("host", "exit", "seconds"):
                t.add_column(col, justify="left" if col == "host" else "right")
            for r in res:
                code = "[green]0[/]" if r.ok else (f"[red]{r.exit_code}[/]" if r.exit_code is not None
                                                   else "[red]timeout[/]" if not r.unreachable
                                                   else "[red]unreachable[/]")
                t.add_row(_escape(r.host), code, f"{r.seconds:.2f}")
            out.print(t)
        bad = [r for r in res if not r.ok]
        if bad:
            down = [r.host for r in res if r.unreachable]
            msg = f"{len(bad)} of {len(res)} host(s) failed"
            if down:
                msg += f"; unreachable: {', '.join(down)}"
            err.print(f"[red]error:[/] {_escape(msg)}")
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


def _host_names(value: str | None) -> tuple[str, ...] | None:
    """`--hosts a,b`: the names, checked against the inventory once it is read. Blank items are
    skipped; a list with no name at all is refused (it would otherwise mean every host)."""
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise click.BadParameter(f"no host name in {_quote(value)}")
    return names


def _command_words(argv: tuple[str, ...]) -> tuple[str, ...]:
    """exec's COMMAND: its first word names a program; no word can hold a NUL (argv cannot)."""
    if argv and not argv[0].strip():
        raise click.BadParameter(f"the command word is empty ({argv[0]!r}): the program to run comes first")
    for word in argv:
        if "\0" in word:
            raise click.BadParameter(f"{_quote(word)} contains a NUL character")
    return argv


# -- down ----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@parallel_option
@lock_wait_option
def down(inventory, parallel, lock_wait):
    """Stop Ray and remove the container on every host (workers first). A second run is a no-op.

    Example: bootstrap down -i hosts.yaml
    """
    def go():
        inv = _load(inventory)
        if inv.cluster.replicas > 1:
            from bootstrap.fleet import run as FL
            from bootstrap.fleet import plan as FP
            FL.stop_fleet(inv, parallel=parallel, reporter=LineReporter())
            out.print(_escape(f"removed the serve containers, the router and the keepers of {inv.cluster.replicas} "
                              "replicas"))
            for k in range(inv.cluster.replicas):
                one(FP.replica_inventory(inv, k))
            return
        one(inv)

    def one(inv):
        res = A.down(inv, parallel=parallel, reporter=LineReporter(), lock_wait=lock_wait)
        if res.removed:
            out.print(_escape(f"removed the container on {len(res.removed)} host(s): {', '.join(res.removed)}"))
        if res.absent:
            out.print(_escape(f"nothing to remove on {len(res.absent)} host(s): {', '.join(res.absent)}"))
    _run(go)


# -- check-nccl ----------------------------------------------------------------------------------
@main.command("check-nccl")
@inventory_option
@parallel_option
@click.option("--deadline", type=SECONDS, default=180.0, show_default=True,
              help="Seconds for the whole check; a node that does not answer in time is named.")
@click.option("--sizes", default=None, callback=lambda ctx, param, v: _sizes(v),
              help="Message sizes in bytes, comma-separated multiples of 4 (default: a sweep).")
@click.option("--iters", type=click.IntRange(1, 1000), default=10, show_default=True)
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
    from bootstrap.nccl import parse as N

    def go():
        inv = _load(inventory)
        res = X.check_nccl(inv, parallel=parallel, reporter=LineReporter(quiet=as_json), deadline=deadline,
                           sizes=sizes, iters=iters, backend=backend)
        if as_json:
            out.print_json(json.dumps({
                "ok": res.ok, "verdict": res.verdict, "backend": res.backend, "world_size": res.world_size,
                "seconds": round(res.seconds, 2), "timed_out": list(res.timed_out),
                "nodes": [n.__dict__ for n in res.nodes],
                "bandwidth": [b.__dict__ for b in res.bandwidth],
                "bandwidth_note": N.bandwidth_note(res.world_size, res.bandwidth),
                "transport": None if res.transport is None else {
                    "network": res.transport.network, "gdrdma": res.transport.gdrdma,
                    "nccl_version": res.transport.nccl_version},
                "findings": [f.__dict__ for f in res.findings], "warnings": res.warnings}))
        else:
            t = Table(title="nodes")
            for col in ("host", "ip", "node rank", "ranks", "last phase", "result"):
                t.add_column(col)
            for n in res.nodes:
                t.add_row(_escape(n.host), _escape(n.ip), str(n.node_rank), str(n.ranks), _escape(n.last_phase or "-"),
                          "[green]ok[/]" if n.ok else f"[red]FAIL[/] {_escape(n.error[:160])}")
            out.print(t)
            if N.bandwidth_note(res.world_size, res.bandwidth):
                for line in N.format_bandwidth(res.world_size, res.backend, res.bandwidth):
                    out.print(_escape(line))
            elif res.bandwidth:
                b = Table(title=f"all-reduce ({res.backend}, {res.world_size} ranks)")
                for col in ("size (B)", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
                    b.add_column(col, justify="right")
                for r in res.bandwidth:
                    b.add_row(str(r.bytes), str(r.count), f"{r.time_us:.1f}", f"{r.algbw_GBps:.4f}",
                              f"{r.busbw_GBps:.4f}")
                out.print(b)
            if res.transport is not None:
                out.print(_escape(f"NCCL transport: {res.transport.network or 'unknown'}"
                                  f"{' with GPUDirect RDMA' if res.transport.gdrdma else ''}"))
            _print_findings(res.findings)
            for w in res.warnings:
                err.print(f"[bold red]{_escape(w)}[/]")
            out.print(("[green]" if res.ok else "[red]") + _escape(res.verdict) + "[/]")
        if not res.ok:
            sys.exit(int(ExitStatus.TIMEOUT if res.timed_out else ExitStatus.ERROR))
    _run(go)


MAX_SIZE = 1 << 34


def _sizes(value: str | None) -> str | None:
    """`--sizes 1024,1048576`: whole numbers of bytes, multiples of 4 (float32), up to 16 GiB."""
    if value is None:
        return None
    sizes = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if not re.fullmatch(r"[0-9]+", part):  # ASCII digits: str.isdigit() also takes '²', int() does not
            where = f" in {_quote(value)}" if part != value.strip() else ""
            raise click.BadParameter(f"{_quote(part)}{where} is not a whole number of bytes")
        if len(part.lstrip("0")) > len(str(MAX_SIZE)):  # too big, and int() refuses over 4300 digits
            raise click.BadParameter(f"{_quote(part, 24)} is not a positive multiple of 4 bytes (float32) up to "
                                     f"{MAX_SIZE}")
        n = int(part)
        if n < 4 or n % 4 or n > MAX_SIZE:
            raise click.BadParameter(f"{n} is not a positive multiple of 4 bytes (float32) up to {MAX_SIZE}")
        sizes.append(n)
    if not sizes:
        raise click.BadParameter(f"no size in {_quote(value)}")
    return ",".join(map(str, sizes))


def _print_findings(findings) -> None:
    if not findings:
        return
    t = Table(title="findings")
    for col in ("severity", "host", "cause", "evidence", "fix"):
        t.add_column(col)
    color = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in findings:
        t.add_row(f"[{color.get(f.severity, 'white')}]{_escape(f.severity)}[/]", _escape(f.host or "(cluster)"),
                  _escape(f.title), _escape(f.evidence, lines=True), _escape(f.fix, lines=True))
    out.print(t)


# -- doctor --------------------------------------------------------------------------------------
@main.command()
@inventory_option
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
        inv = _load(inventory)
        rep = X.doctor(inv, parallel=parallel)
        if as_json:
            out.print_json(json.dumps({"ok": rep.ok, "findings": [f.__dict__ for f in rep.findings]}))
        else:
            _print_findings(rep.findings)
            n_err = sum(f.severity == "error" for f in rep.findings)
            out.print(f"{len(rep.findings)} finding(s), {n_err} error(s) on {len(inv.hosts)} host(s)"
                      if rep.findings else f"no problems found on {len(inv.hosts)} host(s)")
        if not rep.ok:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


# -- logs ----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@click.argument("hosts", nargs=-1)
@click.option("-f", "--follow", is_flag=True, help="Keep streaming new lines (Ctrl-C to stop).")
@click.option("--tail", type=click.IntRange(0), default=200, show_default=True, help="Lines of history per host.")
def logs(inventory, hosts, follow, tail):
    """The Ray/vLLM container logs of one or every node, each line prefixed with its host.

    Example: bootstrap logs -i hosts.yaml node2 --follow
    """
    from bootstrap.doctor import run as X

    def go():
        inv = _load(inventory)
        names = {h.name for h in inv.hosts}
        for h in hosts:
            if h not in names:
                raise click.BadParameter(f"no host {h!r} in {inv.path} (hosts: {', '.join(sorted(names))})",
                                         param_hint="HOSTS")
        width = max(len(h.name) for h in inv.hosts)
        lock = threading.Lock()

        def emit(host: str, line: str) -> None:
            with lock:
                click.echo(_escape(f"{host:<{width}} | {line}", lines=True, markup=False))
        stop = threading.Event()
        try:
            X.logs(inv, emit, hosts=hosts, tail=tail, follow=follow, stop=stop)
        except KeyboardInterrupt:
            stop.set()
    _run(go)


# -- serve ---------------------------------------------------------------------------------------
@main.command(context_settings={"ignore_unknown_options": True})
@inventory_option
@parallel_option
@click.argument("model", required=False)
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@click.option("--tp", type=click.IntRange(1), default=None, help="Tensor-parallel size (default: GPUs per node).")
@click.option("--pp", type=click.IntRange(1), default=None, help="Pipeline-parallel size (default: number of nodes).")
@click.option("--backend", type=click.Choice(["ray", "native"]), default=None,
              help="ray (default with cluster.runtime ray): the running Ray cluster; native (default with "
                   "runtime none): vLLM's own multi-node mode (--nnodes/--node-rank/--headless).")
@click.option("--sync-model", is_flag=True, help="Copy the model directory from the head to nodes where it differs.")
@click.option("--wait", type=SECONDS, default=900.0, show_default=True,
              help="Seconds to wait for /health and /v1/models.")
@click.option("--listen", default=None, callback=lambda ctx, param, v: _listen(v),
              help="Address vLLM binds (default: the head's data-plane IP).")
@click.option("--served-model-name", default=None, callback=_name)
@click.option("--stop", is_flag=True, help="Stop serving; the Ray cluster keeps running.")
@click.option("--dry-run", is_flag=True,
              help="Read the model's config.json, print the plan (backend, TP/PP and why, each node's command) "
                   "and stop; secrets need not be set.")
@json_option
def serve(inventory, parallel, model, extra, tp, pp, backend, sync_model, wait, listen, served_model_name, stop,
          dry_run, as_json):
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

    _serve_args(click.get_current_context(), model, extra, stop)
    if stop and dry_run:
        raise click.UsageError("--dry-run plans a serve; it cannot be combined with --stop")

    def go():
        inv = _load(inventory, require_secrets=not dry_run)
        if tp is not None or pp is not None:
            try:
                P.parallelism(len(inv.replicas[0]), inv.gpus_per_node, tp, pp, accelerator=inv.cluster.accelerator)
            except P.ServePlanError as exc:
                raise click.UsageError(f"--tp/--pp: {exc}") from None
        if inv.cluster.replicas > 1:
            return _serve_fleet(inv, model, extra, tp, pp, backend, sync_model, wait, listen, served_model_name,
                                stop, dry_run, as_json, parallel)
        if stop:
            V.stop(inv, parallel=parallel, reporter=LineReporter(quiet=as_json))
            out.print("stopped serving on every node; the Ray cluster is still up")
            return
        show = None if as_json else (lambda plan: _print_plan(plan, dry_run))
        try:
            res = V.serve(inv, model, tp=tp, pp=pp, backend=backend, extra=extra, sync_model=sync_model,
                          wait=wait, listen=listen, served_name=served_model_name, parallel=parallel,
                          dry_run=dry_run, on_plan=show, reporter=LineReporter(quiet=as_json))
        except P.ModelSplitError as exc:
            given = tp is not None or pp is not None
            raise click.UsageError(f"{'--tp/--pp' if given and str(exc).startswith('TP=') else 'serve'}: {exc}") \
                from None
        except V.ServeFailed as exc:
            if exc.log_tail:
                err.print("[dim]--- last lines of the vLLM log ---[/]")
                err.print(_escape(exc.log_tail, lines=True))
            _print_findings(exc.findings)
            raise
        if isinstance(res, V.ServePlan):
            if as_json:
                out.print_json(json.dumps({"dry_run": True, **res.to_dict()}))
            return
        kv = res.kv
        if as_json:
            out.print_json(json.dumps({
                "endpoint": res.endpoint, "model": res.model, "served": res.served, "backend": res.backend,
                "tp": res.parallelism.tp, "pp": res.parallelism.pp, "ready_seconds": round(res.ready_seconds, 1),
                "kv_cache_tokens": getattr(kv, "tokens", None), "notes": res.notes,
                "split_reason": res.plan.split.reason if res.plan else None,
                "backend_reason": res.plan.backend_reason if res.plan else None}))
            return
        for n in res.notes:
            out.print(f"note: {_escape(n)}")
        out.print(_escape(f"serving {res.served[0] if res.served else res.model} on {res.endpoint} "
                          f"(backend {res.backend}, TP={res.parallelism.tp}, PP={res.parallelism.pp}); "
                          f"ready in {res.ready_seconds:.0f}s"))
        if kv is not None:
            out.print(f"KV cache: {kv.tokens:,} tokens ({_escape(kv.source_line.strip()[:120])})")
        out.print("try: " + _escape(res.curl()))
    _run(go)


def _serve_fleet(inv, model, extra, tp, pp, backend, sync_model, wait, listen, served_name, stop, dry_run,
                 as_json, parallel) -> None:
    """serve with cluster.replicas > 1: every replica, then the router in front."""
    from bootstrap.fleet import run as FL
    from bootstrap.fleet import plan as FP
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
        out.print(f"stopped serving on {inv.cluster.replicas} replicas and the router; the node containers are still up")
        return
    show = None if as_json else (lambda plan: _print_fleet_plan(plan, dry_run))
    try:
        res = FL.serve_fleet(inv, model, tp=tp, pp=pp, backend=backend, extra=extra, wait=wait,
                             served_name=served_name, parallel=parallel, dry_run=dry_run, on_plan=show, reporter=rep)
    except FP.FleetError as exc:
        raise click.UsageError(str(exc)) from None
    except P.ModelSplitError as exc:
        raise click.UsageError(f"serve: {exc}") from None
    except V.ServeFailed as exc:
        if exc.log_tail:
            err.print("[dim]--- last lines of the vLLM log ---[/]")
            err.print(_escape(exc.log_tail, lines=True))
        raise
    if isinstance(res, FP.FleetPlan):
        if as_json:
            out.print_json(json.dumps({"dry_run": True, **res.to_dict()}))
        return
    if as_json:
        out.print_json(json.dumps({"endpoint": res.endpoint, "served": res.served, **res.plan.to_dict(),
                                   "ready_seconds": {str(k): v for k, v in res.ready_seconds.items()},
                                   "seconds": round(res.seconds, 1)}))
        return
    for n in res.notes:
        out.print(f"note: {_escape(n)}")
    ready = ", ".join(f"replica {k} {t:.0f}s" for k, t in sorted(res.ready_seconds.items()))
    par = res.plan.split.par
    out.print(_escape(f"serving {res.served[0] if res.served else res.plan.spec.model} on {res.endpoint} "
                      f"({len(res.plan.replicas)} replicas x TP={par.tp} PP={par.pp}, router "
                      f"{inv.cluster.router.policy} on {res.plan.router_host}); ready: {ready}; "
                      f"took {res.seconds:.0f}s"))
    out.print("try: " + _escape(res.curl()))


def _print_fleet_plan(plan, dry_run: bool) -> None:
    import shlex

    out.print(f"model:    {_escape(plan.spec.model)} (image {_escape(plan.spec.image)})")
    out.print(f"split:    {_escape(plan.split.reason)} on each replica (backend native)")
    for r in plan.replicas:
        out.print(_escape(f"replica {r.index}: {', '.join(r.hosts)} -> {r.url}"))
        for m in r.members:
            out.print(_escape(f"  {m.host} rank {m.rank}: {shlex.join(m.vllm)}"))
    out.print(_escape(f"router on {plan.router_host}: {shlex.join(plan.router)}"))
    out.print(_escape(f"endpoint: {plan.endpoint}"))
    for note in plan.notes:
        out.print(f"note: {_escape(note)}")
    if dry_run:
        out.print("dry run: nothing was started")


def _print_plan(plan, dry_run: bool) -> None:
    """The serve plan, before anything starts: model, backend, split and why, each node's command."""
    import shlex

    shape = (f" ({plan.shape.describe()}; config.json from {plan.config_source})"
             if plan.shape is not None and plan.shape.known else " (config.json not read: split unchecked)")
    out.print(f"model:   {_escape(plan.model)}{_escape(shape)}")
    out.print(_escape(f"backend: {plan.backend} ({plan.backend_reason})"))
    out.print(f"split:   {_escape(plan.split.reason)}")
    if plan.fit is not None:
        out.print(f"fit:     {_escape(plan.fit.message)}")
    width = max(len(n.host) for n in plan.nodes)
    for n in plan.nodes:
        cmd = shlex.join(n.argv) if n.argv else "(a Ray worker: vLLM places its ranks here through Ray)"
        out.print(_escape(f"  {n.host:<{width}} {n.ip:<15} {cmd}"))
    out.print(_escape(f"endpoint: {plan.endpoint}"))
    for note in plan.notes:
        out.print(f"note: {_escape(note)}")
    if dry_run:
        if plan.secrets:
            out.print(_escape(f"a real run needs {', '.join(plan.secrets)} set in your environment (cluster.secrets)"))
        out.print("dry run: nothing was started")


def _listen(value: str | None) -> str | None:
    import ipaddress

    if value is None:
        return None
    try:
        ipaddress.ip_address(value)
        # ipaddress takes any text after % as an IPv6 scope: it must name an interface
        ok = re.fullmatch(r"[^%]*(%[A-Za-z0-9_.-]+)?", value) is not None
    except ValueError:
        ok = re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?", value) is not None
    if not ok:
        raise click.BadParameter(f"{_quote(value)} is not an IP address or host name")
    return value


def _serve_args(ctx: click.Context, model: str | None, extra: tuple[str, ...], stop: bool) -> None:
    """What serve can refuse from its arguments alone, before reading the inventory."""
    if stop:
        if model is not None or extra:
            got = " ".join(a for a in (model, *extra) if a is not None)
            raise click.UsageError(f"--stop takes no MODEL or vLLM arguments (got {got!r})")
        return
    if model is None:
        raise click.UsageError("missing MODEL: a Hugging Face id (org/name) or an absolute path inside the "
                               "containers, or --stop")
    if model.startswith("-"):
        raise click.UsageError(f"no such option: {model} (vLLM flags go after MODEL, or after --)")
    try:
        P.check_model_ref(model)
    except P.ServePlanError as exc:
        raise click.BadParameter(str(exc), ctx, param_hint="MODEL") from None
    own = {o for p in ctx.command.params if isinstance(p, click.Option) for o in p.opts}
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag in own and flag != "--served-model-name":
            raise click.UsageError(f"{flag} is an option of bootstrap serve, not of vLLM: put it before --")
    try:
        P.check_extra(extra)
    except P.ServePlanError as exc:
        raise click.UsageError(str(exc)) from None


# -- rollout -------------------------------------------------------------------------------------
@main.command(context_settings={"ignore_unknown_options": True})
@inventory_option
@parallel_option
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@click.option("--model", default=None, help="The model to change to (default: the one served).")
@click.option("--image", default=None, help="The image to change to (default: the one served).")
@click.option("--keep-flags", is_flag=True, help="Keep the vLLM flags served now (default: the flags after --).")
@click.option("--max-unavailable", type=click.IntRange(1), default=1, show_default=True,
              help="Replicas replaced at once (never all of them).")
@click.option("--drain", type=SECONDS, default=120.0, show_default=True,
              help="Seconds a replica out of the router may take to finish its requests before it is stopped.")
@click.option("--wait", type=SECONDS, default=900.0, show_default=True,
              help="Seconds a new replica may take to answer a completion.")
@json_option
def rollout(inventory, parallel, extra, model, image, keep_flags, max_unavailable, drain, wait, as_json):
    """Change the model, vLLM flags or image of a fleet (cluster.replicas > 1), replica by replica.

    Each replica leaves the router, drains (running + waiting requests at zero, or --drain), stops,
    starts with the new spec, must answer a real completion, and goes back into the router. A
    replica that fails is rolled back and the rollout stops (exit 1, naming it); the others keep
    serving. Ctrl-C rolls back the replica in flight and lists each replica's state.

    Example: bootstrap rollout -i hosts.yaml -- --max-model-len 4096
    """
    from bootstrap.fleet import run as FL
    from bootstrap.serve import run as V

    if keep_flags and extra:
        raise click.UsageError("--keep-flags keeps the flags served now: give no vLLM flags with it")
    if model is not None:
        try:
            P.check_model_ref(model)
        except P.ServePlanError as exc:
            raise click.BadParameter(str(exc), param_hint="--model") from None
    try:
        P.check_extra(extra)
    except P.ServePlanError as exc:
        raise click.UsageError(str(exc)) from None

    def go():
        inv = _load(inventory)
        if inv.cluster.replicas < 2:
            raise click.UsageError("rollout replaces replicas one by one: set cluster.replicas (2 or more) in the "
                                   "inventory; with one replica use bootstrap serve")
        t0 = time.monotonic()

        def step(k: int, what: str) -> None:
            if not as_json:
                err.print(_escape(f"{time.monotonic() - t0:7.1f}s replica {k}: {what}"))
        try:
            res = FL.rollout(inv, model=model, extra=None if keep_flags else tuple(extra), image=image, drain=drain,
                             wait=wait, max_unavailable=max_unavailable, parallel=parallel,
                             reporter=LineReporter(quiet=True), on_step=step)
        except FL.RolloutFailed as exc:
            if exc.log_tail:
                err.print("[dim]--- last lines of the failed replica's vLLM log ---[/]")
                err.print(_escape(exc.log_tail, lines=True))
            for k, st in sorted(exc.states.items()):
                err.print(_escape(f"  replica {k}: {st}"))
            raise
        except V.ServeFailed:
            raise
        if as_json:
            out.print_json(json.dumps({"endpoint": res.endpoint, "model": res.target.model,
                                       "extra": list(res.target.extra), "image": res.target.image,
                                       "replaced": res.replaced, "unchanged": res.unchanged,
                                       "seconds": round(res.seconds, 1),
                                       "steps": {str(k): {n: round(v, 1) for n, v in d.items()}
                                                 for k, d in res.steps.items()}}))
            return
        if not res.replaced:
            out.print(_escape(f"every replica already serves {res.target.describe()}: nothing to do"))
            return
        out.print(_escape(f"rolled out {res.target.describe()} to replica(s) {', '.join(map(str, res.replaced))} "
                          f"in {res.seconds:.0f}s; serving on {res.endpoint}"))
    _run(go)


# -- top -----------------------------------------------------------------------------------------
@main.command()
@inventory_option
@click.option("--interval", type=click.FloatRange(0.5, 60), default=2.0, show_default=True,
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
        inv = _load(inventory, require_secrets=False)  # the probes read nothing secret
        prom = None
        if source != "probe":
            from bootstrap.monitor import run as MON

            prom = MON.running_url(inv)
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
                if as_json:
                    out.print_json(json.dumps(frame.to_dict()))
                else:
                    out.print(_top_table(inv, frame))
                if frame.down:
                    sys.exit(int(ExitStatus.ERROR))
                return
            from rich.live import Live

            with Live(_top_table(inv, look()), console=out, auto_refresh=False,
                      screen=False, transient=False) as live:
                while True:
                    t0 = time.monotonic()
                    live.update(_top_table(inv, look()), refresh=True)
                    time.sleep(max(0.0, interval - (time.monotonic() - t0)))
    _run(go)


def _top_table(inv, frame) -> Table:
    def f(v, fmt="{:.1f}", unit=""):
        return "-" if v is None else fmt.format(v) + unit

    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f}"

    stamp = time.strftime("%H:%M:%S", time.localtime(frame.t))
    src = "probes" if frame.source == "probe" else f"Prometheus {frame.source}"
    t = Table(title=_escape(f"{inv.cluster.name} at {stamp}, every {frame.interval:g}s from {src}; "
                            f"latency over the last {frame.window:.0f}s"), title_justify="left")
    for col in ("replica", "running", "waiting", "req/s", "tok/s", "TTFT p50/p95 ms", "ITL p50/p95 ms",
                "KV %", "hosts / why down"):
        t.add_column(col, justify="left" if col in ("replica", "hosts / why down") else "right")
    for r in (r for r in frame.rows if r.kind == "replica"):
        style = None if r.up else "red"
        t.add_row(_escape(r.name), f(r.running, "{:.0f}"), f(r.waiting, "{:.0f}"), f(r.req_s, "{:.2f}"),
                  f(r.tok_s), f"{ms(r.ttft_p50)}/{ms(r.ttft_p95)}", f"{ms(r.itl_p50)}/{ms(r.itl_p95)}", f(r.kv),
                  _escape(", ".join(r.hosts) if r.up else f"DOWN: {r.error}"), style=style)
    n = Table(title_justify="left")
    for col in ("node", "replica", "CPU %", "mem %", "GPU %", "GPU mem %", "why down"):
        n.add_column(col, justify="left" if col in ("node", "why down") else "right")
    for r in (r for r in frame.rows if r.kind == "node"):
        n.add_row(_escape(r.name), "-" if r.replica is None else str(r.replica), f(r.cpu), f(r.mem),
                  f(r.gpu_util), f(r.gpu_mem), "" if r.up else _escape(f"DOWN: {r.error}"),
                  style=None if r.up else "red")
    grid = Table.grid()
    grid.add_row(t)
    grid.add_row(n)
    return grid


# -- bench ---------------------------------------------------------------------------------------
@main.command()
@inventory_option
@click.option("--url", default=None, callback=lambda ctx, param, v: _url(v),
              help="Endpoint to load (default: the inventory's head and vLLM port; with replicas, the router, "
                   "and the requests each replica served are reported).")
@click.option("--model", default=None, callback=_name, help="Model name (default: the first one /v1/models lists).")
@click.option("-n", "--requests", "n_requests", type=click.IntRange(1, 100000), default=64, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 1024), default=8, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--prompt", default=None, callback=_nonempty, help="Prompt text (default: a fixed paragraph).")
@click.option("--ignore-eos", is_flag=True, help="Always generate --max-tokens tokens (vLLM extension).")
@click.option("--timeout", type=SECONDS, default=120.0, show_default=True, help="Seconds per request.")
@click.option("--png", type=_FilePath(), default=None, callback=lambda ctx, param, v: _png(v),
              help="Write latency histograms to this PNG.")
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
            inv = _load(inventory, check_files=False)
            target = f"http://{inv.head.ip}:{inv.cluster.ports.vllm}"
            if inv.cluster.replicas > 1:
                from bootstrap.fleet import plan as FP
                target, fleet_inv = FP.router_url(inv), _load(inventory)
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
        if as_json:
            out.print_json(json.dumps({**res.to_dict(), **({"spread": spread.to_dict()} if spread else {})}))
        else:
            out.print(_escape(B.format_result(res), lines=True))
            if spread is not None:
                out.print(_escape(spread.describe()))
            if png:
                out.print(_escape(f"histograms: {png}"))
        if res.ok == 0:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


def _url(value: str | None) -> str | None:
    from bootstrap.serve import bench as B

    if value is not None:
        try:
            B.split_url(value)
        except UsageError as exc:
            raise click.BadParameter(str(exc).removeprefix("bench: ")) from None
    return value


def _png(value: str | None) -> str | None:
    """Checked before the load runs, not after it: the folder exists and matplotlib is there."""
    import importlib.util

    if value is None:
        return None
    parent = Path(value).expanduser().parent
    if not parent.is_dir():
        raise click.BadParameter(f"{value!r}: no folder {str(parent)!r}")
    if importlib.util.find_spec("matplotlib") is None:
        raise click.BadParameter("writing a PNG needs matplotlib: pip install matplotlib")
    return value


# -- monitor -------------------------------------------------------------------------------------
@main.group()
def monitor():
    """Prometheus for the cluster: a node exporter on every host, Prometheus on one host
    (cluster.monitor.host, default the head) scraping vLLM, the router, Ray and the exporters.

    Example: bootstrap monitor up -i hosts.yaml
    """


def _monitor_session(inventory, reporter=None):
    inv = _load(inventory, require_secrets=False)  # nothing secret goes to the monitoring containers
    sess = Session(inv, reporter=reporter)
    sess.connect()
    return inv, sess


def _print_targets(res) -> None:
    t = Table(title=f"Prometheus {_escape(res.url)} on {_escape(res.host)}: "
                    f"{len(res.targets) - len(res.down)} of {len(res.targets)} target(s) up")
    for col in ("job", "host", "replica", "url", "health", "error"):
        t.add_column(col)
    for x in res.targets:
        color = "green" if x.health == "up" else "red"
        t.add_row(_escape(x.job), _escape(x.host), x.replica or "-", _escape(x.url), f"[{color}]{x.health}[/]",
                  _escape(x.error[:100]))
    out.print(t)


@monitor.command("up")
@inventory_option
@click.option("--wait", type=SECONDS, default=120.0, show_default=True,
              help="Seconds to wait for every target to be up.")
@json_option
def monitor_up(inventory, wait, as_json):
    """Start (or update) the exporters and Prometheus; the scrape configuration is generated from
    the inventory on every run, and a running Prometheus reloads it. Exit 1 if an exporter, Ray or
    Prometheus target is down (vLLM's and the router's come up when `serve` runs).

    Example: bootstrap monitor up -i hosts.yaml
    """
    from bootstrap.monitor import run as MON

    def go():
        inv, sess = _monitor_session(inventory, LineReporter(quiet=as_json))
        with sess:
            res = MON.monitor_up(sess, wait=wait)
        if as_json:
            out.print_json(json.dumps(res.to_dict()))
        else:
            _print_targets(res)
            when = (f"all up {res.all_up_after:.1f}s after the start" if res.all_up_after is not None
                    else f"{len(res.down)} down")
            mh = next(h for h in inv.hosts if h.name == res.host)
            out.print(_escape(f"Prometheus: {res.url} ({when}; took {res.seconds:.1f}s); "
                              f"{_ssh_tunnel(mh, mh.ip, inv.cluster.monitor.port)}"))
            if res.down and not res.down_infrastructure:
                out.print("note: vLLM's targets are up once `bootstrap serve` runs; Prometheus keeps trying")
            for w in res.warnings:
                out.print(f"[yellow]warning:[/] {_escape(w)}")
        if res.down_infrastructure:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


@monitor.command("status")
@inventory_option
@json_option
def monitor_status(inventory, as_json):
    """List every scrape target up or down, as Prometheus sees it (exit 1 if one is down).

    Example: bootstrap monitor status -i hosts.yaml
    """
    from bootstrap.monitor import run as MON

    def go():
        inv, sess = _monitor_session(inventory)
        with sess:
            res = MON.monitor_status(sess)
        if as_json:
            out.print_json(json.dumps(res.to_dict()))
        else:
            _print_targets(res)
        if res.down:
            sys.exit(int(ExitStatus.ERROR))
    _run(go)


@monitor.command("down")
@inventory_option
@click.option("--purge", is_flag=True, help="Also delete Prometheus' stored samples (its data volume).")
def monitor_down(inventory, purge):
    """Remove Prometheus and the exporters from every host.

    Example: bootstrap monitor down -i hosts.yaml --purge
    """
    from bootstrap.monitor import run as MON

    def go():
        inv, sess = _monitor_session(inventory, LineReporter())
        with sess:
            res = MON.monitor_down(sess, purge=purge)
        out.print(_escape(f"monitoring removed from {len(res)} host(s)" + (" (data purged)" if purge else "")))
    _run(go)


# -- sandbox -------------------------------------------------------------------------------------
@main.group()
def sandbox():
    """A local cluster of simulated hosts (containers with their own IP, sshd and Docker daemon).

    Needs a running Docker engine on this machine; no GPU. Example: bootstrap sandbox up --nodes 3
    """


@sandbox.command("up")
@click.option("--nodes", type=click.IntRange(1, 200), default=3, show_default=True)
@click.option("--kind", type=click.Choice(["full", "sshd"]), default="full", show_default=True,
              help="full: sshd + Docker daemon per node; sshd: sshd only (fan-out benchmarks).")
def sandbox_up(nodes, kind):
    """Build the images (cached), start the registry and N nodes, write their inventory.

    Example: bootstrap sandbox up --nodes 3
    """
    from bootstrap import sandbox as S

    def go():
        try:
            info = S.sandbox_up(nodes, log=lambda m: err.print(f"[dim]sandbox:[/] {_escape(m)}"), kind=kind)
        except (RuntimeError, OSError, ValueError) as exc:
            raise BootstrapError(f"sandbox: {exc}") from None
        out.print(_escape(f"sandbox up: {len(info.nodes)} node(s) on {info.subnet}, registry {info.registry}"))
        out.print(_escape(f"inventory: {info.inventory}"))
        out.print(_escape(f"next: bootstrap up -i {info.inventory}"))
    _run(go)


@sandbox.command("down")
def sandbox_down():
    """Remove the sandbox nodes, registry container and network.

    Example: bootstrap sandbox down
    """
    from bootstrap import sandbox as S

    def go():
        try:
            S.sandbox_down(log=lambda m: err.print(f"[dim]sandbox:[/] {_escape(m)}"))
        except (RuntimeError, OSError) as exc:
            raise BootstrapError(f"sandbox: {exc}") from None
        out.print("sandbox down")
    _run(go)


if __name__ == "__main__":  # pragma: no cover
    main()
