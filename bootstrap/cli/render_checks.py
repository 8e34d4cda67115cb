"""What the check commands print: check-nccl, check-kv, doctor and logs (text; `--json`: the face's documents).
"""
from __future__ import annotations

import json
import threading

import click
from rich.table import Table

from bootstrap import face
from bootstrap.cli.show import _escape, _json, _mask_doc, err, findings, out
from bootstrap.face import docs as D


# -- check-nccl ----------------------------------------------------------------------------------
def nccl(res, as_json: bool) -> None:
    """check-nccl's result: each node, the bandwidth per message size, the transport, the verdict."""
    if as_json:
        _json(D.nccl_doc(res))
        return
    t = Table(title="nodes")
    for col in ("host", "ip", "node rank", "ranks", "last phase", "result"):
        t.add_column(col)
    for n in res.nodes:
        t.add_row(_escape(n.host), _escape(n.ip), str(n.node_rank), str(n.ranks), _escape(n.last_phase or "-"),
                  "[green]ok[/]" if n.ok else f"[red]FAIL[/] {_escape(n.error[:160])}")
    out.print(t)
    if face.bandwidth_note(res.world_size, res.bandwidth):
        for line in face.format_bandwidth(res.world_size, res.backend, res.bandwidth):
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
    findings(res.findings)
    for w in res.warnings:
        err.print(f"[bold red]{_escape(w)}[/]")
    out.print(("[green]" if res.ok else "[red]") + _escape(res.verdict) + "[/]")


# -- doctor --------------------------------------------------------------------------------------
def doctor(inv, rep, as_json: bool) -> None:
    if as_json:
        _json(D.doctor_doc(rep))
        return
    findings(rep.findings)
    n_err = sum(f.severity == "error" for f in rep.findings)
    out.print(f"{len(rep.findings)} finding(s), {n_err} error(s) on {len(inv.hosts)} host(s)"
              if rep.findings else f"no problems found on {len(inv.hosts)} host(s)")


# -- logs ----------------------------------------------------------------------------------------
def log_echo(width: int, as_json: bool = False, models=()):
    """logs' emit(source, line): the line on stdout after its host and source (a pool's vLLM lines:
    `vllm[MODEL]`; a JSON object per line with --json, with "model" there); safe from many threads."""
    lock = threading.Lock()
    sw = max([len(s) for s in face.SOURCES] + [len(f"vllm[{m}]") for m in models])

    def emit(src, line: str) -> None:
        with lock:
            if as_json:
                doc = {"host": src.host, "source": src.source, **({"model": src.model} if src.model else {}),
                       "line": line}
                click.echo(json.dumps(_mask_doc(doc)))
            else:
                click.echo(_escape(f"{src.host:<{width}} {src.label:<{sw}} | {line}", lines=True, markup=False))
    return emit


def logs_result(res, asked: bool) -> None:
    """After the logs: on stderr, what was asked for and is not there, and what could not be read."""
    if asked:
        for src in res.absent:
            err.print(_escape(f"note: no {src.source} log on {src.host}: "
                              + (f"{src.path} is not in {src.container}" if src.path
                                 else f"no container {src.container}")))
    if not res.read:
        err.print(_escape("error: none of the chosen logs exists on the chosen hosts"
                          + ("" if asked else " (is the cluster up? `bootstrap up`)")))
    for what, why in res.failed.items():
        err.print(_escape(f"error: could not read {what}: {why}"))


def kv_check(results, infiniband: bool, as_json: bool) -> None:
    """check-kv: one line per prefill x decode pair, the warnings, and the verdict."""
    ok = all(r.ok for r in results)
    if as_json:
        _json(D.kv_check_doc(results, infiniband))
        return
    for r in results:
        (out if r.ok else err).print(_escape(f"kv-check: {r.describe()}"))
    for w in (r.warning(infiniband) for r in results):
        if w:
            err.print(f"warning: {_escape(w)}")
    bad = sum(not r.ok for r in results)
    out.print(f"KV transfer check: {'PASS' if ok else 'FAIL'} ({len(results)} pair(s)"
              f"{f', {bad} failed' if bad else ''})")
