"""What the observing commands print: top's frames, the monitor's targets, and the sandbox's progress.
"""
from __future__ import annotations

import time

from rich.table import Table

from bootstrap.cli.show import _escape, _json, _ssh_tunnel, err, out
from bootstrap.face import docs as D


# -- top -----------------------------------------------------------------------------------------
def top(inv, frame, as_json: bool) -> None:
    """One frame of `top` (--once, --json)."""
    if as_json:
        _json(frame.to_dict())
    else:
        out.print(_top_table(inv, frame))


def top_live(inv, look, interval: float) -> None:
    """`top` until Ctrl-C: a frame from look() every `interval` seconds, redrawn in place."""
    from rich.live import Live

    with Live(_top_table(inv, look()), console=out, auto_refresh=False,
              screen=False, transient=False) as live:
        while True:
            t0 = time.monotonic()
            live.update(_top_table(inv, look()), refresh=True)
            time.sleep(max(0.0, interval - (time.monotonic() - t0)))


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
                "queue p50 ms", "prefix hit %", "KV %", "hosts / why down"):
        t.add_column(col, justify="left" if col in ("replica", "hosts / why down") else "right")
    for r in (r for r in frame.rows if r.kind == "replica"):
        style = None if r.up else "red"
        t.add_row(_escape(r.name), f(r.running, "{:.0f}"), f(r.waiting, "{:.0f}"), f(r.req_s, "{:.2f}"),
                  f(r.tok_s), f"{ms(r.ttft_p50)}/{ms(r.ttft_p95)}", f"{ms(r.itl_p50)}/{ms(r.itl_p95)}",
                  ms(r.queue_p50), f(r.prefix_hit, "{:.0f}"), f(r.kv),
                  _escape(", ".join(r.hosts) if r.up else f"DOWN: {r.error}"), style=style)
    n = Table(title_justify="left")
    for col in ("node", "replica", "CPU %", "mem %", "GPU %", "GPU mem %", "why down"):
        n.add_column(col, justify="left" if col in ("node", "why down") else "right")
    idle = {h.name for h in inv.idle}  # a pool's hosts that serve no model
    for r in (r for r in frame.rows if r.kind == "node"):
        replica = ("idle" if r.name in idle else "-") if r.replica is None else str(r.replica)
        n.add_row(_escape(r.name), replica, f(r.cpu), f(r.mem),
                  f(r.gpu_util), f(r.gpu_mem), "" if r.up else _escape(f"DOWN: {r.error}"),
                  style=None if r.up else "red")
    grid = Table.grid()
    grid.add_row(t)
    grid.add_row(n)
    return grid


# -- monitor -------------------------------------------------------------------------------------
def targets(res) -> None:
    """Prometheus' scrape targets, up or down."""
    t = Table(title=f"Prometheus {_escape(res.url)} on {_escape(res.host)}: "
                    f"{len(res.targets) - len(res.down)} of {len(res.targets)} target(s) up")
    for col in ("job", "host", "replica", "url", "health", "error"):
        t.add_column(col)
    for x in res.targets:
        color = "green" if x.health == "up" else "red"
        t.add_row(_escape(x.job), _escape(x.host), x.replica or "-", _escape(x.url), f"[{color}]{x.health}[/]",
                  _escape(x.error[:100]))
    out.print(t)


def monitor_up(inv, res, as_json: bool) -> None:
    """monitor up's result: the targets, where Prometheus is and how to reach it, the warnings."""
    if as_json:
        _json(res.to_dict())
        return
    targets(res)
    when = (f"all up {res.all_up_after:.1f}s after the start" if res.all_up_after is not None
            else f"{len(res.down)} down")
    mh = next(h for h in inv.hosts if h.name == res.host)
    out.print(_escape(f"Prometheus: {res.url} ({when}; took {res.seconds:.1f}s); "
                      f"{_ssh_tunnel(mh, mh.ip, inv.cluster.monitor.port)}"))
    if res.down and not res.down_infrastructure:
        out.print("note: vLLM's targets are up once `bootstrap serve` runs; Prometheus keeps trying")
    for w in res.warnings:
        out.print(f"[yellow]warning:[/] {_escape(w)}")


def monitor_status(res, as_json: bool) -> None:
    if as_json:
        _json(res.to_dict())
    else:
        targets(res)


def monitor_down(removed: dict, purge: bool, as_json: bool) -> None:
    if as_json:
        _json(D.monitor_down_doc(removed, purge))
        return
    out.print(_escape(f"monitoring removed from {len(removed)} host(s)" + (" (data purged)" if purge else "")))


# -- sandbox -------------------------------------------------------------------------------------
def sandbox_log(message: str) -> None:
    err.print(f"[dim]sandbox:[/] {_escape(message)}")


def sandbox_up(info) -> None:
    out.print(_escape(f"sandbox up: {len(info.nodes)} node(s) on {info.subnet}, registry {info.registry}"
                      + (f"; {info.gpu.describe()}" if info.gpu.shaped else "")
                      + (f"; {info.links.describe()}" if info.links.shaped else "")))
    for n in info.nodes:
        if n.odd:
            out.print(_escape(f"{n.name}: {n.host} ({n.docker}" + (", GPUs through CDI)" if info.gpu.gpus else ")")))
    out.print(_escape(f"inventory: {info.inventory}"))
    if info.gpu_inventory:
        out.print(_escape(f"GPU inventory: {info.gpu_inventory} (the same nodes as a GPU cluster; vLLM still "
                          "computes on CPU)"))
    out.print(_escape(f"next: bootstrap up -i {info.inventory}"))


def sandbox_down() -> None:
    out.print("sandbox down")
