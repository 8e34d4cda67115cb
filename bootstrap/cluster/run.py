"""up, status and down: the commands that change the cluster. Connect, gather facts, plan, change, verify.

Every stage fans out over hosts with bounded parallelism; a failure raises one GroupError that
carries every host's result. Nothing is changed on any host before every host has passed
preflight (reachable, Docker answers, GPUs as expected, `ray` in the image). The decisions are
pure, in plan.py; the remote steps are in ray.py, image.py and probe.py.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster import probe
from bootstrap.cluster import ray as R
from bootstrap.cluster import runtime as RT
from bootstrap.cluster.guard import run as GD
from bootstrap.cluster.imagedist import plan as MR
from bootstrap.cluster.imagedist import run as IM
from bootstrap.cluster.plan import (
    HostAction,
    RayView,
    all_alive,
    compile_cache_volume,
    disruptive,
    drain_mark_volume,
    plan_up,
    ray_checks_needed,
    stale_registrations,
    with_ray_members,
)
from bootstrap.cluster.preflight import run as PR
from bootstrap.cluster.ray import HEAD_GRACE, RAY_WAIT_TAG
from bootstrap.errors import BootstrapError, CommandFailed, GroupError, Interrupted, UsageError
from bootstrap.model import Host, Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.fanout import DEFAULT_PARALLEL, GroupResult
from bootstrap.remote.session import Reporter, Session, Timings


def _one_group_only(inv: Inventory, fn: str, fleet_fn: str, command: str) -> None:
    """up, status and down here drive one replica group. A fleet (cluster.replicas > 1) is more: the
    serve containers, the router and the keepers, which only bootstrap.fleet knows. The cluster layer
    cannot call the fleet above it, so it refuses the inventory and names what to call instead:
    cluster.run.down on a fleet would leave those containers behind."""
    if inv.cluster.replicas > 1:
        raise UsageError(f"cluster.run.{fn} drives one replica group and this inventory has cluster.replicas: "
                         f"{inv.cluster.replicas}: use bootstrap.fleet.lifecycle.{fleet_fn} (what "
                         f"`bootstrap {command}` runs), which also handles the serve containers, the router and "
                         "the keepers")


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


#: up's question before it stops running containers: approve(the group's inventory, the actions that
#: would); it returns to go on and raises (errors.Declined, a UsageError) to leave them as they are.
Approve = Callable[[Inventory, Sequence[HostAction]], None]


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
    #: time.time() when the head's GCS first accepted a connection (workers start then); None
    #: when the head was kept or started alone.
    gcs_open: float | None = None
    #: The head's clock minus ours, as seen when the last Ray poll returned (includes the latency
    #: of that return, a few ms on a LAN); None when Ray was not polled.
    head_clock_offset: float | None = None
    #: What the containers run, "ray" or "none" (None: undecided, a dry run before the image is
    #: on any host), and why (the inventory's key, or what the image has).
    runtime: str | None = None
    runtime_why: str = ""


def up(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
       dry_run: bool = False, load_image: bool | None = None, pull: bool = False,
       wait: float = 180.0, accept_new_host_keys: bool | None = None, allow_partial: bool = False,
       lock_wait: float = 0.0, skip_checks: frozenset[str] = frozenset(),
       approve: Approve | None = None) -> UpResult:
    """Bring the cluster up. Ctrl-C / SIGTERM stops the remote work and raises
    :class:`Interrupted` with the state each host is in (a re-run continues from there). A fleet
    (cluster.replicas > 1) is refused: bootstrap.fleet.lifecycle.up_fleet brings it up."""
    _one_group_only(inv, "up", "up_fleet", "up")
    with Session(inv, parallel=parallel, reporter=reporter,
                 accept_new_host_keys=accept_new_host_keys) as sess:
        try:
            return up_in(sess, dry_run=dry_run, load_image=load_image, pull=pull, wait=wait,
                         allow_partial=allow_partial, lock_wait=lock_wait, skip_checks=skip_checks,
                         approve=approve)
        except KeyboardInterrupt:
            raise interrupted(sess, "up") from None


@dataclass
class Staged:
    """What `up` of one group will do, found without changing anything on a host but its images
    (stage_up): the facts as they will be, the actions, and those that stop a running container."""
    facts: dict[str, F.HostFacts]
    actions: tuple[HostAction, ...]
    #: the actions that stop a running container (plan.disruptive): what approve is asked about
    stopping: tuple[HostAction, ...]
    #: Ray's view of a kept cluster, read before any change (None: the head is (re)started)
    members: RayView | None
    token: GD.TokenPlan | None
    #: the facts as read (before the token's digest), for write_token
    read: dict[str, F.HostFacts]
    wait: float
    #: UpResult's skipped, warnings, image_from, runtime, runtime_why
    done: dict
    #: the whole inventory (--allow-partial sets hosts aside: they stay members of the fence)
    full: Inventory

    @property
    def changing(self) -> list[HostAction]:
        return [a for a in self.actions if a.action != "keep"]


def up_in(sess: Session, *, approve: Approve | None = None, **opts) -> UpResult:
    """`up` of sess.inv (one group) in a session the caller holds: stage_up, approve(inv, actions) with
    the actions that stop a running container (plan.disruptive) before any change to a host (it raises
    to leave every host as it was), then apply_up. fleet.lifecycle.up_fleet stages every replica group
    at once, asks once for all of them, then applies each."""
    staged = stage_up(sess, **opts)
    if isinstance(staged, UpResult):
        return staged
    if staged.stopping and approve is not None:
        approve(sess.inv, staged.stopping)
    return apply_up(sess, staged)


def stage_up(sess: Session, *, dry_run: bool = False, load_image: bool | None = None, pull: bool = False,
             wait: float = 180.0, allow_partial: bool = False, lock_wait: float = 0.0,
             skip_checks: frozenset[str] = frozenset()) -> Staged | UpResult:
    """Everything `up` reads and checks before its first change: the facts (under the cluster lock), the
    preflight, the image on every host (a pull or a load: what runs is unchanged), the runtime, Ray's
    token as it will be (read, not written), the plan, Ray's view of a kept cluster, and the image's
    Ray and CUDA in throw-away containers. A dry run: its UpResult."""
    full = sess.inv
    load = full.cluster.load_image if load_image is None else load_image
    skipped: dict[str, BaseException] = {}
    facts = _gather(sess, dry_run=dry_run, lock_wait=lock_wait, allow_partial=allow_partial, skipped=skipped)
    live = [h for h in full.hosts if h.name not in skipped]
    # a pull (or a load) gives every node the image again: differing IDs are what it fixes
    renewed = frozenset({"image"}) if pull or load else frozenset()
    PR.preflight(sess, full, facts, live, skip=skip_checks | renewed, allow_partial=allow_partial, skipped=skipped)
    _set_aside(sess, full, skipped)
    facts = {h.name: facts[h.name] for h in sess.inv.hosts}
    if dry_run:
        why = settle_runtime(sess, facts)
        inv = sess.inv
        warns = probe.exposure_warnings(sess) if inv.cluster.runtime == "ray" else []
        return UpResult(plan_up(inv, facts), None, sess.timings, changed=False, dry_run=True,
                        skipped=_reasons(skipped), warnings=warns, runtime=inv.cluster.runtime,
                        runtime_why=why)
    facts, image_from, why = _prepare(sess, facts, full, load=load, pull=pull)
    token, planned = GD.plan_token(sess, facts)
    inv = sess.inv
    warns = probe.exposure_warnings(sess) if inv.cluster.runtime == "ray" else []
    done = dict(skipped=_reasons(skipped), warnings=warns, image_from=image_from, runtime=inv.cluster.runtime,
                runtime_why=why)
    ray = inv.cluster.runtime == "ray"
    actions, members = _with_members(sess, plan_up(inv, planned), wait) if ray else (plan_up(inv, planned), None)
    staged = Staged(planned, actions, tuple(disruptive(actions, planned)), members, token, facts, wait, done, full)
    if staged.changing and ray and full.cluster.runtime == "ray":
        _ray_in_image(sess, staged.changing, planned)
    if staged.changing and inv.cluster.accelerator == "gpu" and inv.gpus_per_node:
        _cuda_in_image(sess, staged.changing, planned)
    return staged


def apply_up(sess: Session, staged: Staged) -> UpResult:
    """What stage_up found, done: the fence (before anything of ours listens), Ray's token, the secrets
    (before any container that reads them starts), then the containers, and Ray's view of them."""
    inv = sess.inv
    GD.put_fences(sess, staged.read, staged.full)  # members: every host of the inventory, set aside or not
    GD.write_token(sess, staged.read, staged.token)
    GD.put_secrets(sess, inv.hosts, prune=True)
    actions, members, changing, wait = staged.actions, staged.members, staged.changing, staged.wait
    ray = inv.cluster.runtime == "ray"
    head_view, workers = _start(sess, actions, wait, ray=ray)
    if not ray:
        sess.stage("running", inv.hosts, lambda h: _running(sess, h))
        return UpResult(actions, None, sess.timings, changed=bool(changing), host_timings=_host_timings(sess),
                        **staged.done)
    # Poll Ray again only when what we already saw does not prove the cluster ready: a lone head
    # that head-ready saw, or a cluster where nothing changed and every node (with its GPUs) was
    # alive in the ray-members view a moment ago.
    if head_view is not None and not workers and len(inv.hosts) == 1:
        view = head_view
    elif not changing and members is not None and all_alive(members, inv.hosts, float(inv.gpus_per_node)):
        view = members
    else:
        view = R.wait_for_ray(sess, inv.hosts, deadline=wait, stage="ray-ready",
                                 stale=stale_registrations(inv, actions, members))
    ready_at = time.time()
    return UpResult(actions, view, sess.timings, changed=bool(changing), host_timings=_host_timings(sess),
                    ready_at=ready_at, head_clock_offset=sess.head_clock_offset, gcs_open=sess.gcs_open,
                    **staged.done)


def _gather(sess: Session, *, dry_run: bool, lock_wait: float, allow_partial: bool,
            skipped: dict[str, BaseException]) -> GroupResult:
    """Connect, take the cluster lock, read every reachable host's facts (--allow-partial: the
    workers that fail either are set aside in skipped)."""
    full = sess.inv
    PR.usable(sess, "connect", sess.connect(strict=False), allow_partial, skipped)
    # One `up`/`down` at a time per cluster: the lock lives on the head, taken before any fact
    # is read (the plan depends on them) and held until we return or die.
    if not dry_run:
        sess.lock("up", wait=lock_wait)
    live = [h for h in full.hosts if h.name not in skipped]
    facts = sess.stage("facts", live, lambda h: probe.host_facts(sess, h), strict=False)
    PR.usable(sess, "facts", facts, allow_partial, skipped)
    return facts


def _set_aside(sess: Session, full: Inventory, skipped: Mapping[str, BaseException]) -> None:
    """--allow-partial: the session's inventory without the hosts set aside, each named."""
    if skipped:
        sess.inv = replace(full, hosts=tuple(h for h in full.hosts if h.name not in skipped))
        for n, exc in skipped.items():
            sess.reporter.event(n, "skipped", "failed", f"--allow-partial: left as it is ({exc})")


def _prepare(sess: Session, facts: dict[str, F.HostFacts], full: Inventory, *, load: bool,
             pull: bool) -> tuple[dict[str, F.HostFacts], Mapping[str, str], str]:
    """The image on every host (a running container keeps the image it runs) and the runtime settled.
    Returns the facts as they are now, where each host got the image, and why the runtime."""
    image = full.cluster.image
    image_from = IM.distribute(sess, facts, image, load=load, pull=pull)
    todo = [h for h in sess.inv.hosts if h.name in image_from]
    if todo:
        ids = sess.stage("image-id", todo, lambda h: F.parse_image(sess.ssh[h.name].run(F.image_cmd(image)).stdout))
        facts = {n: replace(f, image_id=ids[n][0], image_key=ids[n][1]) if n in ids else f for n, f in facts.items()}
    return facts, image_from, settle_runtime(sess, facts)


def _with_members(sess: Session, actions: tuple[HostAction, ...],
                  wait: float) -> tuple[tuple[HostAction, ...], RayView | None]:
    """A kept head: Ray's view of the kept cluster, before any change, and the actions with what Ray
    does not list as alive recreated (None: the head is (re)started anyway)."""
    inv = sess.inv
    if actions[0].action != "keep":
        return actions, None
    # Containers can run while Ray has lost their node (a partition, a raylet that died):
    # restart what Ray does not list as alive.
    t0 = sess.clock()
    view = R.ray_view(sess, inv.hosts, deadline=0)
    if inv.head.ip in view.missing:
        # A head started moments ago (e.g. by an interrupted run) may still be joining: give it
        # HEAD_GRACE seconds before recreating it and every worker with it.
        sess.reporter.event(inv.head.name, "ray-members", "waiting",
                            f"head container running but not in Ray yet: up to {HEAD_GRACE:g}s")
        if R.ray_view(sess, [inv.head], deadline=min(wait, HEAD_GRACE)).ready:
            view = R.ray_view(sess, inv.hosts, deadline=0)
    sess.timings.add("ray-members", sess.clock() - t0)
    return with_ray_members(inv, actions, set(view.missing)), view


def _ray_in_image(sess: Session, changing: Sequence[HostAction], facts: Mapping[str, F.HostFacts]) -> None:
    """cluster.runtime: ray needs `ray` in the image (unset, settle_runtime has looked already):
    check once per distinct image ID, before any change. An ID that passed before (a marker on some
    host, see F.ray_ok_marker) is not checked again: image IDs are content hashes, so the same ID is
    the same content."""
    inv = sess.inv
    by_id = ray_checks_needed(changing, facts)
    if by_id:
        sess.stage("ray-in-image", [inv.host(n) for n in by_id.values()],
                   lambda h: R.check_ray(sess.ssh[h.name], inv.cluster.image, facts[h.name].image_id))


def _cuda_in_image(sess: Session, changing: Sequence[HostAction], facts: Mapping[str, F.HostFacts]) -> None:
    """GPU clusters: CUDA initialises with each changing host's GPUs in the image (probe.cuda_init), before any
    container starts: nvidia-smi lists GPUs that CUDA cannot use (802, 803, 804) and a start would die later."""
    inv = sess.inv
    said = sess.stage("cuda-init", [inv.host(a.host) for a in changing],
                      lambda h: probe.cuda_init(sess, h, facts.get(h.name)))
    for name, warning in said.items():
        if isinstance(warning, str):
            sess.reporter.event(name, "cuda-init", "warning", warning)


def _start(sess: Session, actions: Sequence[HostAction], wait: float, *,
           ray: bool) -> tuple[RayView | None, list[HostAction]]:
    """The head's container, then the workers' (those not kept). Returns Ray's view of the head
    where it was waited for alone, and the workers started."""
    inv = sess.inv
    head = actions[0]
    head_view: RayView | None = None
    workers = [a for a in actions[1:] if a.action != "keep"]
    if head.action != "keep":
        sess.stage("start-head", [inv.head], lambda h: start_container(sess, head))
        # Workers start as soon as the head's GCS answers: the rest of the head's start (its
        # raylet registering) overlaps theirs. Without workers to start, or when the head host
        # cannot tell, wait for the head in Ray (an error there names the head's state and log).
        if ray and not (workers and R.wait_for_gcs(sess, deadline=wait)):
            head_view = R.wait_for_ray(sess, [inv.head], deadline=wait, stage="head-ready")
    if workers:
        by_host = {a.host: a for a in workers}
        sess.stage("start-workers", [inv.host(a.host) for a in workers],
                   lambda h: start_container(sess, by_host[h.name]))
    return head_view, workers


def settle_runtime(sess: Session, facts: Mapping[str, F.HostFacts]) -> str:
    """cluster.runtime unset: decide it from the image on the hosts and set it in sess.inv (see
    bootstrap.cluster.runtime). Each distinct image ID is checked for `ray` once, on one host that
    has it, unless a host's marker says already. Returns why; the runtime stays unset only when
    the image is on no host (a dry run before it was pulled)."""
    inv = sess.inv
    if inv.cluster.runtime is not None:
        return f"cluster.runtime: {inv.cluster.runtime}"
    host_of = RT.image_hosts(facts)
    if not host_of:
        return "the image is on no host yet (the rows show the containers with Ray)"
    has = RT.known_from_markers(facts)
    todo = {iid: h for iid, h in host_of.items() if iid not in has}
    if todo:
        got = sess.stage("ray-in-image", [inv.host(h) for h in todo.values()],
                         lambda h: R.image_has_ray(sess.ssh[h.name], inv.cluster.image, facts[h.name].image_id))
        has.update({iid: bool(got[h]) for iid, h in todo.items()})
    runtime, why = RT.choose(has, host_of, inv.cluster.image)
    sess.inv = RT.resolved(inv, runtime)
    sess.reporter.event(inv.head.name, "runtime", "done", f"{runtime}: {why}")
    return why


def _host_timings(sess: Session) -> dict[str, HostTiming]:
    out = {}
    for h in sess.inv.hosts:
        run = sess.run_times.get(h.name)
        out[h.name] = HostTiming(run[0] if run else None, run[1] if run else None, sess.ray_seen.get(h.ip))
    return out


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
    sess.abandon()
    inv = sess.inv
    quick = replace(sess.settings, connect_timeout=min(5.0, sess.settings.connect_timeout), connect_retries=0)
    states: dict[str, str] = {}
    with Session(inv, parallel=sess.parallel, settings=quick) as look:
        conn = look.connect(strict=False)
        unreachable = conn.failed
        ok = [h for h in inv.hosts if h.name not in unreachable]
        if inv.head in ok and inv.cluster.runtime == "ray":
            # the Ray poller we piped into the head container would otherwise run to its deadline; not
            # checked: this is the interrupt path, and the poller ends at its own deadline in any case
            look.ssh[inv.head.name].run(DK.kill_tagged_argv(inv.cluster.container_name, RAY_WAIT_TAG),
                                        timeout=10, check=False)
        got = look.stage("facts", ok, lambda h: probe.host_facts(look, h), strict=False)
        facts = got.succeeded
        actions = {a.host: a for a in plan_up(inv, facts)}
        for h in inv.hosts:
            f = facts.get(h.name)
            if f is None:
                why = unreachable.get(h.name) or got.get(h.name)
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
    st = N.of(sess, h, name).inspect(check=True)
    if not st or not st.running:
        raise CommandFailed(h.name, f"docker run {name}", None if not st else 1,
                            N.of(sess, h, name).logs(5, timeout=30),
                            f"container is {st.status if st else 'absent'}")


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
    #: what the containers run: "ray", "none" (vLLM's native mode: a running container is a live
    #: node), None when unset and no container tells
    runtime: str | None = None
    #: why Ray's view could not be read from the head ("" when it was, or not asked): the nodes then
    #: show "no" because nobody could tell, not because Ray said so
    ray_error: str = ""
    #: why the serving reader failed ("" when it answered, or was not asked): "unknown", not "nothing"
    serving_error: str = ""


def dashboard_address(inv: Inventory) -> str | None:
    """host:port of the head's Ray dashboard as cluster.dashboard_host sets it."""
    c = inv.cluster
    if c.runtime != "ray":
        return None
    host = {"localhost": "127.0.0.1", "data-plane": inv.head.ip, "all": inv.head.ip}.get(c.dashboard_host,
                                                                                        c.dashboard_host)
    return f"{host}:{c.ports.dashboard}"


def cluster_status(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None,
                   serving: Callable[[Session], object | None] | None = None) -> ClusterStatus:
    """Each node's container and Ray state; with a serving reader, what `serve` runs (model, split,
    health), read in the same session once the head's container runs.

    The caller passes the reader (the CLI passes serve.state.serving_state) because the cluster layer
    never imports serve: serve builds on the cluster, not the other way round. A fleet
    (cluster.replicas > 1) is refused: bootstrap.fleet.lifecycle.fleet_status reads it."""
    _one_group_only(inv, "cluster_status", "fleet_status", "status")
    name = inv.cluster.container_name
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)
        unreachable = conn.failed
        ok_hosts = [h for h in inv.hosts if h.name not in unreachable]
        states = sess.stage("inspect", ok_hosts, lambda h: N.of(sess, h, name).inspect(timeout=20),
                            strict=False)
        inv = RT.from_containers(inv, states)  # runtime unset: what the containers run
        view = None
        ray_error = ""
        head_state = states.get(inv.head.name)
        if inv.cluster.runtime == "ray" and isinstance(head_state, F.ContainerState) and head_state.running:
            try:
                view = R.ray_view(sess, inv.hosts, deadline=0)
            except BootstrapError as exc:  # status still shows every node; it says why Ray's column is blind
                ray_error = f"could not ask Ray on {inv.head.name}: {exc}"
            else:
                if view.error and not view.nodes:
                    ray_error = f"Ray on {inv.head.name} did not list its nodes: {view.error}"
        alive = {n.ip: n for n in (view.nodes if view else ()) if n.alive}
        rows = []
        errors = states.failed
        for h in inv.hosts:
            c = unreachable.get(h.name)
            if c is not None:
                rows.append(NodeStatus(h.name, h.ip, h.role, False, "unknown", False, 0.0, str(c)))
                continue
            st = states.get(h.name)
            cstate = "absent" if st is None else (st.status if isinstance(st, F.ContainerState) else "unknown")
            node = alive.get(h.ip)
            err = str(errors.get(h.name) or "")
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
        serving_error = ""
        if serving is not None and isinstance(head_state, F.ContainerState) and head_state.running:
            try:
                served = serving(sess)
            except BootstrapError as exc:  # shown as "serving: unknown (why)", never as "nothing"
                serving_error = str(exc)
        return ClusterStatus(rows, served, dashboard_address(inv), inv.cluster.runtime, ray_error, serving_error)


# -- down --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DownResult:
    removed: tuple[str, ...]
    absent: tuple[str, ...]


def down(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL,
         reporter: Reporter | None = None, lock_wait: float = 0.0) -> DownResult:
    """`ray stop` then remove the container on every host: workers first, then the head.

    An unreachable host is named in the error; every other host is still torn down. The cluster
    lock is taken on the head (not possible when the head is the unreachable one). A fleet
    (cluster.replicas > 1) is refused: bootstrap.fleet.lifecycle.down_fleet also removes its serve
    containers, router and keepers.
    """
    _one_group_only(inv, "down", "down_fleet", "down")
    name = inv.cluster.container_name
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        conn = sess.connect(strict=False)
        unreachable = conn.failed
        reachable = [h for h in inv.hosts if h.name not in unreachable]
        if inv.head in reachable:
            sess.lock("down", wait=lock_wait)
        else:
            sess.reporter.event(inv.head.name, "lock", "failed", "head unreachable: tearing down without the lock")

        def teardown(h: Host) -> bool:
            s = sess.ssh[h.name]
            st = DK.inspect(s, name, timeout=20)
            if st is not None:
                if st.running and (RT.of_container(st) or inv.cluster.runtime) == "ray":
                    # not checked: only a courtesy so Ray deregisters the node; `rm -f` below (checked) ends it anyway
                    s.run(DK.exec_argv(name, "ray", "stop"), timeout=60, check=False)
                DK.rm(s, name, check=True)
            DK.volume_rm(s, compile_cache_volume(inv), drain_mark_volume(inv))  # after the containers that mount it
            if h.is_head:  # a registry mirror an interrupted cold `up` left (cluster/imagedist/plan.py); often none
                s.run(MR.remove_argv(), timeout=120, check=False)
            GD.take_down(sess, h)  # the fence and Ray's token, after what they guarded
            return st is not None

        workers = [h for h in reachable if not h.is_head]
        heads = [h for h in reachable if h.is_head]
        res = sess.stage("down", workers, teardown, strict=False)
        res.update(sess.stage("down", heads, teardown, strict=False))
        failures = {**unreachable, **res.failed}
        if failures:
            raise GroupError("down", {**{h.name: res.get(h.name) for h in inv.hosts}, **failures})
        removed = tuple(n for n, r in res.items() if r is True)
        absent = tuple(n for n, r in res.items() if r is False)
        return DownResult(removed, absent)


def start_container(sess: Session, action: HostAction) -> None:
    s = sess.ssh[action.host]
    spec = action.spec
    if action.action != "create":  # "create": the facts (read under the lock) found none
        DK.rm(s, spec.name)
    t0 = time.time()
    s.run(spec.run_argv(), timeout=120)
    sess.run_times[action.host] = (t0, time.time())
