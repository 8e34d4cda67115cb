"""What the cluster commands print: validate, plan, up, exec and down (text; `--json`: the face's documents).
"""
from __future__ import annotations

import sys
import threading

from rich.table import Table

from bootstrap import face
from bootstrap.cli.show import _argv, _escape, _json, err, out
from bootstrap.face import docs as D
from bootstrap.face import planview as PV


# -- validate ------------------------------------------------------------------------------------
def validated(res, as_json: bool = False) -> None:
    """`validate`: the ok line, or every error (one `error:` line each, in the order of the file)."""
    if as_json:
        _json(res.to_doc())
        return
    for e in res.errors:
        err.print(f"[red]error:[/] {_escape(str(e))}")
    inv = res.inventory
    if inv is None:
        return
    gpus = f", {inv.gpus_per_node} GPU(s) per node" if inv.cluster.accelerator == "gpu" else ""
    offline = " (offline: the key files and the secrets' values not checked)" if res.offline else ""
    out.print(_escape(f"{inv.path}: ok: {len(inv.hosts)} host(s), head {inv.head.name} ({inv.head.ip}){gpus}{offline}"))
    for note in res.notes:
        out.print(f"[yellow]note:[/] {_escape(note)}")


# -- plan ----------------------------------------------------------------------------------------
def plan_rows(actions, as_json: bool, live: bool, runtime: str | None = "", why: str = "",
              wrapper: bool = True) -> None:
    """Each host's container (`plan`; `up --dry-run` with live=True: and what would change): a row per
    host, the secrets' wrapper once, the head's `docker run` whole and the others' as what differs
    (face/planview.py). runtime None: not decided yet (cluster.runtime unset, the image not looked
    at): then why says so, and the rows show the containers with Ray. wrapper: say what the wrapper
    is (a fleet says it once, before its first replica)."""
    if as_json:
        _json(D.plan_doc(actions, runtime))
        return
    if why and not why.startswith("cluster.runtime:"):
        out.print(_escape(f"runtime: {runtime or face.RUNTIME_UNDECIDED}: {why}"))
    rows = PV.views(actions)
    t = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("host", "ip", "role", *(("action", "why") if live else ()), "runs"):
        t.add_column(col)
    for v in rows:
        color = {"keep": "green", "create": "cyan", "recreate": "yellow"}.get(v.action, "white")
        t.add_row(_escape(v.host), _escape(v.ip), _escape(v.role),
                  *((f"[{color}]{v.action}[/]", _escape(v.reason)) if live else ()), _escape(_argv(v.runs)))
    out.print(t)
    if wrapper and PV.has_wrapper(actions):
        out.print(_escape(f"{PV.WRAPPER} (the container's entrypoint: exports each secret named after it from "
                          "its file on the host's tmpfs, then execs the command after --):"))
        out.print("  " + _escape(PV.wrapper_script()), soft_wrap=True)
    for v in rows:
        if v.argv is not None:
            out.print(f"[bold]{_escape(v.host)}[/] ({_escape(v.role)})")
            out.print("  " + _escape(_argv(v.argv)), soft_wrap=True)
            continue
        base, own, gone, runs = v.differs
        said = [_argv(it) for it in own] + [f"(no {_argv(it)})" for it in gone]
        out.print(f"[bold]{_escape(v.host)}[/] ({_escape(v.role)}): as {_escape(base)}'s, but "
                  + (_escape(" ".join(said)) if said else "no option differs")
                  + (f"; runs {_escape(_argv(runs))}" if runs else ""), soft_wrap=True)
    for a in actions:  # from the nodes' facts (up --dry-run): what the fabric gave NCCL, and why
        for note in a.fabric:
            out.print(f"fabric: {_escape(a.host)}: {_escape(note)}", soft_wrap=True)


def fleet_plan(replicas, routers, router_url: str, keeper_argv, as_json: bool, standby: str | None = None,
               models: list | None = None, idle: list | None = None) -> None:
    """`plan` with replicas: replicas is [(url, actions)] per replica, then the routers
    (fleet.plan.RouterLaunch) and the keeper; `standby`: the members' standby containers' name
    (cluster.standby), else None."""
    if as_json:
        _json(D.fleet_plan_doc(replicas, routers, router_url, keeper_argv, standby, models=models, idle=idle))
        return
    for k, (url, acts) in enumerate(replicas):
        what = f" serves {models[k]['model']} ({models[k]['source']})" if models else ""
        out.print(f"[bold]replica {k}[/]{_escape(what)} -> {_escape(url)}")
        plan_rows(acts, False, live=False, wrapper=k == 0)
    if idle:
        out.print(_escape(f"idle: {', '.join(idle)} (no model's replica takes them: `serve` stops what serves there)"))
    for r in routers:
        by = "; routes by the request's model" if models else ""
        out.print(f"[bold]router[/] on {_escape(r.host)} -> {_escape(router_url)}/v1 "
                  f"(worker URLs as `bootstrap serve` starts them{by})")
        out.print("  " + _escape(_argv(PV.shown(r.run))), soft_wrap=True)
        if r.vip_create:
            out.print(f"[bold]keepalived[/] on {_escape(r.host)} (the floating address)")
            out.print("  " + _escape(_argv(r.vip_create)), soft_wrap=True)
    out.print("[bold]keeper[/] on every host (restarts serve/router containers stopped outside bootstrap"
              + (f"; puts a member's standby, {_escape(standby)}, in place of a killed serve container)"
                 if standby else ")"))
    out.print("  " + _escape(_argv(keeper_argv)), soft_wrap=True)


# -- up ------------------------------------------------------------------------------------------
def up_replica(k: int, hosts) -> None:
    err.print(_escape(f"replica {k}: {', '.join(h.name for h in hosts)}"))


def up_approve(path: str, yes: bool, as_json: bool):
    """up's approve(inv, actions): a line per running container it would stop and recreate, then
    [y/N] (one question at a time: a fleet's groups go up at once); --yes or no terminal: as confirm."""
    from bootstrap.cli.params import confirm
    asking = threading.Lock()

    def approve(inv, actions) -> None:
        with asking:
            if not as_json:
                for a in actions:
                    err.print(_escape(f"recreate: {a.host} ({a.reason}): its running container is stopped"))
            n = len(actions)
            confirm(f"up stops and recreates {n} running container{'s' if n != 1 else ''} of the cluster "
                    f"{inv.cluster.name!r} ({', '.join(a.host for a in actions)}; head {inv.head.name}); "
                    f"inventory {path}", yes)
    return approve


def left_out(skipped: dict) -> None:
    for host, why in skipped.items():
        err.print(f"[yellow]warning:[/] {_escape(host)} left out (--allow-partial): {_escape(why)}")


def up(inv, res, label: str, total: float, started_at: float, as_json: bool) -> None:
    """`up`'s result: each host's action and Ray state, where the image came from, the summary line."""
    alive = {n.ip: n for n in (res.ray.nodes if res.ray else ()) if n.alive}
    if as_json:
        _json(D.up_doc(inv, res, total, started_at))
        return
    ray = res.runtime != "none"
    t = Table(title=f"cluster {_escape(inv.cluster.name)}{label}")
    for col in ("host", "ip", "role", "action", *(("ray", "GPUs") if ray else ())):
        t.add_column(col)
    for a in res.actions:
        ip = inv.host(a.host).ip
        n = alive.get(ip)
        cells = ["[green]alive[/]" if n else "[red]missing[/]", f"{n.gpus:g}" if n else "-"] if ray else []
        t.add_row(_escape(a.host), _escape(ip), _escape(a.spec.role), _escape(f"{a.action} ({a.reason})"), *cells)
    out.print(t)
    if res.runtime_why and not res.runtime_why.startswith("cluster.runtime:"):
        out.print(_escape(f"runtime: {res.runtime or face.RUNTIME_UNDECIDED}: {res.runtime_why}"))
    if res.image_from:
        by_src: dict[str, list[str]] = {}
        for host, src in res.image_from.items():
            by_src.setdefault(src, []).append(host)
        out.print(_escape("image: " + "; ".join(
            f"{', '.join(hs)} from {'the registry' if src == 'registry' else src}" for src, hs in by_src.items())))
    verb = "ready" if res.changed else "already up: nothing changed"
    gpus = sum(n.gpus for n in alive.values())
    part = f" ({len(res.skipped)} host(s) left out: {', '.join(res.skipped)})" if res.skipped else ""
    if not ray:
        out.print(_escape(f"cluster {verb}: {len(res.actions)} node container(s) running, no Ray (`serve` runs "
                          f"vLLM's native multi-node mode), head {inv.head.ip}{part}; took {total:.1f}s"))
        return
    out.print(_escape(f"Ray cluster {verb}: {len(alive)} node(s), {gpus:g} GPU(s), head {inv.head.ip}:"
                      f"{inv.cluster.ports.ray_gcs}{part}; took {total:.1f}s"))


# -- exec ----------------------------------------------------------------------------------------
def exec_echo(width: int, as_json: bool):
    """exec's on_result: each host's output as it finishes, every line prefixed with the host."""
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
    return emit


def exec_results(res, as_json: bool) -> None:
    """exec's summary: each host's exit code and seconds; then a line naming the failures, if any."""
    if as_json:
        _json(face.ExecResult(res).to_doc())
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


# -- down ----------------------------------------------------------------------------------------
def down_result(groups, as_json: bool, fleet=None) -> None:
    """down's result: per replica group (one without replicas) the hosts whose container was removed
    and those that had none; with replicas first the fleet's own containers removed per host."""
    if as_json:
        _json(D.down_doc(groups, fleet))
        return
    if fleet is not None:
        out.print(_escape(f"removed the serve containers, the router and the keepers of {len(groups)} replicas"))
    for g in groups:
        down(g)


def down(res) -> None:
    if res.removed:
        out.print(_escape(f"removed the container on {len(res.removed)} host(s): {', '.join(res.removed)}"))
    if res.absent:
        out.print(_escape(f"nothing to remove on {len(res.absent)} host(s): {', '.join(res.absent)}"))


def sudoers(text: str) -> None:
    """`sudoers`: the snippet as it is (a file to install: no markup, no wrapping)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def plan_result(res, as_json: bool) -> None:
    """`plan` (face.PlanResult, or with replicas face.FleetPlanResult) and `up --dry-run`'s plan."""
    if isinstance(res, face.FleetPlanResult):
        fleet_plan(res.replicas, res.routers, res.router_url, res.keeper_argv, as_json, standby=res.standby,
                   models=res.models, idle=res.idle)
    else:
        plan_rows(res.actions, as_json, live=res.live, runtime=res.runtime, why=res.why)
