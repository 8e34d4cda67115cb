"""Getting the image onto every node over SSH: pulls, the registry mirror, `--load-image`, peer copies.

Peer copies go between nodes in rounds; the pure rounds, the mirror's configuration and the commands
are in plan.py. See docs/image-distribution.md."""
from __future__ import annotations

import queue
import threading
import time
from typing import Mapping, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster import peers
from bootstrap.cluster import plan as PL
from bootstrap.cluster.imagedist import plan as DP
from bootstrap.errors import BootstrapError, CommandFailed, GroupError, PreflightFailed, add_note
from bootstrap.model import Host
from bootstrap.remote import argv as RA
from bootstrap.remote import docker as DK
from bootstrap.remote.fanout import GroupResult
from bootstrap.remote.session import Session, check_script, last_json
from bootstrap.remote.ssh import SSHHost


def local_image_key(image: str) -> str | None:
    """``image`` in this machine's Docker (the Docker SDK) by its content (facts.image_key), None when it
    has no such image; PreflightFailed (localhost) when the daemon does not answer."""
    from bootstrap.remote import localdocker as LD

    try:
        return LD.image_key(image)
    except LD.ERRORS as exc:
        raise PreflightFailed("localhost", f"cannot inspect image {image} in this machine's Docker: "
                                           f"{LD.explain(exc)}") from None


def pull_image(ssh: SSHHost, image: str) -> int | None:
    """`docker pull IMAGE` on the host; the image's size there afterwards (bytes unpacked; None unknown)."""
    try:
        ssh.run(RA.pull_argv(image), timeout=ssh.settings.command_timeout, hangup=True)
    except CommandFailed as exc:
        low = exc.output_tail.lower()
        if "no space left" in low:
            exc.hint = "the host's disk is full: free space under /var/lib/docker"
        elif "no matching manifest" in low or "does not match the specified platform" in low:
            exc.hint = ("the image has no build for this host's CPU architecture (`uname -m`): use an image published "
                        "for it (or for several platforms) as cluster.image, or leave the host out")
        elif "not found" in low or "manifest unknown" in low:
            exc.hint = "check cluster.image (name and tag)"
        elif "connection refused" in low or "no such host" in low or "timeout" in low:
            exc.hint = "the host cannot reach the registry: use --load-image to stream it from here"
        raise
    return image_size(ssh, image)


def image_size(ssh: SSHHost, image: str) -> int | None:
    """The image's size in the host's Docker (bytes, unpacked), None when Docker does not say."""
    r = ssh.run(RA.image_inspect_argv(image, "{{.Size}}"), timeout=30, check=False)
    out = r.stdout.strip() if r.ok else ""
    return int(out) if out.isdigit() else None


def pulled(size: object, seconds: float) -> str:
    """What a pull's `done` line adds: the image's size (unpacked, as `docker images` shows it) and the rate."""
    if not isinstance(size, int) or size <= 0:
        return ""
    rate = f" ({DP.human_bytes(size / seconds)}/s)" if seconds > 0.05 else ""
    return f"{DP.human_bytes(size)} unpacked{rate}"


def load_image(sess: Session, hosts: Sequence[Host], image: str, *, queue_chunks: int = 8) -> None:
    """Stream this machine's image into every host's `docker load`, nothing written here: `docker
    save` through the Docker SDK is read once and each chunk goes to every host, through a bounded
    queue per host (the reader waits for the slowest host; a host that fails drops out and its queue
    is discarded, the others go on). ``queue_chunks``: chunks (LD.SAVE_CHUNK, 1 MiB) waiting per
    host, what it holds in memory per host. "save" times the daemon's wait before its first chunk."""
    hosts = list(hosts)
    # Every host of a group loads at once (one left waiting for a worker of sess.stage would stop
    # the reader): at most sess.parallel hosts read one save stream.
    size = max(1, sess.parallel)
    results = GroupResult()
    for i in range(0, len(hosts), size):
        results.update(_stream_to(sess, hosts[i:i + size], image, queue_chunks))
    if results.failed:
        raise GroupError("load-image", results)


_END = object()  # after the last chunk


class _SaveFanout:
    """One `docker save` stream of this machine read once and queued for each host of a group."""

    def __init__(self, sess: Session, image: str, saved, first: bytes, names: Sequence[str],
                 queue_chunks: int) -> None:
        self.sess, self.image, self.saved, self.first = sess, image, saved, first
        self.queues: dict[str, queue.Queue] = {n: queue.Queue(queue_chunks) for n in names}
        self.gone: set[str] = set()  # hosts that read no more: loaded, failed, or never started
        self.stop = threading.Event()

    def halted(self) -> bool:
        return self.stop.is_set() or self.sess.cancel.is_set()

    def put(self, name: str, item: object) -> None:
        q = self.queues[name]
        while name not in self.gone and not self.halted():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:  # local flow control, not a remote step: try again until it is read
                pass

    def read(self) -> None:
        last: object = _END
        try:
            if self.first:
                for name in self.queues:
                    self.put(name, self.first)
            for chunk in self.saved:
                if self.halted() or len(self.gone) == len(self.queues):
                    return  # nobody reads on: closing the stream ends the daemon's export
                for name in self.queues:
                    self.put(name, chunk)
        except BaseException as exc:  # noqa: BLE001 - the stream broke: every load fails with it
            last = exc
        finally:
            for name in self.queues:
                self.put(name, last)
            self.saved.close()

    def chunks(self, name: str):
        q = self.queues[name]
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                if self.halted():
                    raise BootstrapError(f"the stream of {self.image} from this machine stopped") from None
                continue
            if item is _END:
                return
            if isinstance(item, CommandFailed):  # a copy: each host's thread raises its own
                raise CommandFailed(item.host, item.command, item.exit_code, item.output_tail)
            if isinstance(item, BaseException):
                raise CommandFailed("localhost", f"docker save {self.image}", 1, f"{type(item).__name__}: {item}")
            yield item

    def done(self, name: str) -> None:
        """``name`` reads no more: what the reader queued for it is freed, and the reader unblocked."""
        self.gone.add(name)
        try:
            while True:
                self.queues[name].get_nowait()
        except queue.Empty:
            pass


def _stream_to(sess: Session, group: list[Host], image: str, queue_chunks: int) -> dict[str, object]:
    """One save stream of ``image`` loaded into every host of ``group`` at once (a stage's results)."""
    from bootstrap.remote import localdocker as LD  # the Docker SDK: only when streaming from here

    t0 = sess.clock()
    saved = LD.save(image)
    try:
        first = next(saved, b"")  # CommandFailed naming localhost: no such image, or refused
    except LD.DockerUnavailable as exc:
        raise CommandFailed("localhost", f"docker save {image}", 1, str(exc)) from None
    sess.timings.add("save", sess.clock() - t0)
    fan = _SaveFanout(sess, image, saved, first, [h.name for h in group], queue_chunks)

    def load(h: Host) -> None:
        try:
            sess.ssh[h.name].run_with_input(RA.load_argv(), fan.chunks(h.name))
        finally:
            fan.done(h.name)

    reader = threading.Thread(target=fan.read, name="load-image-save", daemon=True)
    reader.start()
    try:
        return sess.stage("load-image", group, load, strict=False)
    finally:
        fan.stop.set()
        reader.join(timeout=10)


def _same_arch(facts: Mapping[str, F.HostFacts], image: str) -> None:
    """PreflightFailed (the first host) where this machine's image is built for another CPU architecture than a
    host's: `docker load` takes it, and every program in it then fails with "exec format error"."""
    from bootstrap.remote import localdocker as LD

    try:
        platform = LD.image_platform(image)
    except LD.ERRORS:
        return  # local_image_key says why, next
    for name, f in facts.items():
        arch = f.rack.arch if f.rack is not None else None
        if arch and F.platform_arch(platform) not in (None, arch):
            raise PreflightFailed(name, f"--load-image: this machine's {image} is built for {platform}, {name} is "
                                        f"{arch} ({f.rack.machine}): its programs would fail there with \"exec "
                                        "format error\"", f"build or pull {image} for linux/{arch} here "
                                        f"(`docker pull --platform linux/{arch} {image}`), then run up again")


def distribute(sess: Session, facts: Mapping[str, F.HostFacts], image: str, *, load: bool,
               pull: bool) -> dict[str, str]:
    """Get the image onto every host that lacks it (or all, with --pull); return where each of
    those hosts got it: "registry", "this machine" or the name of the peer that sent it.

    The registry (or this machine, with --load-image) sends it to one host; the others get it
    from hosts that have it, over the data plane (imagedist/plan.py). A host whose copy fails
    falls back to the registry (or this machine), and the event says so."""
    inv = sess.inv
    # the image by its content on every host: hosts with Docker's classic image store and hosts with its
    # containerd store give one image different IDs (facts.image_key)
    ids = {n: f.image_key if f.image_id else None for n, f in facts.items()}
    if load:
        want_id = local_image_key(image)
        if want_id is None:
            raise PreflightFailed("localhost", f"image {image} is not in this machine's Docker",
                                  f"docker pull {image} (or build it) here before --load-image")
        _same_arch(facts, image)
        origin = "this machine"

        def source(hosts: list[Host]) -> object:
            return load_image(sess, hosts, image)
    else:
        want_id = None
        origin = "registry"

        def source(hosts: list[Host]) -> object:
            return sess.stage("pull", hosts, lambda h: pull_image(sess.ssh[h.name], image), said=pulled)
    todo = DP.lacking(inv.hosts, ids, want_id, pull=pull)
    if not todo:
        return {}
    if not inv.cluster.peer_copy or len(inv.hosts) == 1:
        source(todo)
        return {h.name: origin for h in todo}
    got_from: dict[str, str] = {}
    seeds, want_id = DP.seeds_of([h for h in inv.hosts if h not in todo], ids, want_id)
    rest = list(todo)
    if not seeds and not load and inv.cluster.image_mirror:
        got, head_id = _through_mirror(sess, DP.first_of(todo), todo, image)
        if got:
            got_from.update(got)
            seeds = [h for h in todo if h.name in got]
            rest = [h for h in todo if h.name not in got]
            want_id = head_id
    if not seeds:
        first = DP.first_of(todo)
        source([first])
        got_from[first.name] = origin
        seeds, rest = [first], [h for h in todo if h is not first]
        got = F.parse_image(sess.ssh[first.name].run(F.image_cmd(image), timeout=30).stdout)[1] or ""
        if want_id is None:
            want_id = got
        if pull:  # hosts that already had what the registry just sent need nothing
            rest = [h for h in rest if ids[h.name] != want_id]
    failed = _copy_image(sess, seeds, rest, image, want_id or "", got_from)
    if failed:
        for h, why in failed.items():
            sess.reporter.event(h.name, "copy-image", "warning",
                                f"{why}; {'streaming it from here' if load else 'pulling from the registry'} instead")
        source(list(failed))
        got_from.update({h.name: origin for h in failed})
    return got_from


def _through_mirror(sess: Session, head: Host, todo: Sequence[Host], image: str) -> tuple[dict[str, str], str]:
    """Every host of ``todo`` pulls the image at once through a registry mirror on ``head``
    (imagedist/plan.py), which is removed afterwards. Return where each host that got it got it
    ("registry" for the head, the head's name for the others), and the head's image by its content
    (facts.image_key): nothing
    when the mirror could not serve (the reason in a warning; the head then pulls and copies as
    before). A host whose pull failed, or whose image differs from the head's, is left out (it gets
    the image from a peer)."""
    port = sess.inv.cluster.ports.image_copy
    ref = DP.mirror_ref(image, port)
    if ref is None:
        return {}, ""
    ssh = sess.ssh[head.name]
    started = False
    try:
        t0 = sess.clock()
        sess.reporter.event(head.name, "image-mirror", "start")
        why, reg, https = _mirror_ready(sess, head, image)
        if why:
            return _mirror_skip(sess, head, why)
        started = True
        why = _mirror_start(sess, head, reg, https)
        if why:
            return _mirror_skip(sess, head, why)
        scheme = "https" if https else "http"
        sess.reporter.event(head.name, "image-mirror", "done",
                            f"{PL.hostport(head.ip, port)} caching {scheme}://{reg} in {sess.clock() - t0:.1f}s")
        script = check_script("mirror_forward.py").decode()
        res = sess.stage("pull-mirror", todo, lambda h: _pull_through(sess, h, head, ref, image, script),
                         strict=False, said=pulled)
    finally:
        if started:
            ssh.run(DP.remove_argv(), timeout=120, check=False)
    if head.name not in res.succeeded:
        return _mirror_skip(sess, head, f"{head.name}'s pull through its mirror failed ({res.failed.get(head.name)})")
    return _mirrored(sess, head, todo, image, res)


def _mirror_skip(sess: Session, head: Host, why: str) -> tuple[dict[str, str], str]:
    """The mirror does not serve: say why (the head pulls and copies instead); nothing got."""
    sess.reporter.event(head.name, "image-mirror", "warning",
                        f"{why}; {head.name} pulls the image and copies it to the others instead")
    return {}, ""


def _mirror_ready(sess: Session, head: Host, image: str) -> tuple[str, str, bool]:
    """The mirror's image on the head (pulled if absent), and the registry it is to cache and whether
    over TLS: (why it cannot, registry, https)."""
    ssh = sess.ssh[head.name]
    mirror = sess.inv.cluster.image_mirror
    if not ssh.run(F.image_id_cmd(mirror), timeout=30, check=False).ok:
        try:
            pull_image(ssh, mirror)
        except CommandFailed as exc:
            return (f"cannot pull the mirror's image {mirror} (cluster.image_mirror): "
                    f"{exc.output_tail.strip()[-200:]}", "", False)
    reg = DP.split_image(image).registry
    conf_out = ssh.run(DP.registry_config_cmd(), timeout=30, check=False).stdout
    return "", reg, not DP.plain_http(reg, conf_out)


def _mirror_start(sess: Session, head: Host, reg: str, https: bool) -> str:
    """Start the mirror on the head and ask the registry's root through it: why it cannot serve, or ""."""
    inv, ssh = sess.inv, sess.ssh[head.name]
    port, mirror = inv.cluster.ports.image_copy, inv.cluster.image_mirror
    others = [h.ip.strip("[]") for h in inv.hosts if h is not head]
    conf = DP.nginx_conf(reg, https, head.ip, port, others)
    for argv in (DP.prepare_argv(mirror), DP.run_argv(mirror, conf)):
        r = ssh.run(argv, timeout=120, check=False, display=f"docker run {mirror} (the image mirror)")
        if not r.ok:
            return f"the mirror did not start: {(r.stderr or r.stdout).strip()[-200:] or r.exit_code}"
    out = ssh.run(DP.probe_argv(port), timeout=30, check=False).stdout
    status = DP.probe_status(out)
    if status == 200:
        return ""
    logs = ssh.run(DK.logs_argv(DP.CONTAINER, 3), timeout=30, check=False)
    tail = (logs.stderr or logs.stdout).strip().splitlines()[-1:]
    seen = f" ({tail[0][:200]})" if tail else ""
    return f"the mirror on {head.name} cannot serve {reg}: {DP.probe_why(status)}{seen}"


def _pull_through(sess: Session, h: Host, head: Host, ref: str, image: str, script: str) -> int | None:
    """``h`` pulls ``ref`` through the head's mirror and tags it under ``image``; its size there (image_size)."""
    s = sess.ssh[h.name]
    port = sess.inv.cluster.ports.image_copy
    argv = DP.pull_argv(ref, None if h is head else head.ip, port, h.ip, script)
    r = s.run(argv, timeout=s.settings.command_timeout, check=False, hangup=True,
              display=f"docker pull {ref}" + ("" if h is head else f" (via {head.name})"))
    if not r.ok:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.exit_code}"]
        raise PreflightFailed(h.name, f"the pull through {head.name}'s mirror failed: {tail[0][:300]}")
    s.run(DP.retag_argv(ref, image), timeout=60)
    return image_size(s, image)


def _mirrored(sess: Session, head: Host, todo: Sequence[Host], image: str,
              res: GroupResult) -> tuple[dict[str, str], str]:
    """After the pulls through the mirror: the hosts whose image is the head's (others are removed
    and named) with where each got it, and the head's image by its content."""
    ids = sess.stage("image-id", [h for h in todo if h.name in res.succeeded],
                     lambda h: F.parse_image(sess.ssh[h.name].run(F.image_cmd(image), timeout=30).stdout)[1] or "",
                     strict=False)
    want = ids.succeeded.get(head.name)
    got: dict[str, str] = {}
    for h in todo:
        if h.name not in ids.succeeded:
            continue
        if ids.succeeded[h.name] != want:  # never: one manifest, checked by each Docker; refused if so
            sess.ssh[h.name].run(RA.image_rm_argv(image), timeout=60, check=False)
            sess.reporter.event(h.name, "pull-mirror", "warning", f"got {ids.succeeded[h.name][:19]}, not "
                                f"{(want or '')[:19]}: removed")
            continue
        got[h.name] = "registry" if h is head else head.name
    for n, why in res.failed.items():
        sess.reporter.event(n, "pull-mirror", "warning", f"{why}; it gets the image from a peer instead")
    return got, want or ""


def _copy_image(sess: Session, seeds: Sequence[Host], receivers: Sequence[Host], image: str,
                want_id: str, got_from: dict[str, str]) -> dict[Host, str]:
    """Peer copies of the image in rounds (cluster/peers.py), recording each receiver's sender in
    ``got_from``; return the hosts that did not get the image, and why."""
    port = sess.inv.cluster.ports.image_copy
    script = check_script("image_seed.py").decode()

    def send(h: Host, to: Sequence[Host]) -> dict | str:
        ssh = sess.ssh[h.name]
        r = ssh.run(DP.seed_argv(image, h.ip, port, [x.ip for x in to], script), check=False, hangup=True,
                    timeout=ssh.settings.command_timeout, display=f"docker save {image} | image_seed.py {h.ip}:{port}")
        return last_json(r.stdout) or (r.stderr or r.stdout).strip()[-300:]

    def receive(h: Host, src: Host, sent) -> str:
        return receive_image(sess.ssh[h.name], image, want_id, src.name, src.ip, port)

    return peers.copy_in_rounds(sess, seeds, receivers, stage="copy-image", send=send, receive=receive,
                                got_from=got_from)


def receive_image(ssh: SSHHost, image: str, want_id: str, src_name: str, src_ip: str, port: int) -> str:
    """Load the image streamed by ``src`` (see DP.seed_argv) and check that it is ``want_id`` (by content:
    facts.image_key);
    PreflightFailed when the stream never came, `docker load` refused it, or the ID differs (then
    the tag is removed: a wrong image is never left under the inventory's name)."""
    t0 = time.monotonic()
    r = ssh.run(DP.receive_argv(src_ip, port), check=False, hangup=True, timeout=ssh.settings.command_timeout)
    took = time.monotonic() - t0
    if r.exit_code == DP.NO_SENDER:
        raise PreflightFailed(ssh.name, f"cannot reach {src_name} ({PL.hostport(src_ip, port)}) over the data "
                                        "network for the image copy")
    if not r.ok:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.exit_code}"]
        raise PreflightFailed(ssh.name, f"the image stream from {src_name} was refused by docker load: "
                                        f"{tail[0][:300]}")
    # by content: a classic and a containerd image store load one stream under different IDs
    got = F.parse_image(ssh.run(F.image_cmd(image), timeout=30, check=False).stdout)[1] or ""  # "": absent
    if got != want_id:
        refused = PreflightFailed(ssh.name, f"the image from {src_name} loaded as {got[:19] or 'nothing'}, not "
                                            f"{want_id[:19]}: refused")
        if got:
            rm = ssh.run(RA.image_rm_argv(image), timeout=60, check=False)
            if not rm.ok:  # the wrong image stays under the inventory's name: say so beside the refusal
                add_note(refused, f"{ssh.name}: could not remove the wrong image {image} "
                                  f"({(rm.stderr or rm.stdout).strip()[-200:] or f'exit {rm.exit_code}'}): "
                                  f"remove it by hand (`docker image rm {image}`) before the next `up`")
        raise refused
    return f"from {src_name} in {took:.1f}s"
