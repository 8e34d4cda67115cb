"""`doctor` and `logs` over SSH: gather facts, clocks, disk, the network and log tails from every node,
then map them to causes and fixes with the pure signatures package and rules.py."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from bootstrap import signatures as D
from bootstrap.cluster import facts as F
from bootstrap.cluster import probe
from bootstrap.cluster import ray as R
from bootstrap.cluster import runtime as RT
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import run as PR
from bootstrap.cluster.preflight.registry import Seen, by_host, judge
from bootstrap.doctor import logsources as LS
from bootstrap.errors import PreflightFailed
from bootstrap.fleet import plan as FP
from bootstrap.model import Host, Inventory
from bootstrap.nccl import network as NET
from bootstrap.remote import docker as DK
from bootstrap.remote.fanout import DEFAULT_PARALLEL, fan_out
from bootstrap.remote.session import Reporter, Session
from bootstrap.signatures import rules as DR


# -- doctor --------------------------------------------------------------------------------------
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
    order = [inv.head, *inv.workers]
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)
        unreachable = conn.failed
        up = [h for h in order if h.name not in unreachable]
        for h in order:
            exc = unreachable.get(h.name)
            if exc is not None:
                findings.append(D.Finding("host-unreachable", "error", h.name, "cannot connect over SSH",
                                          D.mask_secrets(str(exc))[:300],
                                          getattr(exc, "hint", "") or "check that the host is up and sshd listens"))
        got = sess.stage("doctor", up, lambda h: _look(sess, inv, h, findings, log_lines, clock), strict=False)
        reports, texts = _reports(sess, inv, order, got, findings)
        sizes = (DK.image_size(sess.ssh[n], inv.cluster.image) for n in _image_holders(order, got))
        image_size = next((x for x in sizes if x is not None), None)  # the first host that tells
        findings += D.check_cluster(reports, image_size_bytes=image_size)
        facts = {n: g[0] for n, g in got.succeeded.items() if g and g[0]}
        findings += _rack_findings(inv, facts, order)
        # the path between the nodes: what `up`'s mtu-path check sends, on the running cluster
        findings += [D.Finding(f"rack-{x.check}", "error", x.host, CK.CHECKS[x.check], x.what, x.fix)
                     for x in PR.path_mtu(sess, [h for h in order if h.name in facts], facts)]
        findings += D.scan_sources(texts, infiniband=inv.cluster.infiniband)
        # runtime unset: what the containers were started with
        inv = RT.from_containers(inv, {n: g[0].container for n, g in got.succeeded.items() if g and g[0]})
        if inv.cluster.runtime == "ray":  # Ray's own view: every IP of each group alive (a Ray cluster per replica)
            findings += _ray_findings(sess, inv, reports, findings)
    return DoctorReport(D.sort_findings(_dedupe(findings)), len(up))


def _look(sess: Session, inv: Inventory, h: Host, findings: list[D.Finding], log_lines: int,
          clock: Callable[[], float]):
    """One host's facts, clock, free disk, network and log tails (what doctor reads there); the
    findings of reading them go to findings."""
    name = inv.cluster.container_name
    s = sess.ssh[h.name]
    try:
        f = probe.gather(s, container=name, image=inv.cluster.image, want_gpus=inv.cluster.accelerator == "gpu")
    except PreflightFailed as exc:
        findings.append(D.Finding("preflight", "error", h.name, exc.reason, exc.reason[:300], exc.hint))
        f = None
    if f is not None and f.gpus and f.image_id and inv.cluster.accelerator == "gpu" and inv.gpus_per_node:
        try:  # what `up` probes before it starts anything: CUDA initialising with the node's GPUs in the image
            probe.cuda_init(sess, h, f)
        except PreflightFailed as exc:
            findings.append(D.Finding("cuda-unusable", "error", h.name, exc.reason.split(" (", 1)[0], exc.reason[:300],
                                      exc.hint))
    before = clock()
    # not checked: doctor gathers what it can; a look that fails yields no finding of its own
    # (no clock, no free space), and the failure behind it is a finding already (preflight)
    remote = s.run(("date", "+%s.%N"), timeout=20, check=False).stdout.strip()
    after = clock()
    try:
        skew_clock = float(remote) - (after - before) / 2 + (clock() - after)
    except ValueError:
        skew_clock = None
    root = DK.root_dir(s)
    df = s.run(("df", "-P", "-B1", root), timeout=20, check=False)
    net = NET.node_net(sess, h)
    # vLLM's, the keeper's, the router's, Prometheus' logs where Docker answered the facts
    logs = {"node": DK.logs(s, name, log_lines), **(_service_logs(sess, h, log_lines) if f else {})}
    if f is not None and f.image_id and net.container != "running" and inv.cluster.runtime == "ray":
        r = s.run(F.ray_in_image_cmd(inv.cluster.image), timeout=120, check=False)
        if r.exit_code == F.NO_RAY_EXIT:
            findings.append(D.Finding(
                "ray-missing", "error", h.name, D.signature("ray-missing").title,
                f"{inv.cluster.image}: `command -v ray` found nothing",
                D.signature("ray-missing").fix))
    return f, skew_clock, DR.parse_df_avail(df.stdout) if df.ok else None, net, logs


def _reports(sess: Session, inv: Inventory, order: Sequence[Host], got,
             findings: list[D.Finding]) -> tuple[list[D.HostReport], dict[tuple[str, str], str]]:
    """What each host's look found, for check_cluster, and the log texts by (host, source); the
    findings on the hosts themselves (the look failed, the container is absent or stopped) go to
    findings."""
    name = inv.cluster.container_name
    failed = got.failed
    reports, texts = [], {}
    for h in order:
        g = got.get(h.name)
        if h.name in failed:
            findings.append(D.Finding("doctor-failed", "warning", h.name, "could not gather facts",
                                      D.mask_secrets(str(g))[:300], "run again; see the error"))
            continue
        if g is None:
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
        texts.update({(h.name, src): text for src, text in logs.items()})
    return reports, texts


def _image_holders(order: Sequence[Host], got) -> list[str]:
    """The hosts whose look found the cluster image, in order (the first tells its size)."""
    return [h.name for h in order if h.name not in got.failed and (g := got.get(h.name)) is not None
            and g[0] and g[0].image_id]


def _ray_findings(sess: Session, inv: Inventory, reports: Sequence[D.HostReport],
                  findings: Sequence[D.Finding]) -> list[D.Finding]:
    """A finding per node Ray does not list alive, in each Ray cluster whose head was looked at and
    has its container (a head without one is a finding already)."""
    out = []
    by_ip = {h.ip: h.name for h in inv.hosts}
    for group in _groups(inv):
        head = group.head.name
        if not any(r.host == head for r in reports) or \
                any(x.id.startswith("container-") and x.host == head for x in findings):
            continue
        view = R.ray_view(sess.narrowed(group), group.hosts, deadline=0)
        for ip in view.missing:
            out.append(D.Finding(
                "ray-node-missing", "error", by_ip.get(ip), "Ray does not list this node as alive",
                f"ray nodes alive on {head}'s Ray cluster: "
                f"{', '.join(sorted(n.ip for n in view.nodes if n.alive)) or 'none'}",
                "vLLM will wait for a placement group it cannot get: run `bootstrap up` to restart the node"))
    return out


#: The node checks doctor leaves to check_cluster, which reports the same (drivers, clocks, *_SOCKET_IFNAME).
_RACK_IN_CHECK_CLUSTER = frozenset({"gpu-driver", "clock", "socket-ifname"})


def _rack_findings(inv: Inventory, facts: dict[str, F.HostFacts], order: Sequence[Host]) -> list[D.Finding]:
    """`up`'s node checks (the preflight registry's checks that read "rack") on demand: each finding
    an error, `rack-<check>`."""
    seen = Seen.of(inv, order, facts)
    found = by_host(judge(seen, CK.reading("rack"), _RACK_IN_CHECK_CLUSTER), [n.host for n in seen.nodes])
    return [D.Finding(f"rack-{x.check}", "error", x.host, CK.CHECKS[x.check], x.what, x.fix) for x in found]


def _groups(inv: Inventory) -> list[Inventory]:
    """The Ray clusters of the inventory: itself, or each replica group as an inventory of its own."""
    return [inv] if inv.cluster.replicas == 1 else [FP.replica_inventory(inv, k) for k in range(inv.cluster.replicas)]


def _service_logs(sess: Session, h: Host, lines: int) -> dict[str, str]:
    """The last LINES of each log beside the node container's that this host holds (vLLM's output,
    the keeper, the router, Prometheus: doctor/logsources.py), by source."""
    found, _ = _held(sess, h, [c for c in LS.candidates(sess.inv, [h.name]) if c.source != "node"])
    out = {}
    for c in found:  # not checked: a log that cannot be read shows why in its place (DK.logs does the same)
        r = sess.ssh[h.name].run(read_argv(c, lines), timeout=60, check=False)
        out[c.label] = r.stdout + r.stderr  # a pool's vLLM: vllm[MODEL], so a finding names the model
    return out


def _dedupe(findings: Sequence[D.Finding]) -> list[D.Finding]:
    seen, out = set(), []
    for f in findings:
        if (f.id, f.host) not in seen:
            seen.add((f.id, f.host))
            out.append(f)
    return out


# -- logs ----------------------------------------------------------------------------------------
@dataclass
class LogsResult:
    #: the logs that were read, in order
    read: list[LS.LogSource]
    #: the selected places that hold no log (no such container, no serve log file): not an error
    absent: list[LS.LogSource]
    #: the logs whose reading failed: LogSource.describe() -> why (the command's exit, the exception)
    failed: dict[str, str]


def _held(sess: Session, h: Host, cands: Sequence[LS.LogSource]) -> tuple[list[LS.LogSource], list[LS.LogSource]]:
    """(the candidates on host h that it holds, the others): its container names, and each serve log
    file in the cluster container where that container exists."""
    s = sess.ssh[h.name]
    mine = [c for c in cands if c.host == h.name]
    names = DK.names(s)
    files = [c.path for c in mine if c.path and c.container in names and DK.has_file(s, c.container, c.path)]
    return LS.present(mine, {h.name: names}, {h.name: files})


def find_sources(sess: Session, cands: Sequence[LS.LogSource]) -> tuple[list[LS.LogSource], list[LS.LogSource]]:
    """(the candidates their hosts hold, the others), every host at once, in the candidates' order."""
    hosts = [sess.inv.host(n) for n in dict.fromkeys(s.host for s in cands)]
    got = sess.stage("find-logs", hosts, lambda h: _held(sess, h, cands))
    held = {id(c) for found, _ in got.values() for c in found}
    return [c for c in cands if id(c) in held], [c for c in cands if id(c) not in held]


def read_argv(src: LS.LogSource, tail: int, *, follow: bool = False, since: float | None = None) -> tuple[str, ...]:
    """The command that prints a source's log on its host (docker logs, or tail of the file in the
    container; a file's lines are filtered for --since by the caller: LS.SinceFilter)."""
    if src.path is None:
        return DK.logs_argv(src.container, tail, follow=follow, since=since)
    return DK.file_log_argv(src.container, src.path, tail, follow=follow)


def logs(inv: Inventory, emit: Callable[[LS.LogSource, str], None], *, hosts: Sequence[str] = (),
         sources: Sequence[str] = LS.SOURCES, tail: int = 200, since: float | None = None, follow: bool = False,
         parallel: int = DEFAULT_PARALLEL, stop: threading.Event | None = None,
         reporter: Reporter | None = None) -> LogsResult:
    """Stream the selected logs of the selected hosts (doctor/logsources.py: the node containers,
    vLLM's output, the keepers, the router, Prometheus), line by line, to emit(source, line); all
    at once, each line as it arrives. Returns what was read and what was not there."""
    cands = LS.candidates(inv, hosts, sources)
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect(list(dict.fromkeys(inv.host(s.host) for s in cands)))
        found, absent = find_sources(sess, cands)

        def one(src: LS.LogSource) -> int:
            keep = LS.SinceFilter(since) if since is not None and src.path else None

            def line(text: str) -> None:
                if keep is None or keep(text):
                    emit(src, text)
            return sess.ssh[src.host].stream_lines(read_argv(src, tail, follow=follow, since=since), line, stop=stop)

        res = fan_out(found, one, key=LS.LogSource.describe, parallel=max(parallel, len(found))) if found else {}
    failed = {k: (f"{type(v).__name__}: {v}" if isinstance(v, BaseException) else f"the reading command exited {v}")
              for k, v in res.items() if isinstance(v, BaseException) or v not in (0, -1)}
    return LogsResult(found, absent, failed)
