"""check-nccl over SSH: the all-reduce check (checks/nccl_check.py) on every node at once, every
phase with a deadline. The output is read by the pure parse.py."""
from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping

from bootstrap import signatures as D
from bootstrap.cluster import cuda as CU
from bootstrap.cluster import probe
from bootstrap.errors import CommandFailed, PreflightFailed
from bootstrap.model import Host, Inventory
from bootstrap.nccl import network as NET
from bootstrap.nccl import parse as N
from bootstrap.remote import docker as DK
from bootstrap.remote import node as RN
from bootstrap.remote.fanout import DEFAULT_PARALLEL, GroupResult, fan_out
from bootstrap.remote.session import Reporter, Session, check_script
from bootstrap.signatures import rules as DR

CHECK_PATH = "/tmp/bootstrap_nccl_check.py"


CHECK_TAG = "bootstrap_nccl_check"


# The interpreter that runs `ray` in the image (its shebang) runs torch.distributed.run.
_TORCHRUN = DK.PYTHON + '; exec $PY -m torch.distributed.run "$@"'


# -- check-nccl ----------------------------------------------------------------------------------
@dataclass
class NcclNode:
    host: str
    ip: str
    node_rank: int
    ranks: int = 0
    last_phase: str | None = None
    ok: bool = False
    error: str = ""


@dataclass
class NcclRun:
    ok: bool
    verdict: str
    backend: str | None
    world_size: int | None
    nodes: list[NcclNode]
    bandwidth: list[N.BandwidthRow]
    transport: N.NcclTransport | None
    findings: list[D.Finding]
    timed_out: tuple[str, ...] = ()
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)


def cleanup_warnings(container: str, cleanup: Mapping[str, object]) -> list[str]:
    """A warning per host where killing the check's leftovers failed (pure): a hung rank there may
    still hold the GPUs, which the user must hear of even when the check itself passed. A container
    that is gone or stopped has nothing left running in it."""
    out = []
    for host, r in cleanup.items():
        if isinstance(r, BaseException):
            why = str(r)
        elif getattr(r, "exit_code", 0) != 0 and not DK.not_running_only(r):
            why = (r.stderr or r.stdout).strip()[-200:] or f"exit {r.exit_code}"
        else:
            continue
        out.append(f"{host}: could not stop the check's processes in {container} ({why}): "
                   "a hung rank there may still hold its GPUs")
    return out


def cuda_findings(seen: Mapping[str, dict | None], gpus: int) -> list[D.Finding]:
    """A finding per host whose container's CUDA sees fewer GPUs than nvidia-smi listed (pure; cluster.cuda)."""
    out = []
    for host, doc in seen.items():
        if doc is None:
            out.append(D.Finding("cuda-unusable", "error", host, "the CUDA probe printed nothing in the container",
                                 "no answer from checks/cuda_probe.py", "run `bootstrap doctor`; read the node's log"))
        elif (bad := CU.short(doc, gpus)) is not None:
            out.append(D.Finding("cuda-unusable", "error", host, bad[0], bad[1], bad[2]))
    return out


def torchrun_argv(inv: Inventory, h: Host, node_rank: int, *, port: int, timeout: float,
                  sizes: str | None, iters: int, backend: str) -> tuple[str, ...]:
    c = inv.cluster
    nproc = inv.gpus_per_node or 1
    args = ["--nnodes", str(len(inv.hosts)), "--nproc-per-node", str(nproc), "--node-rank", str(node_rank),
            "--master-addr", inv.head.ip, "--master-port", str(port), "--max-restarts", "0",
            "--rdzv-conf", f"timeout={int(timeout)}",
            CHECK_PATH, "--backend", backend, "--timeout", str(int(timeout)), "--iters", str(iters),
            "--warmup", str(max(1, iters // 4))]
    if sizes:
        args += ["--sizes", sizes]
    # NCCL_DEBUG=INFO makes NCCL say which transport it chose (NET/IB vs NET/Socket).
    return DK.exec_argv(c.container_name, "sh", "-c", _TORCHRUN, "sh", *args,
                        env=(("NCCL_DEBUG", "INFO"), ("BOOTSTRAP_TAG", CHECK_TAG)))


def check_nccl(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
               deadline: float = 180.0, sizes: str | None = None, iters: int = 10,
               backend: str = "auto") -> NcclRun:
    """Run the all-reduce check on every node at once; every phase has a deadline."""
    t0 = time.monotonic()
    order = [inv.head, *inv.workers]
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        nets = sess.stage("network", order, lambda h: NET.node_net(sess, h))
        not_running = [n.host for n in nets.values() if n.container != "running"]
        if not_running:
            raise PreflightFailed(", ".join(not_running), "the cluster container is not running",
                                  "run `bootstrap up` first")
        findings = DR.network_findings([nets[h.name] for h in order])
        early = _cut_off(sess, order, findings, t0) or _cuda_short(sess, order, findings, backend, t0)
        if early is not None:
            return early
        outputs, codes, cleanup = _run_check(sess, order, parallel=parallel, deadline=deadline, sizes=sizes,
                                             iters=iters, backend=backend)
        return _judge(inv, order, outputs, codes, cleanup, findings, deadline, t0)


def _cut_off(sess: Session, order: list[Host], findings: list[D.Finding], t0: float) -> NcclRun | None:
    """Data plane first: every worker must reach the head. A node cut off is named at once
    instead of after a rendezvous timeout that every node reports alike (a failed run; None: all reach it)."""
    cut = probe.workers_cut_off(sess, sess.inv.cluster.ports.ray_gcs)
    if not cut:
        return None
    nodes = [NcclNode(h.name, h.ip, i, 0, None, h.name not in cut, cut.get(h.name, ""))
             for i, h in enumerate(order)]
    verdict = f"FAIL on {', '.join(cut)}: " + nodes[[h.name for h in order].index(next(iter(cut)))].error
    return NcclRun(False, verdict, None, None, nodes, [], None, findings, (), time.monotonic() - t0)


def _cuda_short(sess: Session, order: list[Host], findings: list[D.Finding], backend: str,
                t0: float) -> NcclRun | None:
    """On a GPU cluster, CUDA in each container must see the node's GPUs before NCCL is tried:
    without, `--backend auto` would fall back to gloo and pass on CPU (fake or unusable GPUs).
    A failed run naming the hosts whose CUDA sees too few; None: all see theirs (or no GPUs, or gloo)."""
    inv = sess.inv
    name = inv.cluster.container_name
    gpus = inv.gpus_per_node if inv.cluster.accelerator == "gpu" else 0
    if not gpus or backend == "gloo":
        return None
    seen = sess.stage("cuda", order, lambda h: CU.parse_probe(
        RN.of(sess, h, name).ask("cuda_probe.py", timeout=60).result.stdout))
    short = cuda_findings(seen, gpus)
    if not short:
        return None
    nodes = [NcclNode(h.name, h.ip, i, 0, None, not any(f.host == h.name for f in short),
                      next((f.evidence for f in short if f.host == h.name), ""))
             for i, h in enumerate(order)]
    verdict = f"FAIL on {', '.join(f.host for f in short)}: {short[0].title} ({short[0].evidence})"
    return NcclRun(False, verdict, None, None, nodes, [], None, [*findings, *short], (), time.monotonic() - t0)


def _run_check(sess: Session, order: list[Host], *, parallel: int, deadline: float, sizes: str | None,
               iters: int, backend: str) -> tuple[dict[str, str], GroupResult, dict]:
    """The check itself on every node at once, then its leftovers killed: (each host's output, each
    host's exit status (-1: our deadline passed), the cleanup's results)."""
    inv = sess.inv
    name = inv.cluster.container_name
    # Per-phase deadline inside the check; the whole run gets the overall deadline.
    phase_timeout = max(10.0, min(60.0, deadline / 3))
    port = 29600 + random.randrange(300)
    sess.stage("copy-check", order, lambda h: sess.ssh[h.name].run_with_input(
        DK.exec_argv(name, "sh", "-c", f"cat > {CHECK_PATH}", interactive=True), [check_script("nccl_check.py")]))
    outputs: dict[str, str] = {}
    lock = threading.Lock()

    def run_one(h: Host) -> int:
        rank = order.index(h)
        argv = torchrun_argv(inv, h, rank, port=port, timeout=phase_timeout, sizes=sizes, iters=iters,
                             backend=backend)
        try:
            r = sess.ssh[h.name].run(argv, timeout=deadline, check=False)
            text = r.stdout + "\n" + r.stderr
            code = r.exit_code
        except CommandFailed as exc:  # our deadline passed: the node hung
            text, code = exc.output_tail, -1
        with lock:
            outputs[h.name] = text
        return code

    try:
        codes = sess.stage("check", order, run_one, strict=False)
    finally:
        # kill whatever the check left in the containers (reported below when that fails)
        cleanup = fan_out(order, lambda h: sess.ssh[h.name].run(
            DK.kill_tagged_argv(name, CHECK_TAG, then=f"rm -f {CHECK_PATH}"), timeout=30, check=False),
                key=lambda h: h.name, parallel=parallel)
    return outputs, codes, cleanup


def _node_rows(report: N.CheckReport, order: list[Host], codes: GroupResult, timed_out: tuple[str, ...],
               deadline: float, ranks_per_node: int) -> list[NcclNode]:
    """Each node's row (pure): its ranks, the last phase they reached, and its first error."""
    nodes = []
    expected = list(range(len(order)))
    missing_done = set(N.nodes_missing_phase(report, "done", expected, ranks_per_node=ranks_per_node))
    failed = codes.failed
    for i, h in enumerate(order):
        ranks = report.ranks_on_node(i)
        last = None
        errs = []
        for r in ranks:
            st = report.ranks[r]
            last = st.last_phase if last is None else last
            errs += [f"{e.phase}: {e.error}" for e in st.failed if e.error]
        code = codes.get(h.name)
        err = errs[0] if errs else ""
        if h.name in failed:
            err = str(code)
        elif h.name in timed_out and not err:
            err = f"no answer within {deadline:g}s"
        elif i in missing_done and not err:
            err = "did not reach the end of the check" + (f" ({report.errors[0]})" if report.errors else "")
        nodes.append(NcclNode(h.name, h.ip, i, len(ranks), last, i not in missing_done and not errs, err))
    return nodes


def _judge(inv: Inventory, order: list[Host], outputs: Mapping[str, str], codes: GroupResult,
           cleanup: Mapping[str, object], findings: list[D.Finding], deadline: float, t0: float) -> NcclRun:
    """The run read from the nodes' outputs: per-node rows, the transport NCCL chose, the verdict."""
    name = inv.cluster.container_name
    report = N.parse_events("\n".join(outputs.get(h.name, "") for h in order))
    transport = N.parse_nccl_transport("\n".join(outputs.values())) if report.result and \
        report.result.backend == "nccl" else None
    timed_out = tuple(h.name for h in order if codes.get(h.name) == -1)
    nodes = _node_rows(report, order, codes, timed_out, deadline, inv.gpus_per_node or 1)
    warnings = cleanup_warnings(name, cleanup)
    fell_back = N.fallback_to_socket(transport, inv.cluster.infiniband) if transport is not None else None
    if fell_back:  # a verdict, not a note: the cluster would serve at a fraction of its fabric's bandwidth
        findings = [*findings, D.Finding(
            "nccl-socket-fallback", "error", None, "NCCL went over TCP sockets where the inventory expects RDMA "
            "(infiniband: true)", fell_back.removeprefix("WARNING: "),
            "mend the cause named (the HCAs in the container, NCCL_IB_HCA, NCCL_IB_DISABLE); on AWS EFA the image "
            "needs NCCL's EFA plugin (aws-ofi-nccl with libfabric), which vllm/vllm-openai does not ship; or set "
            "infiniband: false where sockets are what the rack has")]
    ok = report.ok and all(n.ok for n in nodes)
    errors = [f for f in findings if f.severity == "error"]
    if ok and not errors:
        best = max((b.busbw_GBps for b in report.bandwidth), default=0.0)
        note = N.bandwidth_note(report.world_size, report.bandwidth, report.bandwidth_skipped)
        bw = f"bandwidth: {note}" if note else f"peak busbw {best:.3f} GB/s"
        verdict = (f"PASS: all-reduce verified on {report.world_size} rank(s) over {len(order)} node(s) "
                   f"({report.result.backend}); {bw}")
    else:
        # Name the culprits: hosts with an error finding, then nodes that hung, then any failure.
        bad = [f.host for f in errors if f.host] or list(timed_out) or [n.host for n in nodes if not n.ok]
        why = f"{errors[0].title} ({errors[0].evidence})" if errors else \
            next((n.error for n in nodes if n.host in bad and n.error), "") or \
            next((n.error for n in nodes if n.error), "")
        verdict = f"FAIL on {', '.join(dict.fromkeys(b for b in bad if b)) or 'the cluster'}: {why}"
        ok = False
    return NcclRun(ok, verdict, report.result.backend if report.result else None, report.world_size,
                   nodes, report.bandwidth, transport, findings, timed_out, time.monotonic() - t0, warnings)
