"""Apply: the only layer that changes hosts. Connect, gather facts, plan, change, verify.

Every stage fans out over hosts with bounded parallelism; a failure raises one GroupError that
carries every host's result. Nothing is changed on any host before every host has passed
preflight (reachable, Docker answers, GPUs as expected, `ray` in the image).
"""
from __future__ import annotations

import getpass
import json
import os
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster import imagecopy as IC
from bootstrap.errors import (BootstrapError, CommandFailed, DeadlineExceeded, GroupError, HostUnreachable,
                     Interrupted, PreflightFailed)
from bootstrap.remote.fanout import DEFAULT_PARALLEL, fan_out, run_all
from bootstrap.model import Host, Inventory, SSHSettings  # noqa: F401 - Session(settings=)
from bootstrap.cluster import plan as PL
from bootstrap.cluster.plan import HostAction, container_spec, nofile_for, plan_up
from bootstrap.remote.ssh import HeldLock, SSHHost, stream_file


class Reporter(Protocol):
    def event(self, host: str, stage: str, status: str, detail: str = "") -> None: ...


class NullReporter:
    def event(self, host: str, stage: str, status: str, detail: str = "") -> None:
        pass


def check_script(name: str) -> bytes:
    """The source of a check from `checks/` (installed as bootstrap.checks)."""
    try:
        return (resources.files("bootstrap.checks") / name).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return (Path(__file__).resolve().parents[2] / "checks" / name).read_bytes()


# Run a piped script with the interpreter that runs `ray` in the image (its shebang), so a check
# needs nothing but Ray itself; python3 in images without Ray.
PYTHON = ('R=$(command -v ray); if [ -n "$R" ]; then PY=$(head -n1 "$R" | sed "s/^#!//"); '
          'else PY=python3; fi')
_PY_OF_RAY = PYTHON + '; exec $PY - "$@"'


def exec_python_argv(container: str, args: Sequence[str]) -> tuple[str, ...]:
    return ("docker", "exec", "-i", container, "sh", "-c", _PY_OF_RAY, "sh", *args)


@dataclass(frozen=True)
class RayNode:
    ip: str
    alive: bool
    gpus: float
    cpus: float
    node_id: str = ""


@dataclass(frozen=True)
class RayView:
    ready: bool
    nodes: tuple[RayNode, ...]
    missing: tuple[str, ...]
    error: str = ""
    elapsed: float = 0.0
    #: When the poller first saw each node IP alive: time.time() on the head's clock.
    first_seen: Mapping[str, float] = field(default_factory=dict)
    #: The head's time.time() when the poller finished (compare with ours for the clock skew).
    head_now: float | None = None


def parse_ray_nodes(out: str) -> RayView:
    done = None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if obj.get("event") == "done":
                done = obj
    if done is None:
        return RayView(False, (), (), error=(out.strip().splitlines() or ["no output"])[-1])
    nodes = tuple(RayNode(n["ip"], bool(n["alive"]), float(n.get("gpus", 0)), float(n.get("cpus", 0)),
                          str(n.get("node_id") or ""))
                  for n in done.get("nodes", []))
    seen = done.get("first_seen") or {}
    first_seen = {str(ip): float(t) for ip, t in seen.items()} if isinstance(seen, dict) else {}
    now = done.get("now")
    return RayView(bool(done.get("ready")), nodes, tuple(done.get("missing", [])), done.get("error", ""),
                   float(done.get("t", 0.0)), first_seen, float(now) if isinstance(now, (int, float)) else None)


@dataclass(frozen=True)
class HostTiming:
    """Wall-clock times (time.time()) of one host during `up`. run_start/run_end: its `docker run`
    (this machine's clock; None when its container was kept); ray_seen: when the Ray poller first
    saw it alive (the head container's clock: on a real cluster, skewed by head_clock_offset)."""
    run_start: float | None = None
    run_end: float | None = None
    ray_seen: float | None = None

    def as_dict(self) -> dict:
        return {k: (None if v is None else round(v, 3)) for k, v in self.__dict__.items()}


@dataclass
class Timings:
    stages: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds


@dataclass
class UpResult:
    actions: tuple[HostAction, ...]
    ray: RayView | None
    timings: Timings
    changed: bool
    dry_run: bool = False
    #: --allow-partial: hosts left as they were, with the reason.
    skipped: Mapping[str, str] = field(default_factory=dict)
    #: Services a public address would reach (see exposure.py).
    warnings: list[str] = field(default_factory=list)
    #: Per host: when its `docker run` started/ended and Ray first listed it (see HostTiming).
    host_timings: Mapping[str, HostTiming] = field(default_factory=dict)
    #: Hosts that got the image in this run: "registry", "this machine" or the peer that sent it.
    image_from: Mapping[str, str] = field(default_factory=dict)
    #: time.time() when the cluster was known ready (the ray-ready stage ended); None if not waited.
    ready_at: float | None = None
    #: The head's clock minus ours, as seen when the last Ray poll returned (includes the latency
    #: of that return, a few ms on a LAN); None when Ray was not polled.
    head_clock_offset: float | None = None


def lock_path(inv: Inventory) -> str:
    """The cluster lock on the head host (cluster names are [a-z0-9-])."""
    return f"/tmp/bootstrap-{inv.cluster.name}.lock"


#: Seconds a kept head container gets to appear in Ray before it is recreated.
HEAD_GRACE = 30.0
#: Marks the Ray membership poller in the head container (killed when we are interrupted).
RAY_WAIT_TAG = "bootstrap-ray-wait"
#: `sh -c KILL_TAGGED sh TAG`: kill every process whose command line contains TAG (but itself);
#: /proc only, images need not have pkill.
KILL_TAGGED = ('for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
               'case "$(tr "\\0" " " < "$p/cmdline" 2>/dev/null)" in *"$1"*) kill -9 "${p#/proc/}" 2>/dev/null;; esac; '
               'done; exit 0')


class Session:
    """SSH sessions to every host of an inventory, opened once and reused across stages."""

    def __init__(self, inv: Inventory, *, parallel: int = DEFAULT_PARALLEL,
                 reporter: Reporter | None = None, clock: Callable[[], float] = time.monotonic,
                 accept_new_host_keys: bool | None = None, settings: SSHSettings | None = None):
        self.inv = inv
        self.parallel = parallel
        self.reporter = reporter or NullReporter()
        self.clock = clock
        settings = settings or inv.cluster.ssh
        if accept_new_host_keys is not None:
            from dataclasses import replace
            settings = replace(settings, accept_new_host_keys=accept_new_host_keys)
        self.settings = settings
        self.ssh = {h.name: SSHHost(h, settings) for h in inv.hosts}
        self.timings = Timings()
        #: Set on Ctrl-C / SIGTERM: no new per-host work starts.
        self.cancel = threading.Event()
        self.current_stage = ""
        self._lock: HeldLock | None = None
        #: host name -> (start, end) of its `docker run`, time.time() here.
        self.run_times: dict[str, tuple[float, float]] = {}
        #: node IP -> earliest time.time() (head clock) a Ray poll saw it alive.
        self.ray_seen: dict[str, float] = {}
        self.head_clock_offset: float | None = None

    # -- helpers ----------------------------------------------------------------------------
    def stage(self, stage: str, hosts: Iterable[Host], fn: Callable[[Host], object], *,
              strict: bool = True) -> dict:
        hosts = list(hosts)
        t0 = self.clock()
        self.current_stage = stage

        def wrapped(h: Host):
            if self.cancel.is_set():
                raise KeyboardInterrupt
            self.reporter.event(h.name, stage, "start")
            t = self.clock()
            try:
                r = fn(h)
            except BaseException as exc:
                self.reporter.event(h.name, stage, "failed", str(exc))
                raise
            self.reporter.event(h.name, stage, "done", f"{self.clock() - t:.1f}s")
            return r

        try:
            if strict:
                return run_all(stage, hosts, wrapped, key=lambda h: h.name, parallel=self.parallel)
            return fan_out(hosts, wrapped, key=lambda h: h.name, parallel=self.parallel)
        finally:
            self.timings.add(stage, self.clock() - t0)

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        for s in self.ssh.values():
            s.close()

    def lock(self, command: str, *, wait: float = 0.0) -> None:
        """Take the cluster lock on the head host for this session (see SSHHost.acquire_lock)."""
        head = self.inv.head
        holder = (f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} "
                  f"`bootstrap {command}` since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        t0 = self.clock()
        self.current_stage = "lock"
        self.reporter.event(head.name, "lock", "start")
        self._lock = self.ssh[head.name].acquire_lock(
            lock_path(self.inv), holder, wait=wait,
            on_wait=lambda who: self.reporter.event(head.name, "lock", "waiting", f"held by {who}"))
        self.reporter.event(head.name, "lock", "done", f"{self.clock() - t0:.1f}s")
        self.timings.add("lock", self.clock() - t0)

    def exposure_warnings(self, *, vllm_listen: str | None = None) -> list[str]:
        """Services on the head a public address would reach (the dashboard; vLLM when given)."""
        from bootstrap import exposure

        head = self.inv.head
        r = self.ssh[head.name].run(F.addresses_cmd(), timeout=30, check=False)
        found = exposure.warnings(self.inv, {head.name: F.parse_addresses(r.stdout)}, vllm_listen=vllm_listen)
        for w in found:
            self.reporter.event(head.name, "exposure", "warning", w)
        return found

    def host_facts(self, h: Host) -> F.HostFacts:
        c = self.inv.cluster
        return F.gather(self.ssh[h.name], container=c.container_name, image=c.image,
                        want_gpus=c.accelerator == "gpu")

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def connect(self, hosts: Iterable[Host] | None = None, *, strict: bool = True) -> dict:
        return self.stage("connect", hosts or self.inv.hosts, lambda h: self.ssh[h.name].connect(),
                          strict=strict)

    def gather(self, hosts: Iterable[Host] | None = None) -> dict[str, F.HostFacts]:
        return self.stage("facts", hosts or self.inv.hosts, self.host_facts)

    # -- Ray --------------------------------------------------------------------------------
    def ray_view(self, expect: Sequence[Host], *, deadline: float, gpus: float = 0.0,
                 stale: Iterable[str] = ()) -> RayView:
        head = self.inv.head
        c = self.inv.cluster
        args = ["--address", f"{head.ip}:{c.ports.ray_gcs}", "--expect", ",".join(h.ip for h in expect),
                "--gpus", str(gpus), "--deadline", str(deadline), "--tag", RAY_WAIT_TAG]
        if stale:
            args += ["--stale", ",".join(sorted(stale))]
        r = self.ssh[head.name].run_with_input(exec_python_argv(c.container_name, args),
                                               [check_script("ray_nodes.py")],
                                               timeout=deadline + 60, check=False)
        view = parse_ray_nodes(r.stdout)
        if view.head_now is not None:
            self.head_clock_offset = view.head_now - time.time()
        for ip, t in view.first_seen.items():
            self.ray_seen[ip] = min(t, self.ray_seen.get(ip, t))
        if not view.nodes and not view.ready and not view.error:
            view = RayView(False, (), tuple(h.ip for h in expect), (r.stderr or r.stdout).strip()[-300:])
        return view

    def wait_for_ray(self, expect: Sequence[Host], *, deadline: float, stage: str,
                     stale: Iterable[str] = ()) -> RayView:
        t0 = self.clock()
        self.current_stage = stage
        gpus = float(self.inv.gpus_per_node)
        view = self.ray_view(expect, deadline=deadline, gpus=gpus, stale=stale)
        self.timings.add(stage, self.clock() - t0)
        if not view.ready:
            by_ip = {h.ip: h.name for h in self.inv.hosts}
            missing = tuple(f"{by_ip.get(ip, ip)} ({ip})" for ip in view.missing)
            detail = self._why_missing([h for h in expect if h.ip in view.missing])
            what = f"Ray did not report every node within {deadline:g}s"
            if view.error:
                what += f": {view.error}"
            if detail:
                what += f" [{detail}]"
            raise DeadlineExceeded(what, missing)
        return view

    def _why_missing(self, hosts: Sequence[Host]) -> str:
        """For nodes Ray did not see: their container state and the last log line."""
        name = self.inv.cluster.container_name

        def one(h: Host) -> str:
            s = self.ssh[h.name]
            ci = s.run(F.container_inspect_cmd(name), timeout=20, check=False)
            st = F.parse_container_inspect(ci.stdout) if ci.ok else None
            logs = s.run(("docker", "logs", "--tail", "5", name), timeout=20, check=False)
            last = [ln for ln in (logs.stdout + logs.stderr).splitlines() if ln.strip()][-1:]
            state = st.status if st else "no container"
            return f"{h.name}: container {state}" + (f", last log: {last[0][:200]}" if last else "")

        res = fan_out(hosts, one, key=lambda h: h.name, parallel=self.parallel)
        return "; ".join(str(v) for v in res.values())

    # -- changes ----------------------------------------------------------------------------
    def start_container(self, action: HostAction) -> None:
        s = self.ssh[action.host]
        spec = action.spec
        if action.action != "create":  # "create": the facts (read under the lock) found none
            s.run(("docker", "rm", "-f", spec.name), timeout=60, check=False)
        env_file = None
        secrets = {x.name: x for x in self.inv.cluster.secrets}
        try:
            if spec.secret_names:
                body = "".join(f"{n}={secrets[n].reveal()}\n" for n in spec.secret_names)
                env_file = s.put_private_file(body.encode())
            t0 = time.time()
            s.run(spec.run_argv(env_file), timeout=120)
            self.run_times[action.host] = (t0, time.time())
        finally:
            if env_file:
                s.remove_file(env_file)


def local_image_id(image: str) -> str | None:
    r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def up(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
       dry_run: bool = False, load_image: bool | None = None, pull: bool = False,
       wait: float = 180.0, accept_new_host_keys: bool | None = None, allow_partial: bool = False,
       lock_wait: float = 0.0) -> UpResult:
    """Bring the cluster up. Ctrl-C / SIGTERM stops the remote work and raises
    :class:`Interrupted` with the state each host is in (a re-run continues from there)."""
    with Session(inv, parallel=parallel, reporter=reporter,
                 accept_new_host_keys=accept_new_host_keys) as sess:
        try:
            return _up(sess, dry_run=dry_run, load_image=load_image, pull=pull, wait=wait,
                       allow_partial=allow_partial, lock_wait=lock_wait)
        except KeyboardInterrupt:
            raise interrupted(sess, "up") from None


def _usable(sess: Session, stage: str, results: Mapping[str, object], allow_partial: bool,
            skipped: dict[str, BaseException]) -> None:
    """--allow-partial: set failed workers aside (named in the result); the head is never optional."""
    failed = {n: r for n, r in results.items() if isinstance(r, BaseException)}
    if not failed:
        return
    if not allow_partial or sess.inv.head.name in failed:
        raise GroupError(stage, dict(results))
    skipped.update(failed)


def _up(sess: Session, *, dry_run: bool, load_image: bool | None, pull: bool, wait: float,
        allow_partial: bool, lock_wait: float) -> UpResult:
    full = sess.inv
    load = full.cluster.load_image if load_image is None else load_image
    image = full.cluster.image
    skipped: dict[str, BaseException] = {}
    _usable(sess, "connect", sess.connect(strict=False), allow_partial, skipped)
    # One `up`/`down` at a time per cluster: the lock lives on the head, taken before any fact
    # is read (the plan depends on them) and held until we return or die.
    if not dry_run:
        sess.lock("up", wait=lock_wait)
    live = [h for h in full.hosts if h.name not in skipped]
    facts = sess.stage("facts", live, sess.host_facts, strict=False)
    _usable(sess, "facts", facts, allow_partial, skipped)
    gpus = full.gpus_per_node if full.cluster.accelerator == "gpu" else None
    live = [h for h in live if h.name not in skipped]
    pre = sess.stage("preflight", live, lambda h: F.check_preflight(h.name, facts[h.name], want_gpus=gpus),
                     strict=False)
    _usable(sess, "preflight", pre, allow_partial, skipped)
    if skipped:
        from dataclasses import replace
        sess.inv = inv = replace(full, hosts=tuple(h for h in full.hosts if h.name not in skipped))
        for n, exc in skipped.items():
            sess.reporter.event(n, "skipped", "failed", f"--allow-partial: left as it is ({exc})")
    inv = sess.inv
    facts = {h.name: facts[h.name] for h in inv.hosts}
    warns = sess.exposure_warnings() if inv.cluster.runtime == "ray" else []
    if dry_run:
        return UpResult(plan_up(inv, facts), None, sess.timings, changed=False, dry_run=True,
                        skipped=_reasons(skipped), warnings=warns)

    image_from = _distribute_image(sess, facts, image, load=load, pull=pull)
    todo = [h for h in inv.hosts if h.name in image_from]
    if todo:
        ids = sess.stage("image-id", todo, lambda h: sess.ssh[h.name].run(F.image_id_cmd(image)).stdout.strip())
        from dataclasses import replace
        facts = {n: replace(f, image_id=ids.get(n, f.image_id)) for n, f in facts.items()}

    actions = plan_up(inv, facts)
    ray = inv.cluster.runtime == "ray"
    members: RayView | None = None  # Ray's view of the kept cluster, before any change
    if ray and actions[0].action == "keep":
        # Containers can run while Ray has lost their node (a partition, a raylet that died):
        # restart what Ray does not list as alive.
        t0 = sess.clock()
        view = sess.ray_view(inv.hosts, deadline=0)
        if inv.head.ip in view.missing:
            # A head started moments ago (e.g. by an interrupted run) may still be joining: give it
            # HEAD_GRACE seconds before recreating it and every worker with it.
            sess.reporter.event(inv.head.name, "ray-members", "waiting",
                                f"head container running but not in Ray yet: up to {HEAD_GRACE:g}s")
            if sess.ray_view([inv.head], deadline=min(wait, HEAD_GRACE)).ready:
                view = sess.ray_view(inv.hosts, deadline=0)
        sess.timings.add("ray-members", sess.clock() - t0)
        actions = with_ray_members(inv, actions, set(view.missing))
        members = view
    changing = [a for a in actions if a.action != "keep"]
    if changing and ray:
        # `ray` must be in the image: check once per distinct image ID, before any change. An ID
        # that passed before (a marker on some host, see F.ray_ok_marker) is not checked again:
        # image IDs are content hashes, so the same ID is the same content.
        by_id = ray_checks_needed(changing, facts)
        if by_id:
            sess.stage("ray-in-image", [inv.host(n) for n in by_id.values()],
                       lambda h: _check_ray(sess.ssh[h.name], image, facts[h.name].image_id))

    head = actions[0]
    head_view: RayView | None = None
    if head.action != "keep":
        sess.stage("start-head", [inv.head], lambda h: sess.start_container(head))
        if ray:
            head_view = sess.wait_for_ray([inv.head], deadline=wait, stage="head-ready")
    workers = [a for a in actions[1:] if a.action != "keep"]
    if workers:
        by_host = {a.host: a for a in workers}
        sess.stage("start-workers", [inv.host(a.host) for a in workers],
                   lambda h: sess.start_container(by_host[h.name]))
    if not ray:
        sess.stage("running", inv.hosts, lambda h: _running(sess, h))
        return UpResult(actions, None, sess.timings, changed=bool(changing), skipped=_reasons(skipped),
                        warnings=warns, host_timings=_host_timings(sess), image_from=image_from)
    # Poll Ray again only when what we already saw does not prove the cluster ready: a lone head
    # that head-ready saw, or a cluster where nothing changed and every node (with its GPUs) was
    # alive in the ray-members view a moment ago.
    if head_view is not None and not workers and len(inv.hosts) == 1:
        view = head_view
    elif not changing and members is not None and all_alive(members, inv.hosts, float(inv.gpus_per_node)):
        view = members
    else:
        view = sess.wait_for_ray(inv.hosts, deadline=wait, stage="ray-ready",
                                 stale=stale_registrations(inv, actions, members))
    ready_at = time.time()
    return UpResult(actions, view, sess.timings, changed=bool(changing), skipped=_reasons(skipped),
                    warnings=warns, host_timings=_host_timings(sess), ready_at=ready_at,
                    head_clock_offset=sess.head_clock_offset, image_from=image_from)


def stale_registrations(inv: Inventory, actions: Sequence[HostAction], members: RayView | None) -> set[str]:
    """Ray node IDs of the containers we just replaced on a kept head's GCS. Ray lists a dead node
    as alive until its heartbeats time out (tens of seconds), so the old registration of a
    recreated worker must not count as that worker having rejoined."""
    if members is None:
        return set()
    replaced = {inv.host(a.host).ip for a in actions if a.action != "keep"}
    return {n.node_id for n in members.nodes if n.alive and n.ip in replaced and n.node_id}


def all_alive(view: RayView, hosts: Sequence[Host], gpus: float) -> bool:
    """Every host's IP alive in the view, with at least ``gpus`` GPUs."""
    alive = {n.ip: n for n in view.nodes if n.alive}
    return all(h.ip in alive and alive[h.ip].gpus >= gpus for h in hosts)


def _host_timings(sess: Session) -> dict[str, HostTiming]:
    out = {}
    for h in sess.inv.hosts:
        run = sess.run_times.get(h.name)
        out[h.name] = HostTiming(run[0] if run else None, run[1] if run else None, sess.ray_seen.get(h.ip))
    return out


def ray_checks_needed(changing: Sequence[HostAction], facts: Mapping[str, F.HostFacts]) -> dict[str, str]:
    """Image ID -> the host to run the `ray`-in-image check on: one per distinct ID among the
    hosts that change, except IDs some host has a marker for (checked there before)."""
    proven = {m for f in facts.values() for m in f.ray_ok}
    by_id: dict[str, str] = {}
    for a in changing:
        iid = facts[a.host].image_id or ""
        if not (iid and F.ray_ok_marker(iid) in proven):
            by_id.setdefault(iid, a.host)
    return by_id


def _reasons(skipped: Mapping[str, BaseException]) -> dict[str, str]:
    return {n: str(e) for n, e in skipped.items()}


def interrupted(sess: Session, command: str) -> Interrupted:
    """After Ctrl-C / SIGTERM: stop remote work, then report what state each host is in.

    Closing our connections ends every command in flight (long ones run with ``hangup``, so the
    remote side is terminated too) and releases the cluster lock. A second, short-lived session
    then reads each host's container and image and says what a re-run would still do there.
    """
    stage = sess.current_stage
    sess.cancel.set()
    sess.close()
    inv = sess.inv
    from dataclasses import replace
    quick = replace(sess.settings, connect_timeout=min(5.0, sess.settings.connect_timeout), connect_retries=0)
    states: dict[str, str] = {}
    with Session(inv, parallel=sess.parallel, settings=quick) as look:
        conn = look.connect(strict=False)
        ok = [h for h in inv.hosts if not isinstance(conn.get(h.name), BaseException)]
        if inv.head in ok and inv.cluster.runtime == "ray":
            # the Ray poller we piped into the head container would otherwise run to its deadline
            look.ssh[inv.head.name].run(("docker", "exec", inv.cluster.container_name, "sh", "-c", KILL_TAGGED,
                                         "sh", RAY_WAIT_TAG), timeout=10, check=False)
        got = look.stage("facts", ok, look.host_facts, strict=False)
        facts = {n: f for n, f in got.items() if isinstance(f, F.HostFacts)}
        actions = {a.host: a for a in plan_up(inv, facts)}
        for h in inv.hosts:
            f = facts.get(h.name)
            if f is None:
                why = conn.get(h.name) if isinstance(conn.get(h.name), BaseException) else got.get(h.name)
                states[h.name] = f"unknown: {why}"
                continue
            a = actions[h.name]
            c = f.container
            if a.action == "keep" and c is not None:
                states[h.name] = "done: container running with the planned spec"
            elif c is None:
                img = "image present" if f.image_id else "image not present yet"
                states[h.name] = f"not started: no container, {img}"
            else:
                states[h.name] = f"to redo: container {c.status} ({a.reason})"
    return Interrupted(command, stage, states)


def _running(sess: Session, h: Host) -> None:
    """runtime none: the node container must be (and stay) running."""
    name = sess.inv.cluster.container_name
    st = F.parse_container_inspect(sess.ssh[h.name].run(F.container_inspect_cmd(name), timeout=30).stdout)
    if not st or not st.running:
        logs = sess.ssh[h.name].run(("docker", "logs", "--tail", "5", name), timeout=30, check=False)
        raise CommandFailed(h.name, f"docker run {name}", None if not st else 1,
                            logs.stdout + logs.stderr, f"container is {st.status if st else 'absent'}")


def with_ray_members(inv: Inventory, actions: Sequence[HostAction], missing_ips: set[str]) -> tuple[HostAction, ...]:
    """Recreate kept containers whose node Ray does not list alive (all of them if it is the head)."""
    from dataclasses import replace

    if inv.head.ip in missing_ips:
        return tuple(replace(a, action="recreate", reason="head not alive in Ray") if a.host == inv.head.name
                     else (replace(a, action="recreate", reason="the head is (re)started") if a.action == "keep" else a)
                     for a in actions)
    return tuple(replace(a, action="recreate", reason="not alive in Ray")
                 if a.action == "keep" and inv.host(a.host).ip in missing_ips else a for a in actions)


def _pull(ssh: SSHHost, image: str) -> None:
    try:
        ssh.run(("docker", "pull", "--quiet", image), timeout=ssh.settings.command_timeout, hangup=True)
    except CommandFailed as exc:
        low = exc.output_tail.lower()
        if "no space left" in low:
            exc.hint = "the host's disk is full: free space under /var/lib/docker"
        elif "not found" in low or "manifest unknown" in low:
            exc.hint = "check cluster.image (name and tag)"
        elif "connection refused" in low or "no such host" in low or "timeout" in low:
            exc.hint = "the host cannot reach the registry: use --load-image to stream it from here"
        raise


def _load_image(sess: Session, hosts: Sequence[Host], image: str) -> None:
    """`docker save` once on this machine, then stream the tarball to every host's `docker load`."""
    with tempfile.TemporaryDirectory(prefix="bootstrap-image-") as tmp:
        tar = Path(tmp) / "image.tar"
        t0 = sess.clock()
        r = subprocess.run(["docker", "save", "-o", str(tar), image], capture_output=True, text=True)
        if r.returncode != 0:
            raise CommandFailed("localhost", f"docker save {image}", r.returncode, r.stderr)
        sess.timings.add("save", sess.clock() - t0)

        def load(h: Host) -> None:
            with open(tar, "rb") as fh:
                sess.ssh[h.name].run_with_input(("docker", "load", "--quiet"), stream_file(fh))

        sess.stage("load-image", hosts, load)


def _distribute_image(sess: Session, facts: Mapping[str, F.HostFacts], image: str, *, load: bool,
                      pull: bool) -> dict[str, str]:
    """Get the image onto every host that lacks it (or all, with --pull); return where each of
    those hosts got it: "registry", "this machine" or the name of the peer that sent it.

    The registry (or this machine, with --load-image) sends it to one host; the others get it
    from hosts that have it, over the data plane (bootstrap.imagecopy). A host whose copy fails
    falls back to the registry (or this machine), and the event says so."""
    inv = sess.inv
    if load:
        want_id = local_image_id(image)
        if want_id is None:
            raise PreflightFailed("localhost", f"image {image} is not in this machine's Docker",
                                  f"docker pull {image} (or build it) here before --load-image")
        todo = [h for h in inv.hosts if facts[h.name].image_id != want_id]
        origin = "this machine"
        source: Callable[[list[Host]], object] = lambda hosts: _load_image(sess, hosts, image)
    else:
        todo = [h for h in inv.hosts if pull or facts[h.name].image_id is None]
        want_id = None
        origin = "registry"
        source = lambda hosts: sess.stage("pull", hosts, lambda h: _pull(sess.ssh[h.name], image))
    if not todo:
        return {}
    if not inv.cluster.peer_copy or len(inv.hosts) == 1:
        source(todo)
        return {h.name: origin for h in todo}
    got_from: dict[str, str] = {}
    have = [h for h in inv.hosts if h not in todo]
    if want_id is None and have:
        # the tag on hosts that have it: the head's if it has it, else the first one's
        first = next((h for h in have if h.is_head), have[0])
        want_id = facts[first.name].image_id
    seeds = [h for h in have if facts[h.name].image_id == want_id]
    rest = list(todo)
    if not seeds:
        first = next((h for h in todo if h.is_head), todo[0])
        source([first])
        got_from[first.name] = origin
        seeds, rest = [first], [h for h in todo if h is not first]
        got = sess.ssh[first.name].run(F.image_id_cmd(image), timeout=30).stdout.strip()
        if want_id is None:
            want_id = got
        if pull:  # hosts that already had what the registry just sent need nothing
            rest = [h for h in rest if facts[h.name].image_id != want_id]
    failed = _copy_image(sess, seeds, rest, image, want_id or "", got_from)
    if failed:
        for h, why in failed.items():
            sess.reporter.event(h.name, "copy-image", "warning",
                                f"{why}; {'streaming it from here' if load else 'pulling from the registry'} instead")
        source(list(failed))
        got_from.update({h.name: origin for h in failed})
    return got_from


def _copy_image(sess: Session, seeds: Sequence[Host], receivers: Sequence[Host], image: str,
                want_id: str, got_from: dict[str, str]) -> dict[Host, str]:
    """Rounds of peer copies (IC.copy_rounds), recording each receiver's sender in ``got_from``;
    return the hosts that did not get the image, and why."""
    inv = sess.inv
    port = inv.cluster.ports.image_copy
    script = check_script("image_seed.py").decode()
    by_name = {h.name: h for h in inv.hosts}
    failed: dict[Host, str] = {}
    have = [h.name for h in seeds]
    todo = [h.name for h in receivers]
    while todo:
        transfers = IC.copy_rounds(have, todo)[0]
        sent_by = {r: t.sender for t in transfers for r in t.receivers}
        seeds_out: dict[str, object] = {}

        def seed(t: IC.Transfer) -> None:
            h = by_name[t.sender]
            ips = [by_name[r].ip for r in t.receivers]
            try:
                r = sess.ssh[h.name].run(IC.seed_argv(image, h.ip, port, ips, script), check=False,
                                         hangup=True, timeout=sess.ssh[h.name].settings.command_timeout,
                                         display=f"docker save {image} | image_seed.py {h.ip}:{port}")
                seeds_out[h.name] = last_json(r.stdout) or (r.stderr or r.stdout).strip()[-300:]
            except BootstrapError as exc:
                seeds_out[h.name] = str(exc)

        threads = [threading.Thread(target=seed, args=(t,), daemon=True) for t in transfers]
        for th in threads:
            th.start()

        def receive(h: Host) -> str:
            src = by_name[sent_by[h.name]]
            return receive_image(sess.ssh[h.name], image, want_id, src.name, src.ip, port)

        res = sess.stage("copy-image", [by_name[n] for n in sent_by], receive, strict=False)
        for th in threads:
            th.join()
        for t in transfers:
            out = seeds_out.get(t.sender)
            if isinstance(out, dict) and out.get("bytes"):
                secs = max(out.get("seconds") or 0.0, 1e-3)
                sess.reporter.event(t.sender, "seed-image", "done",
                                    f"{IC.human_bytes(out['bytes'])} to {', '.join(t.receivers)} in {secs:.1f}s "
                                    f"({IC.human_bytes(out['bytes'] / secs)}/s)")
        for n, v in res.items():
            if isinstance(v, BaseException):
                why = str(v)
                out = seeds_out.get(sent_by[n])
                if isinstance(out, str) and out:
                    why += f" (sender: {out})"
                failed[by_name[n]] = why
            else:
                have.append(n)
                got_from[n] = sent_by[n]
        todo = [n for n in todo if n not in sent_by]
    return failed


def receive_image(ssh: SSHHost, image: str, want_id: str, src_name: str, src_ip: str, port: int) -> str:
    """Load the image streamed by ``src`` (see IC.seed_argv) and check that it is ``want_id``;
    PreflightFailed when the stream never came, `docker load` refused it, or the ID differs (then
    the tag is removed: a wrong image is never left under the inventory's name)."""
    t0 = time.monotonic()
    r = ssh.run(IC.receive_argv(src_ip, port), check=False, hangup=True, timeout=ssh.settings.command_timeout)
    took = time.monotonic() - t0
    if r.exit_code == IC.NO_SENDER:
        raise PreflightFailed(ssh.name, f"cannot reach {src_name} ({PL.hostport(src_ip, port)}) over the data "
                                        "network for the image copy")
    if not r.ok:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.exit_code}"]
        raise PreflightFailed(ssh.name, f"the image stream from {src_name} was refused by docker load: "
                                        f"{tail[0][:300]}")
    got = ssh.run(F.image_id_cmd(image), timeout=30, check=False).stdout.strip()
    if got != want_id:
        if got:
            ssh.run(("docker", "image", "rm", image), timeout=60, check=False)
        raise PreflightFailed(ssh.name, f"the image from {src_name} loaded as {got[:19] or 'nothing'}, not "
                                        f"{want_id[:19]}: refused")
    return f"from {src_name} in {took:.1f}s"


def last_json(text: str) -> dict | None:
    """The last line of a command's output that is a JSON object (what the checks print)."""
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def _check_ray(ssh: SSHHost, image: str, image_id: str | None = None) -> None:
    r = ssh.run(F.ray_in_image_cmd(image), timeout=120, check=False)
    if not r.ok:
        raise PreflightFailed(
            ssh.name, f"`ray` is not in the image {image} (ray: command not found)",
            "recent vllm/vllm-openai images no longer ship Ray: build an image FROM it with "
            "`RUN pip install 'ray[default]'`, or pick an image that has it")
    if image_id:
        # remembered for the next `up` (read back by F.gather); a marker we cannot write only
        # means the check runs again next time
        ssh.run(F.write_ray_ok_cmd(image_id), timeout=30, check=False)


# -- status ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeStatus:
    host: str
    ip: str
    role: str
    reachable: bool
    container: str  # running / exited / absent / unknown
    ray_alive: bool
    gpus: float
    error: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ClusterStatus:
    nodes: list[NodeStatus]
    #: what `serve` runs now (a ServingState), None when nothing is served or the head is down
    serving: object | None
    #: where the Ray dashboard listens on the head (host:port), None without Ray
    dashboard: str | None


def dashboard_address(inv: Inventory) -> str | None:
    """host:port of the head's Ray dashboard as cluster.dashboard_host sets it."""
    c = inv.cluster
    if c.runtime != "ray":
        return None
    host = {"localhost": "127.0.0.1", "data-plane": inv.head.ip, "all": inv.head.ip}.get(c.dashboard_host,
                                                                                        c.dashboard_host)
    return f"{host}:{c.ports.dashboard}"


def cluster_status(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
                   serving: bool = True) -> ClusterStatus:
    """Each node's container and Ray state; with serving, what `serve` runs (model, split, health)."""
    name = inv.cluster.container_name
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)

        def inspect(h: Host) -> F.ContainerState | None:
            r = sess.ssh[h.name].run(F.container_inspect_cmd(name), timeout=20, check=False)
            return F.parse_container_inspect(r.stdout) if r.ok else None

        ok_hosts = [h for h in inv.hosts if not isinstance(conn.get(h.name), BaseException)]
        states = sess.stage("inspect", ok_hosts, inspect, strict=False)
        view = None
        head_state = states.get(inv.head.name)
        if inv.cluster.runtime == "ray" and isinstance(head_state, F.ContainerState) and head_state.running:
            try:
                view = sess.ray_view(inv.hosts, deadline=0)
            except BootstrapError:
                view = None
        alive = {n.ip: n for n in (view.nodes if view else ()) if n.alive}
        rows = []
        for h in inv.hosts:
            c = conn.get(h.name)
            if isinstance(c, BaseException):
                rows.append(NodeStatus(h.name, h.ip, h.role, False, "unknown", False, 0.0, str(c)))
                continue
            st = states.get(h.name)
            cstate = "absent" if st is None else (st.status if isinstance(st, F.ContainerState) else "unknown")
            node = alive.get(h.ip)
            err = str(st) if isinstance(st, BaseException) else ""
            if inv.cluster.runtime == "none":  # no Ray: a running container is a live node
                rows.append(NodeStatus(h.name, h.ip, h.role, True, cstate, cstate == "running",
                                       float(inv.gpus_per_node), err))
                continue
            # Ray keeps listing a node for a while after its container died (until heartbeats
            # time out): the container state is the faster, surer signal.
            live = node is not None and cstate == "running"
            if node is not None and not live:
                err = err or f"Ray still lists it, but the container is {cstate}"
            rows.append(NodeStatus(h.name, h.ip, h.role, True, cstate, live, node.gpus if live else 0.0, err))
        served = None
        if serving and isinstance(head_state, F.ContainerState) and head_state.running:
            from bootstrap.serve.run import serving_state  # serve builds on this module

            try:
                served = serving_state(sess)
            except BootstrapError:
                served = None
        return ClusterStatus(rows, served, dashboard_address(inv))


# -- down --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DownResult:
    removed: tuple[str, ...]
    absent: tuple[str, ...]


def down(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL,
         reporter: Reporter | None = None, lock_wait: float = 0.0) -> DownResult:
    """`ray stop` then remove the container on every host: workers first, then the head.

    An unreachable host is named in the error; every other host is still torn down. The cluster
    lock is taken on the head (not possible when the head is the unreachable one).
    """
    name = inv.cluster.container_name
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)
        reachable = [h for h in inv.hosts if not isinstance(conn.get(h.name), BaseException)]
        if inv.head in reachable:
            sess.lock("down", wait=lock_wait)
        else:
            sess.reporter.event(inv.head.name, "lock", "failed", "head unreachable: tearing down without the lock")

        def teardown(h: Host) -> bool:
            s = sess.ssh[h.name]
            ci = s.run(F.container_inspect_cmd(name), timeout=20, check=False)
            st = F.parse_container_inspect(ci.stdout) if ci.ok else None
            if st is None:
                return False
            if st.running and inv.cluster.runtime == "ray":
                s.run(("docker", "exec", name, "ray", "stop"), timeout=60, check=False)
            s.run(("docker", "rm", "-f", name), timeout=60)
            return True

        workers = [h for h in reachable if not h.is_head]
        heads = [h for h in reachable if h.is_head]
        res = dict(sess.stage("down", workers, teardown, strict=False))
        res.update(sess.stage("down", heads, teardown, strict=False))
        failures = {n: r for n, r in {**conn, **res}.items() if isinstance(r, BaseException)}
        if failures:
            raise GroupError("down", {**{h.name: res.get(h.name) for h in inv.hosts}, **failures})
        removed = tuple(n for n, r in res.items() if r is True)
        absent = tuple(n for n, r in res.items() if r is False)
        return DownResult(removed, absent)


def plan_offline(inv: Inventory) -> tuple[HostAction, ...]:
    """The containers each host would get, from the inventory alone (no host contacted)."""
    return tuple(HostAction(h.name, "create", "offline plan", container_spec(inv, h, nofile_for(inv, None)))
                 for h in (inv.head, *inv.workers))
