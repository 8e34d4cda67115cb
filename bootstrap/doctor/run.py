"""`doctor` and `logs` over SSH: gather facts, clocks, disk, the network and log tails from every node,
then map them to causes and fixes with the pure signatures package and rules.py."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster import ray as R
from bootstrap.cluster import runtime as RT
from bootstrap.doctor import network as NET
from bootstrap.doctor import rules as DR
from bootstrap.doctor import signatures as D
from bootstrap.errors import PreflightFailed
from bootstrap.model import Host, Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote.fanout import DEFAULT_PARALLEL, fan_out
from bootstrap.remote.session import Reporter, Session


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
    name = inv.cluster.container_name
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

        def gather(h: Host):
            s = sess.ssh[h.name]
            try:
                f = F.gather(s, container=name, image=inv.cluster.image,
                             want_gpus=inv.cluster.accelerator == "gpu")
            except PreflightFailed as exc:
                findings.append(D.Finding("preflight", "error", h.name, exc.reason, exc.reason[:300], exc.hint))
                f = None
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
            logs = DK.logs(s, name, log_lines)
            if f is not None and f.image_id and net.container != "running" and inv.cluster.runtime == "ray":
                r = s.run(F.ray_in_image_cmd(inv.cluster.image), timeout=120, check=False)
                if r.exit_code == F.NO_RAY_EXIT:
                    findings.append(D.Finding(
                        "ray-missing", "error", h.name, D.signature("ray-missing").title,
                        f"{inv.cluster.image}: `command -v ray` found nothing",
                        D.signature("ray-missing").fix))
            return f, skew_clock, DR.parse_df_avail(df.stdout) if df.ok else None, net, logs

        got = sess.stage("doctor", up, gather, strict=False)
        failed = got.failed
        reports, texts = [], {}
        image_size = None
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
            texts[h.name] = logs
            if image_size is None and f and f.image_id:
                image_size = DK.image_size(sess.ssh[h.name], inv.cluster.image)
        findings += D.check_cluster(reports, image_size_bytes=image_size)
        findings += D.scan_logs(texts, infiniband=inv.cluster.infiniband)
        # Ray's own view: every inventory IP alive?
        head_ok = any(r.host == inv.head.name for r in reports) and \
            not any(x.id.startswith("container-") and x.host == inv.head.name for x in findings)
        # runtime unset: what the containers were started with
        inv = RT.from_containers(inv, {n: g[0].container for n, g in got.succeeded.items() if g and g[0]})
        if head_ok and inv.cluster.runtime == "ray":
            view = R.ray_view(sess, inv.hosts, deadline=0)
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
    argv = DK.logs_argv(name, tail, follow=follow)
    with Session(inv, parallel=parallel) as sess:
        sess.connect(chosen)

        def one(h: Host) -> int:
            return sess.ssh[h.name].stream_lines(argv, lambda line: emit(h.name, line), stop=stop)

        return fan_out(chosen, one, key=lambda h: h.name, parallel=max(parallel, len(chosen)))
