"""Ray membership, read from inside the head container (checks/ray_nodes.py), and the `ray`-in-image check."""
from __future__ import annotations

import time
from typing import Iterable, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster.plan import RayView, parse_ray_nodes
from bootstrap.errors import CommandFailed, DeadlineExceeded, PreflightFailed
from bootstrap.model import Host
from bootstrap.remote import node as N
from bootstrap.remote.fanout import fan_out
from bootstrap.remote.session import Session
from bootstrap.remote.ssh import SSHHost

#: Seconds a kept head container gets to appear in Ray before it is recreated.
HEAD_GRACE = 30.0


#: Marks the Ray membership poller in the head container (killed when we are interrupted).
RAY_WAIT_TAG = "bootstrap-ray-wait"


def image_has_ray(ssh: SSHHost, image: str, image_id: str | None = None) -> bool:
    """Whether `ray` runs in the image (a throwaway container, no network). The answer is
    remembered on the host per image ID (read back by F.gather) so the next `up` does not ask again;
    a marker we cannot write only means the check runs again next time."""
    r = ssh.run(F.ray_in_image_cmd(image), timeout=120, check=False)
    if r.exit_code not in (0, F.NO_RAY_EXIT):
        # docker run failed (125), the image has no sh (126/127), or its `ray` does not run
        raise CommandFailed(ssh.name, r.command, r.exit_code, (r.stderr + r.stdout)[-2000:],
                            f"could not tell whether the image {image} has Ray")
    ok = r.ok
    if image_id:
        marker = F.ray_ok_marker(image_id) if ok else F.ray_none_marker(image_id)
        # best effort, not checked: a marker we cannot write is only a cache miss (the check runs again)
        ssh.run(F.write_marker_cmd(marker), timeout=30, check=False)
    return ok


def check_ray(ssh: SSHHost, image: str, image_id: str | None = None) -> None:
    """cluster.runtime: ray needs `ray` in the image: refuse (naming both ways out) when it is not."""
    if not image_has_ray(ssh, image, image_id):
        raise PreflightFailed(
            ssh.name, f"`ray` is not in the image {image} (ray: command not found), and cluster.runtime is ray",
            "set cluster.runtime: none (or remove the key: the runtime then follows the image) to run "
            "vLLM's native multi-node mode; or keep Ray with an image that has it, e.g. one built FROM it "
            "with `RUN pip install 'ray[default]'` (recent vllm/vllm-openai images no longer ship Ray)")


def ray_view(sess: Session, expect: Sequence[Host], *, deadline: float, gpus: float = 0.0,
             stale: Iterable[str] = ()) -> RayView:
    head = sess.inv.head
    c = sess.inv.cluster
    args = ["--address", f"{head.ip}:{c.ports.ray_gcs}", "--expect", ",".join(h.ip for h in expect),
            "--gpus", str(gpus), "--deadline", str(deadline), "--tag", RAY_WAIT_TAG]
    if stale:
        args += ["--stale", ",".join(sorted(stale))]
    # read by parse_ray_nodes (its progress lines too), not with the payload's one rule
    r = N.of(sess, head).ask("ray_nodes.py", *args, timeout=deadline + 60).result
    view = parse_ray_nodes(r.stdout)
    if view.head_now is not None:
        sess.head_clock_offset = view.head_now - time.time()
    for ip, t in view.first_seen.items():
        sess.ray_seen[ip] = min(t, sess.ray_seen.get(ip, t))
    if not view.nodes and not view.ready and not view.error:
        view = RayView(False, (), tuple(h.ip for h in expect), (r.stderr or r.stdout).strip()[-300:])
    return view


#: Run on the head host by bash: returns once a TCP connection to $0:$1 (the GCS) opens.
GCS_GATE = 'until (exec 3<>"/dev/tcp/$0/$1") 2>/dev/null; do sleep 0.1; done'


def gcs_wait_argv(ip: str, port: int, deadline: float) -> tuple[str, ...]:
    """The head host waits, at most ``deadline`` seconds, for its GCS to accept connections on
    the data-plane IP (host networking: the container's port is the host's)."""
    return ("timeout", f"{max(1.0, deadline):g}", "bash", "-c", GCS_GATE, ip, str(port))


def wait_for_gcs(sess: Session, *, deadline: float) -> bool:
    """Wait until the head's GCS accepts connections; True when it does. A worker's `ray start
    --address` gives up after about 20 s without a GCS (Ray's NUM_REDIS_GET_RETRIES), so workers
    start once the GCS answers, not once the head is alive in Ray: their start overlaps the rest
    of the head's. False when the head host cannot tell (no bash or no timeout(1) there): the
    caller then waits for the head in Ray. Raises DeadlineExceeded naming the head, with its
    container state and last log line, when the GCS does not answer within ``deadline``."""
    head = sess.inv.head
    port = sess.inv.cluster.ports.ray_gcs

    def gate(h: Host) -> int:
        r = N.of(sess, h).run(gcs_wait_argv(h.ip, port, deadline), timeout=deadline + 30, check=False,
                              hangup=True)
        if r.ok:
            sess.gcs_open = time.time()
        return r.exit_code

    status = sess.stage("head-gcs", [head], gate)[head.name]
    if status == 124:  # timeout(1): the deadline passed
        detail = why_missing(sess, [head])
        raise DeadlineExceeded(f"the head's Ray GCS ({head.ip}:{port}) did not accept connections within "
                               f"{deadline:g}s [{detail}]", (f"{head.name} ({head.ip})",))
    return status == 0


def wait_for_ray(sess: Session, expect: Sequence[Host], *, deadline: float, stage: str,
                 stale: Iterable[str] = ()) -> RayView:
    t0 = sess.clock()
    sess.current_stage = stage
    gpus = float(sess.inv.gpus_per_node)
    view = ray_view(sess, expect, deadline=deadline, gpus=gpus, stale=stale)
    sess.timings.add(stage, sess.clock() - t0)
    if not view.ready:
        by_ip = {h.ip: h.name for h in sess.inv.hosts}
        missing = tuple(f"{by_ip.get(ip, ip)} ({ip})" for ip in view.missing)
        detail = why_missing(sess, [h for h in expect if h.ip in view.missing])
        what = f"Ray did not report every node within {deadline:g}s"
        if view.error:
            what += f": {view.error}"
        if detail:
            what += f" [{detail}]"
        raise DeadlineExceeded(what, missing)
    return view


def why_missing(sess: Session, hosts: Sequence[Host]) -> str:
    """For nodes Ray did not see: their container state and the last log line."""
    name = sess.inv.cluster.container_name

    def one(h: Host) -> str:
        node = N.of(sess, h, name)
        st = node.inspect(timeout=20)
        last = [ln for ln in node.logs(5, timeout=20).splitlines() if ln.strip()][-1:]
        state = st.status if st else "no container"
        return f"{h.name}: container {state}" + (f", last log: {last[0][:200]}" if last else "")

    res = fan_out(hosts, one, key=lambda h: h.name, parallel=sess.parallel)
    return "; ".join(str(v) for v in res.values())
