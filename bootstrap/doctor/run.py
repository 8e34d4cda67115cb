"""Checks on a running cluster: `check-nccl`, `doctor` and `logs`.

This is the I/O side; the knowledge lives in pure modules: `bootstrap.nccl` (the check's output
and NCCL's transport lines), `bootstrap.diagnose` (failure signatures and cross-node rules), and
`checks/nccl_check.py` (what runs inside the containers).
"""
from __future__ import annotations

import random
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from bootstrap.doctor import signatures as D
from bootstrap.cluster import facts as F
from bootstrap.nccl import parse as N
from bootstrap.cluster.run import PYTHON, Reporter, Session, check_script, exec_python_argv
from bootstrap.errors import BootstrapError, CommandFailed, HostUnreachable, PreflightFailed
from bootstrap.remote.fanout import DEFAULT_PARALLEL, fan_out
from bootstrap.model import Host, Inventory

CHECK_PATH = "/tmp/bootstrap_nccl_check.py"
CHECK_TAG = "bootstrap_nccl_check"
IP_ADDR = ("ip", "-o", "addr", "show")
# The interpreter that runs `ray` in the image (its shebang) runs torch.distributed.run.
_TORCHRUN = PYTHON + '; exec $PY -m torch.distributed.run "$@"'
# Kill whatever the check left in a container, with nothing but sh and /proc.
_KILL_CHECK = (f'for p in /proc/[0-9]*; do [ "${{p#/proc/}}" = "$$" ] && continue; '
               f'case "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" in '
               f'*{CHECK_TAG}*) kill -9 "${{p#/proc/}}" 2>/dev/null;; esac; done; rm -f {CHECK_PATH}')


# -- per-node network facts ----------------------------------------------------------------------
@dataclass(frozen=True)
class NodeNet:
    host: str
    ip: str
    container: str  # running / exited / absent
    vllm_host_ip: str | None
    ray_node_ip: str | None  # the --node-ip-address the node's `ray start` was given
    interfaces: tuple[D.Interface, ...]
    socket_env: tuple[tuple[str, str], ...]


def parse_container_env_args(inspect_json: str) -> tuple[dict[str, str], tuple[str, ...]]:
    import json

    try:
        d = json.loads(inspect_json)[0]
    except (ValueError, IndexError, KeyError):
        return {}, ()
    env = dict(e.split("=", 1) for e in (d.get("Config") or {}).get("Env") or [] if "=" in e)
    return env, tuple(d.get("Args") or ())


def ray_ip_from_args(args: Sequence[str]) -> str | None:
    for a in args:
        if a.startswith("--node-ip-address="):
            return a.split("=", 1)[1]
    return None


def node_net(sess: Session, h: Host) -> NodeNet:
    s = sess.ssh[h.name]
    name = sess.inv.cluster.container_name
    ci = s.run(F.container_inspect_cmd(name), timeout=30, check=False)
    st = F.parse_container_inspect(ci.stdout) if ci.ok else None
    env, args = parse_container_env_args(ci.stdout) if ci.ok else ({}, ())
    ifs = s.run(IP_ADDR, timeout=30, check=False)
    socket_env = tuple(sorted((k, v) for k, v in (env or dict(h.env)).items() if k.endswith("_SOCKET_IFNAME")))
    return NodeNet(h.name, h.ip, st.status if st else "absent", env.get("VLLM_HOST_IP"),
                   ray_ip_from_args(args), D.parse_ip_addr(ifs.stdout) if ifs.ok else (), socket_env)


def network_findings(nets: Sequence[NodeNet]) -> list[D.Finding]:
    reports = [D.HostReport(host=n.host, ip=n.ip, vllm_host_ip=n.vllm_host_ip, ray_node_ip=n.ray_node_ip,
                            interfaces=n.interfaces, socket_env=n.socket_env) for n in nets]
    return D.check_cluster(reports)


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
    return ("docker", "exec", "-e", "NCCL_DEBUG=INFO", "-e", f"BOOTSTRAP_TAG={CHECK_TAG}", c.container_name,
            "sh", "-c", _TORCHRUN, "sh", *args)


def check_nccl(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
               deadline: float = 180.0, sizes: str | None = None, iters: int = 10,
               backend: str = "auto") -> NcclRun:
    """Run the all-reduce check on every node at once; every phase has a deadline."""
    t0 = time.monotonic()
    name = inv.cluster.container_name
    order = [inv.head, *inv.workers]
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        nets = sess.stage("network", order, lambda h: node_net(sess, h))
        not_running = [n.host for n in nets.values() if n.container != "running"]
        if not_running:
            raise PreflightFailed(", ".join(not_running), "the cluster container is not running",
                                  "run `bootstrap up` first")
        findings = network_findings([nets[h.name] for h in order])
        # Data plane first: every worker must reach the head. A node cut off is named at once
        # instead of after a rendezvous timeout that every node reports alike.
        cut = workers_cut_off(sess, inv.cluster.ports.ray_gcs)
        if cut:
            nodes = [NcclNode(h.name, h.ip, i, 0, None, h.name not in cut, cut.get(h.name, ""))
                     for i, h in enumerate(order)]
            verdict = f"FAIL on {', '.join(cut)}: " + nodes[[h.name for h in order].index(next(iter(cut)))].error
            return NcclRun(False, verdict, None, None, nodes, [], None, findings, (), time.monotonic() - t0)
        # Per-phase deadline inside the check; the whole run gets the overall deadline.
        phase_timeout = max(10.0, min(60.0, deadline / 3))
        port = 29600 + random.randrange(300)
        sess.stage("copy-check", order, lambda h: sess.ssh[h.name].run_with_input(
            ("docker", "exec", "-i", name, "sh", "-c", f"cat > {CHECK_PATH}"), [check_script("nccl_check.py")]))
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
            fan_out(order, lambda h: sess.ssh[h.name].run(("docker", "exec", name, "sh", "-c", _KILL_CHECK),
                                                          timeout=30, check=False),
                    key=lambda h: h.name, parallel=parallel)
        report = N.parse_events("\n".join(outputs.get(h.name, "") for h in order))
        transport = N.parse_nccl_transport("\n".join(outputs.values())) if report.result and \
            report.result.backend == "nccl" else None
        nodes = []
        expected = list(range(len(order)))
        missing_done = set(N.nodes_missing_phase(report, "done", expected, ranks_per_node=inv.gpus_per_node or 1))
        timed_out = tuple(h.name for h in order if codes.get(h.name) == -1)
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
            if isinstance(code, BaseException):
                err = str(code)
            elif h.name in timed_out and not err:
                err = f"no answer within {deadline:g}s"
            elif i in missing_done and not err:
                err = "did not reach the end of the check" + (f" ({report.errors[0]})" if report.errors else "")
            nodes.append(NcclNode(h.name, h.ip, i, len(ranks), last, i not in missing_done and not errs, err))
        warnings = []
        if transport is not None:
            w = N.fallback_to_socket(transport, inv.cluster.infiniband)
            if w:
                warnings.append(w)
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


def workers_cut_off(sess, port: int, *, timeout: float = 3.0) -> dict[str, str]:
    """Workers whose container cannot open a TCP connection to the head's data-plane IP:PORT
    (checks/reach.py inside each worker container), with the reason; {} when all can."""
    inv = sess.inv
    name = inv.cluster.container_name
    reach = sess.stage("reach-head", inv.workers, lambda h: sess.ssh[h.name].run_with_input(
        exec_python_argv(name, [inv.head.ip, str(port), f"{timeout:g}"]), [check_script("reach.py")],
        timeout=30 + timeout, check=False), strict=False)
    return {n: _reach_error(r, inv.head.ip, port) for n, r in reach.items()
            if isinstance(r, BaseException) or not r.ok}


def _reach_error(r, head_ip: str, port: int) -> str:
    import json

    if isinstance(r, BaseException):
        return str(r)
    if "is not running" in r.stderr:
        return (f"its container has stopped, so the check could not run there (a Ray worker exits when it "
                f"loses the head: likely cut off from {head_ip}:{port}; `bootstrap logs` shows why)")
    try:
        detail = json.loads(r.stdout.strip().splitlines()[-1]).get("error")
    except (ValueError, IndexError):
        detail = (r.stderr or r.stdout).strip()[-200:]
    return f"cannot reach the head {head_ip}:{port} from this node over the data network ({detail})"


# -- doctor --------------------------------------------------------------------------------------
DOCKER_ROOT = ("docker", "info", "--format", "{{.DockerRootDir}}")


def parse_df_avail(out: str) -> int | None:
    lines = out.strip().splitlines()
    if len(lines) < 2:
        return None
    parts = lines[-1].split()
    return int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else None


@dataclass
class DoctorReport:
    findings: list[D.Finding]
    hosts_checked: int

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)


def doctor(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
           log_lines: int = 2000, clock: Callable[[], float] = time.time) -> DoctorReport:
    """Preflight, cluster and log checks, mapped to causes and fixes."""
    findings: list[D.Finding] = []
    name = inv.cluster.container_name
    order = [inv.head, *inv.workers]
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)
        up = [h for h in order if not isinstance(conn.get(h.name), BaseException)]
        for h in order:
            exc = conn.get(h.name)
            if isinstance(exc, BaseException):
                findings.append(D.Finding("host-unreachable", "error", h.name, "cannot connect over SSH",
                                          D.mask_secrets(str(exc))[:300],
                                          getattr(exc, "hint", "") or "check that the host is up and sshd listens"))

        def gather(h: Host):
            s = sess.ssh[h.name]
            try:
                f = F.gather(s, container=name, image=inv.cluster.image,
                             want_gpus=inv.cluster.accelerator == "gpu")
            except PreflightFailed as exc:
                findings.append(D.Finding("preflight", "error", h.name, exc.reason, exc.reason[:300], exc.hint))
                f = None
            before = clock()
            remote = s.run(("date", "+%s.%N"), timeout=20, check=False).stdout.strip()
            after = clock()
            try:
                skew_clock = float(remote) - (after - before) / 2 + (clock() - after)
            except ValueError:
                skew_clock = None
            root = s.run(DOCKER_ROOT, timeout=20, check=False).stdout.strip() or "/var/lib/docker"
            df = s.run(("df", "-P", "-B1", root), timeout=20, check=False)
            net = node_net(sess, h)
            logs = s.run(("docker", "logs", "--tail", str(log_lines), name), timeout=60, check=False)
            if f is not None and f.image_id and net.container != "running" and inv.cluster.runtime == "ray":
                r = s.run(F.ray_in_image_cmd(inv.cluster.image), timeout=120, check=False)
                if not r.ok:
                    findings.append(D.Finding(
                        "ray-missing", "error", h.name, D.signature("ray-missing").title,
                        f"{inv.cluster.image}: `command -v ray` found nothing",
                        D.signature("ray-missing").fix))
            return f, skew_clock, parse_df_avail(df.stdout) if df.ok else None, net, logs

        got = sess.stage("doctor", up, gather, strict=False)
        reports, texts = [], {}
        image_size = None
        for h in order:
            g = got.get(h.name)
            if g is None or isinstance(g, BaseException):
                if isinstance(g, BaseException):
                    findings.append(D.Finding("doctor-failed", "warning", h.name, "could not gather facts",
                                              D.mask_secrets(str(g))[:300], "run again; see the error"))
                continue
            f, clk, free, net, logs = g
            gpus = f.gpus if f else None
            reports.append(D.HostReport(
                host=h.name, gpu_count=len(gpus) if gpus is not None else None,
                gpu_names=tuple(x.name for x in gpus or ()),
                driver_version=gpus[0].driver if gpus else None, clock_epoch=clk, disk_free_bytes=free,
                ip=h.ip, vllm_host_ip=net.vllm_host_ip, ray_node_ip=net.ray_node_ip,
                interfaces=net.interfaces, socket_env=net.socket_env))
            if net.container == "absent":
                findings.append(D.Finding("container-absent", "error", h.name,
                                          "the cluster container does not exist on this host",
                                          f"docker container inspect {name}: no such container",
                                          "run `bootstrap up`"))
            elif net.container != "running":
                findings.append(D.Finding("container-not-running", "error", h.name,
                                          f"the cluster container is {net.container}",
                                          f"container {name}: {net.container}",
                                          "read `bootstrap logs " + h.name + "`; then `bootstrap up` restarts it"))
            texts[h.name] = logs.stdout + logs.stderr
            if image_size is None and f and f.image_id:
                sz = sess.ssh[h.name].run(("docker", "image", "inspect", "--format", "{{.Size}}", inv.cluster.image),
                                          timeout=20, check=False).stdout.strip()
                image_size = int(sz) if sz.isdigit() else None
        findings += D.check_cluster(reports, image_size_bytes=image_size)
        findings += D.scan_logs(texts, infiniband=inv.cluster.infiniband)
        # Ray's own view: every inventory IP alive?
        head_ok = any(r.host == inv.head.name for r in reports) and \
            not any(x.id.startswith("container-") and x.host == inv.head.name for x in findings)
        if head_ok and inv.cluster.runtime == "ray":
            view = sess.ray_view(inv.hosts, deadline=0)
            by_ip = {h.ip: h.name for h in inv.hosts}
            for ip in view.missing:
                findings.append(D.Finding(
                    "ray-node-missing", "error", by_ip.get(ip), "Ray does not list this node as alive",
                    f"ray nodes alive: {', '.join(sorted(n.ip for n in view.nodes if n.alive)) or 'none'}",
                    "vLLM will wait for a placement group it cannot get: run `bootstrap up` to restart the node"))
    return DoctorReport(D.sort_findings(_dedupe(findings)), len(up))


def _dedupe(findings: Sequence[D.Finding]) -> list[D.Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.id, f.host) not in seen:
            seen.add((f.id, f.host))
            out.append(f)
    return out


# -- logs ----------------------------------------------------------------------------------------
def logs(inv: Inventory, emit: Callable[[str, str], None], *, hosts: Sequence[str] = (), tail: int = 200,
         follow: bool = False, parallel: int = DEFAULT_PARALLEL, stop: threading.Event | None = None) -> dict:
    """Stream each node's container log, line by line, to emit(host, line)."""
    chosen = [inv.host(n) for n in hosts] if hosts else list(inv.hosts)
    name = inv.cluster.container_name
    argv = ["docker", "logs", "--tail", str(tail), *(["--follow"] if follow else []), name]
    with Session(inv, parallel=parallel) as sess:
        sess.connect(chosen)

        def one(h: Host) -> int:
            return sess.ssh[h.name].stream_lines(argv, lambda line: emit(h.name, line), stop=stop)

        return fan_out(chosen, one, key=lambda h: h.name, parallel=max(parallel, len(chosen)))
