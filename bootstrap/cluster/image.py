"""Getting the image onto every node: pulls, `--load-image` from this machine, and peer copies
between nodes in rounds (the pure rounds are in imagecopy.py). See docs/image-distribution.md."""
from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster import imagecopy as IC
from bootstrap.cluster import plan as PL
from bootstrap.errors import BootstrapError, CommandFailed, PreflightFailed
from bootstrap.model import Host
from bootstrap.remote.session import Session, check_script, last_json
from bootstrap.remote.ssh import SSHHost, stream_file


def local_image_id(image: str) -> str | None:
    r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                       capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def pull(ssh: SSHHost, image: str) -> None:
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


def load_image(sess: Session, hosts: Sequence[Host], image: str) -> None:
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


def distribute(sess: Session, facts: Mapping[str, F.HostFacts], image: str, *, load: bool,
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
        source: Callable[[list[Host]], object] = lambda hosts: load_image(sess, hosts, image)
    else:
        todo = [h for h in inv.hosts if pull or facts[h.name].image_id is None]
        want_id = None
        origin = "registry"
        source = lambda hosts: sess.stage("pull", hosts, lambda h: pull(sess.ssh[h.name], image))
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
