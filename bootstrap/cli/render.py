"""What the `bootstrap` command prints: errors, usage lines, status, and (re-exported) every command's renderer.

Progress and errors go to stderr (`err`), `--json` documents and results to stdout (`out`). Every
value from a user, an inventory or a host goes through _escape (cli/show.py): printed as it is, on
one line. The renderers of the other commands live in cli/render_*.py, one per section of the help;
they are re-exported here, so that the commands and the tests call them all as render.NAME.
"""
from __future__ import annotations

import click
from rich.table import Table

from bootstrap import face
from bootstrap.cli.render_checks import doctor, kv_check, log_echo, logs_result, nccl
from bootstrap.cli.render_cluster import (
    down,
    down_result,
    exec_echo,
    exec_results,
    fleet_plan,
    left_out,
    plan_result,
    plan_rows,
    sudoers,
    up,
    up_approve,
    up_replica,
    validated,
)
from bootstrap.cli.render_observe import (
    monitor_down,
    monitor_status,
    monitor_up,
    sandbox_down,
    sandbox_log,
    sandbox_up,
    targets,
    top,
    top_live,
)
from bootstrap.cli.render_serving import (
    adapter,
    bench,
    bench_ab,
    bench_ab_approve,
    bench_ab_arm,
    drained,
    dry_run,
    fleet_serve_plan,
    fleet_serve_stopped,
    fleet_served,
    pool_changes,
    rollout,
    rollout_failed,
    rollout_step,
    serve_failed,
    serve_outcome,
    serve_plan,
    serve_plans,
    serve_stopped,
    served,
)
from bootstrap.cli.show import (
    PROG,
    LineReporter,
    _argv,
    _escape,
    _json,
    _log_tail,
    _mask_doc,
    _ssh_tunnel,
    err,
    findings,
    kv_line,
    mask_credentials,
    out,
    progress_reporter,
)
from bootstrap.errors import BootstrapError, GroupError, Interrupted, notes_of, was_shown
from bootstrap.face import docs as D

__all__ = [
    "PROG", "LineReporter", "_argv", "_escape", "_json", "_log_tail", "_mask_doc", "_ssh_tunnel", "adapter", "bench",
    "bench_ab", "bench_ab_approve", "bench_ab_arm", "drained",
    "doctor", "down", "down_result", "dry_run", "err", "exec_echo", "exec_results", "findings", "fleet_plan",
    "fleet_serve_plan", "fleet_serve_stopped", "fleet_served", "kv_check", "kv_line", "left_out", "log_echo",
    "logs_result", "mask_credentials", "monitor_down", "monitor_status", "monitor_up", "nccl", "out", "plan_result",
    "plan_rows", "pool_changes", "progress_reporter", "rollout", "rollout_failed", "rollout_step", "sandbox_down",
    "sandbox_log", "sandbox_up", "serve_failed", "serve_outcome", "serve_plan", "serve_plans", "serve_stopped",
    "served", "sudoers", "targets", "top", "top_live", "up", "up_approve", "up_replica", "validated",
]


def _standby_cell(standbys: dict[str, str] | None) -> str:
    """A replica's standbys: how many of its members have one running (cluster.standby)."""
    if standbys is None:
        return "-"
    up = sum(1 for v in standbys.values() if v == "running")
    return f"[green]{up}/{len(standbys)}[/]" if up == len(standbys) else f"[yellow]{up}/{len(standbys)}[/]"


# -- errors --------------------------------------------------------------------------------------
def failure(exc: BootstrapError) -> None:
    """A domain error: one line, then each host's state (an interrupt) or result (a group), then
    any second failure attached to an error (errors.add_note: e.g. a container that could not be
    removed after the `docker run` that used it failed), one `also:` line each."""
    err.print(f"[red]error:[/] {_escape(str(exc))}")
    for note in notes_of(exc):
        err.print(f"  [red]also:[/] {_escape(note)}")
    if isinstance(exc, Interrupted):
        for host, state in exc.states.items():
            color = "green" if state.startswith("done") else "yellow"
            err.print(f"  {_escape(f'{host:<16}')} [{color}]{_escape(state)}[/]")
    if isinstance(exc, GroupError):
        told = set(_told(exc))
        for host, r in exc.results.items():
            mark = "[red]FAILED[/]" if isinstance(r, BaseException) else "[green]ok[/]"
            why = _escape(r) if isinstance(r, BaseException) and not was_shown(r) and host not in told else ""
            err.print(f"  {_escape(f'{host:<16}')} {mark} {why}".rstrip())
            for note in notes_of(r) if isinstance(r, BaseException) else ():
                err.print(f"  {'':<16} [red]also:[/] {_escape(note)}")


def _told(exc: GroupError) -> list[str]:
    """The failed hosts whose error the `error:` line carries (GroupError's str: the first three)."""
    return sorted(exc.failures)[:3]



#: Written by the signal handler (cli._Interrupts) as they are, with os.write: a second signal while
#: the first one's clean-up runs, and a third.
INTERRUPTED_AGAIN = "interrupted again: finishing the clean-up (once more to exit at once)\n"
INTERRUPTED_AT_ONCE = "interrupted a third time: exiting at once; the cluster lock is released with the connection\n"


def interrupted() -> None:
    """Ctrl-C or SIGTERM while a command runs."""
    err.print("[yellow]interrupted[/]: remote commands in flight were abandoned; run the same "
              "command again to continue from where each host is")


def aborted() -> None:
    """Ctrl-C while click reads the command line."""
    err.print("[yellow]interrupted[/]")


def _param_name(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def usage_line(e: click.ClickException) -> str:
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


def usage_error(e: click.ClickException) -> None:
    err.print(f"[red]error:[/] {_escape(usage_line(e))}")


# -- status --------------------------------------------------------------------------------------
def status(inv, st, as_json: bool) -> None:
    """`status`: each node's container and Ray state, then what is served and the Ray dashboard."""
    rows = st.nodes
    if as_json:
        _json(D.status_doc(st), out)
        return
    ray = st.runtime != "none"
    native = "" if ray else " (no Ray: vLLM's native multi-node mode)"
    t = Table(title=f"cluster {_escape(inv.cluster.name)}{native}")
    for col in ("host", "ip", "role", "container", "ray" if ray else "node", "GPUs", "note"):
        t.add_column(col)
    for r in rows:
        cont = _escape(r.container) if r.reachable else "[red]unreachable[/]"
        t.add_row(_escape(r.host), _escape(r.ip), _escape(r.role), cont, _alive_cell(r, st.ray_error),
                  f"{r.gpus:g}" if r.ray_alive else ("-" if _known(r, st.ray_error) else "?"), _escape(r.error[:120]))
    out.print(t)
    for line in _status_lines(inv, st):
        out.print(line)


def _alive_cell(r, ray_error: str) -> str:
    """A node's Ray (or native node) cell: alive, no, or unknown where nobody could tell (the host did not
    answer, or Ray's view could not be read from the head): never "no" for "not known"."""
    if r.ray_alive:
        return "[green]alive[/]"
    return "[red]no[/]" if _known(r, ray_error) else "[yellow]unknown[/]"


def _known(r, ray_error: str) -> bool:
    """Whether anyone could tell this node's state: Ray says it is alive, or the host answered and Ray's
    view was read."""
    return r.ray_alive or (r.reachable and not ray_error)


def exposure(inv, found, as_json: bool) -> None:
    """`status --exposure`: each listening socket of the cluster's, then one line: what is open beyond
    SSH and the endpoint."""
    beyond = [e for e in found if e.open_beyond]
    if as_json:
        _json(D.exposure_doc(inv, found), out)
        return
    t = Table(title=f"cluster {_escape(inv.cluster.name)}: listening ports")
    for col in ("host", "address", "port", "what", "bind", "auth", "reachable by"):
        t.add_column(col)
    colour = {"anyone": "red", "unknown": "red", "members": "green", "this host": "green"}
    for e in found:
        reach = e.reach + (" (by design)" if e.expected and e.reach == "anyone" else "")
        style = "yellow" if e.expected and e.reach == "anyone" else colour[e.reach]
        if e.allowed:  # fenced: the networks cluster.fence_allow admits come through too
            reach += " and " + ", ".join(n + (" (public)" if n in e.public else "") for n in e.allowed)
            style = "red" if e.public and not e.expected else style
        t.add_row(_escape(e.host), _escape(e.address), str(e.port), _escape(e.what), _escape(e.bind),
                  _escape(e.auth), f"[{style}]{_escape(reach)}[/]")
    out.print(t)
    wild = sum(1 for e in found if e.bind == "all interfaces")
    if beyond:
        out.print(f"[red]{len(beyond)} port(s) open to non-members beyond SSH and the endpoint[/]: "
                  + ", ".join(f"{_escape(e.host)}:{e.port} ({_escape(e.what)})" for e in beyond[:12])
                  + (f" and {len(beyond) - 12} more" if len(beyond) > 12 else "")
                  + ("" if inv.cluster.fence else " -- cluster.fence is off")
                  + _public_allowed(beyond))
    else:
        out.print(f"nothing open to non-members beyond SSH and the endpoint ({len(found)} listening socket(s), "
                  f"{wild} on all interfaces, fenced)")


def _public_allowed(beyond) -> str:
    """The public networks cluster.fence_allow admits to the ports open beyond, and the fix."""
    nets = list(dict.fromkeys(n for e in beyond for n in e.public))
    if not nets:
        return ""
    return (f" -- cluster.fence_allow admits public address space ({_escape(', '.join(nets))}): "
            "narrow it to the addresses that need the cluster's ports")


def _rotation_cell(r) -> str:
    """in router: yes / no, and the hosts `bootstrap drain` marked."""
    rot = "-" if r.in_rotation is None else ("[green]yes[/]" if r.in_rotation else "[yellow]no[/]")
    return rot + (f" [yellow](drained: {_escape(', '.join(r.drained))})[/]" if r.drained else "")


def _kv_index(fs) -> None:
    """kv_aware: how often each router's index of the engines' KV events held a prefix of the prompt."""
    for rv in fs.routers:
        looked = sum((rv.kv_lookups or {}).values())
        if looked:
            hits = (rv.kv_lookups or {}).get("hit", 0)
            out.print(_escape(f"kv_aware on {rv.host}: its index of the engines' KV events held a prefix of the "
                              f"prompt for {hits:g} of {looked:g} requests ({100 * hits / looked:.0f} %)"))


def fleet_status(inv, groups, fs, as_json: bool) -> None:
    """`status` with replicas: each group's nodes, each replica as the router sees it, the endpoint
    and each group's Ray dashboard."""
    nodes = [(k, r) for k, g in enumerate(groups) for r in g.nodes]
    if as_json:
        _json(D.fleet_status_doc(groups, fs), out)
        return
    t = Table(title=f"cluster {_escape(inv.cluster.name)}: {inv.cluster.replicas} replicas")
    for col in ("replica", "host", "ip", "role", "container", "ray", "note"):
        t.add_column(col)
    for k, r in nodes:
        cont = _escape(r.container) if r.reachable else "[red]unreachable[/]"
        t.add_row(str(k), _escape(r.host), _escape(r.ip), _escape(r.role), cont,
                  _alive_cell(r, groups[k].ray_error), _escape(r.error[:120]))
    out.print(t)
    pd = any(r.role for r in fs.replicas)
    t = Table(title=f"serving through the router on {_escape(fs.router_host)} ({_escape(fs.router)})"
              + (": prefill/decode disaggregated" if pd else ""))
    for col in ("replica", *(("serves", "KV pulled (failed)") if pd else ()), "hosts", "url", "health", "in router",
                "router says", "running", "waiting", "served", "restarts", "standby", "model"):
        t.add_column(col)
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    for r in fs.replicas:
        color = "green" if r.health == "healthy" else ("yellow" if r.health.startswith("starting") else "red")
        rot = _rotation_cell(r)
        model = _model_cell(r.spec)
        served = num(r.succeeded)
        if r.engines and len(r.engines) > 1:  # a data parallel replica: each engine's share
            order = sorted(r.engines.items(), key=lambda x: (len(x[0]), x[0]))  # 0, 1, ..., 10
            served += " (" + ", ".join(f"engine {k}: {n:g}" for k, n in order) + ")"
        says = ("-" if r.router_healthy is None else "[red]unhealthy[/]" if not r.router_healthy
                else "[yellow]circuit open[/]" if r.router_circuit_closed is False else "[green]healthy[/]")
        kv = ("-" if r.kv_transfers is None and r.kv_failed is None
              else f"{num(r.kv_transfers)} ({'[red]' + num(r.kv_failed) + '[/]' if r.kv_failed else num(r.kv_failed)})")
        t.add_row(str(r.index), *((_escape(r.role or "-"), kv) if pd else ()), _escape(", ".join(r.hosts)),
                  _escape(r.url), f"[{color}]{_escape(r.health)}[/]", rot, says, num(r.running), num(r.waiting),
                  _escape(served), str(r.restarts), _standby_cell(r.standbys), _escape(model))
    out.print(t)
    _pool_models(fs)
    if len(fs.routers) > 1 or fs.vip:
        t = Table(title="routers" + (f": floating address {_escape(fs.vip)}" if fs.vip else ""))
        for col in ("host", "router", "workers", *(("keepalived", "holds the address") if fs.vip else ())):
            t.add_column(col)
        for rv in fs.routers:
            st = f"[green]{_escape(rv.state)}[/]" if rv.state == "running" else f"[red]{_escape(rv.state)}[/]"
            workers = "-" if rv.workers is None else _escape(", ".join(rv.workers) or "none")
            holds = "-" if rv.holds_vip is None else "[green]yes[/]" if rv.holds_vip else "no"
            vipcols = () if not fs.vip else (_escape(rv.vip_state or "-"), holds)
            t.add_row(_escape(rv.host), st, workers, *vipcols)
        out.print(t)
    _kv_index(fs)
    if fs.vip:
        held = f"held by {fs.vip_holder}" if fs.vip_holder else "[red]held by no router host[/]"
        out.print(f"endpoint: {_escape(fs.endpoint)} (floating address, {_escape(held) if fs.vip_holder else held})")
    else:
        out.print(_escape(f"endpoint: {fs.endpoint} (router {fs.router}; one host: cluster.router.vip "
                          "puts a floating address in front of routers on two hosts)"))
    for k, g in enumerate(groups):
        if g.ray_error:
            out.print(f"Ray of replica {k}: [yellow]unknown[/]: {_escape(g.ray_error)}")
        if g.dashboard:
            out.print(_dashboard_line(f"Ray dashboard of replica {k}", g.dashboard, inv.replicas[k][0]))


def _model_cell(spec) -> str:
    """What a replica serves: its model and flags (its served name first, a pool's)."""
    if spec is None:
        return "-"
    model = f"{spec.model} {' '.join(spec.extra)}".strip() + (f" (--dp {spec.dp})" if spec.dp else "")
    return f"{spec.served_name}: {model}" if spec.served_name else model


def _pool_models(fs) -> None:
    """A pool's line per model: its replicas, how many are healthy and in the router (none for one model)."""
    for m in D.models_doc(fs):
        n = len(m["replicas"])
        color = "green" if m["healthy"] == n else "yellow" if m["healthy"] else "red"
        out.print(_escape(f"model {m['model']} ({m['source']}): replica{'s' if n > 1 else ''} "
                          f"{', '.join(map(str, m['replicas']))}; ") + f"[{color}]{m['healthy']}/{n} healthy[/]"
                  + _escape(f", {m['in_router']}/{n} in the router"
                            + "".join(f"; adapter {a} on {c}/{n}" for a, c in sorted(m["adapters"].items()))
                            + (f"; KV cache {100 * m['kv_cache_usage']:.0f} % used (fullest replica)"
                               if m["kv_cache_usage"] is not None else "")))


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _status_lines(inv, st) -> list[str]:
    """The serving and dashboard lines under the node table."""
    lines = []
    if st.ray_error:
        lines.append(f"Ray: [yellow]unknown[/]: {_escape(st.ray_error)}")
    v = st.serving
    if v is None and st.serving_error:
        lines.append(f"serving: [yellow]unknown[/]: {_escape(st.serving_error)}")
    elif v is None:
        lines.append("serving: nothing (bootstrap serve MODEL)")
    else:
        color = "green" if v.health == "healthy" else ("yellow" if v.health.startswith("starting") else "red")
        name = v.served[0] if v.served else v.model
        lines.append(f"serving: {_escape(name)} on {_escape(v.endpoint)} [{color}]{_escape(v.health)}[/] "
                     + _escape(f"(backend {v.backend}, {f'DP={v.dp} x ' if v.dp > 1 else ''}TP={v.tp} PP={v.pp}, "
                               + (f"EP={v.ep} over {v.all2all or 'the default all-to-all'}, " if v.ep > 1 else "")
                               + f"{len(v.nodes)} node(s), up {_uptime(v.uptime_s)})"))
        if v.dp > 1 and v.engines is not None:
            lines.append(_escape("engines: " + ", ".join(f"{k}: {n:g} request(s) served"
                                                          for k, n in sorted(v.engines.items(), key=lambda x: x[0]))))
        if v.kv is not None:
            lines.append(_escape(kv_line(v.kv)))
    if st.dashboard:
        lines.append(_dashboard_line("Ray dashboard", st.dashboard, inv.head))
    return lines


def _dashboard_line(label: str, address: str, head) -> str:
    """The Ray dashboard's address, with the `ssh -L` line when it listens on localhost."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    line = f"{label}: http://{'[' + host + ']:' + port if ':' in host and not address.startswith('[') else address}"
    if host.startswith("127.") or host == "::1":
        line += f" on {head.name} ({_ssh_tunnel(head, host, port)})"
    return _escape(line)


def prometheus(url: str | None, host, port) -> None:
    """The line under `status`: Prometheus' URL on `host` and how to reach it, or that it is not running."""
    if url:
        out.print(_escape(f"Prometheus: {url} on {host.name} ({_ssh_tunnel(host, host.ip, port)})"))
    else:
        out.print("Prometheus: not running (bootstrap monitor up)")


def prometheus_unknown(exc: BootstrapError) -> None:
    """The line under `status` when the monitor host (or its Docker) does not answer: Prometheus'
    state is unknown, which is not "not running"."""
    out.print(f"Prometheus: [yellow]unknown[/]: {_escape(exc)}")


def top_without_prometheus(exc: BootstrapError) -> None:
    """`top --source auto` when the monitor host (or its Docker) does not answer: say so, then sample
    with the probes."""
    err.print(f"[yellow]warning:[/] cannot use Prometheus: {_escape(exc)}; sampling every host's container instead")


def status_result(res, as_json: bool) -> None:
    """`status`'s face result: one cluster's, a fleet's, or --exposure's; then the Prometheus line."""
    if isinstance(res, face.ExposureResult):
        exposure(res.inv, res.found, as_json)
        return
    if isinstance(res, face.FleetStatusResult):
        fleet_status(res.inv, res.groups, res.fleet, as_json)
    else:
        status(res.inv, res.status, as_json)
    p = res.prometheus
    if p is not None:
        if p.unknown is not None:
            prometheus_unknown(p.unknown)
        else:
            prometheus(p.url, p.host, p.port)
