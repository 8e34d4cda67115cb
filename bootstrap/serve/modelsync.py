"""`serve --sync-model`: copy the model directory from the head to the nodes where it differs,
node to node over the data network (cluster/peers.py: one pipelined copy, the controller starts every
node's end), each copy checked by content before it replaces anything, and carrying only the files
that differ. See docs/image-distribution.md.

The head runs checks/image_seed.py in its cluster container, reading `tar -C MODEL -cf - .` itself
and serving the stream on its data-plane IP to its first receiver only. Each receiver runs the same
script in its cluster container: it connects to the node before it (from its own data-plane IP),
passes every chunk on to the node after it (a chain, IC.MODEL_FANOUT), takes the stream's SHA-256
and feeds `tar -x` under MODEL/.bootstrap-incoming (untar_cmd). No byte goes through a `docker exec`
or `docker run` stdin; checks/model_stream.py puts a checked copy in place (commit, merge) and
receives the relayed fallback's stream. Only when a node's digest equals the one the head took of what
it sent does the received tree replace MODEL's contents; otherwise it is discarded and the node falls
back to a stream relayed by this machine (head -> here -> node, checked the same way), and a warning
says so.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Iterable, Mapping, Sequence

from bootstrap.cluster import peers
from bootstrap.cluster import plan as PL
from bootstrap.cluster.imagedist import plan as IC
from bootstrap.errors import BootstrapError, PreflightFailed
from bootstrap.model import Host
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.session import Session, check_script, last_json
from bootstrap.serve import manifest as MF

INCOMING = ".bootstrap-incoming"
#: the least time a copy gets (weights run to hundreds of GB): the inventory's command_timeout if longer
COPY_TIMEOUT_S = 3600.0


def tar_cmd(model: str, files: Sequence[str] | None = None) -> tuple[str, ...]:
    """The sender's stream: the model directory as tar, without a half-received copy in it; with
    ``files`` (MF.sync_files), only those (none: an archive of the directory entry alone)."""
    if files is None:
        return ("tar", "-C", model, f"--exclude=./{INCOMING}", "-cf", "-", ".")
    names = [f"./{f}" for f in files] or ["."]  # ./ : a name starting with - is never an option
    return ("tar", "-C", model, "--no-recursion", "-cf", "-", *names)


def tar_argv(container: str, model: str, files: Sequence[str] | None = None) -> tuple[str, ...]:
    """tar_cmd run in the cluster container, its output out of `docker exec` (the relay's source)."""
    return DK.exec_argv(container, *tar_cmd(model, files))


def untar_cmd(model: str) -> tuple[str, ...]:
    """A receiver's sink: the stream unpacked under MODEL/.bootstrap-incoming (emptied first), as
    model_stream.py's receive does, for commit or merge to put in place once the digest is checked."""
    return ("sh", "-c", 'rm -rf "$0" && mkdir -p "$0" && exec tar -C "$0" -xf -', f"{model.rstrip('/')}/{INCOMING}")


def send_args(ip: str, port: int, to: Sequence[str], model: str, files: Sequence[str] | None,
              wait_s: float = IC.CONNECT_WAIT_S) -> tuple[str, ...]:
    """checks/image_seed.py's arguments on the head: tar_cmd's stream, served on its data-plane IP to ``to``."""
    return (ip, str(port), ",".join(to), f"{wait_s:g}", "--source-json", json.dumps(tar_cmd(model, files)))


def pass_args(ip: str, port: int, to: Sequence[str], src: str, model: str,
              wait_s: float = IC.CONNECT_WAIT_S) -> tuple[str, ...]:
    """... on a receiver: the stream from ``src`` unpacked (untar_cmd) and passed on to ``to``."""
    return (ip, str(port), ",".join(to), f"{wait_s:g}", "--from", src, "--sink-json", json.dumps(untar_cmd(model)))


def _read_error(relayed: dict) -> str | None:
    """The relaying script's error about its own read (not about passing the stream on)."""
    err = relayed.get("error")
    return err if isinstance(err, str) and not err.startswith("the sink") else None


def stream_argv(container: str, mode: str, model: str, script: str, *args: str,
                interactive: bool = False) -> tuple[str, ...]:
    """checks/model_stream.py MODE MODEL [ARGS] in the cluster container (receive reads the stream on stdin)."""
    return DK.exec_argv(container, "python3", "-c", script, mode, model, *args, interactive=interactive)


def sync_model(sess: Session, model: str, targets: Sequence[Host],
               manifests: Mapping[str, Mapping[str, int]] | None = None,
               fanout: int = IC.MODEL_FANOUT) -> dict[str, str]:
    """Copy ``model`` from the head's container to each target's; return where each target got it
    from (a peer's name, or "this machine" for the relayed fallback). Raises GroupError naming the
    targets that got it neither way. With every host's ``manifests`` (serve's model-files stage), a
    copy carries only the files its receivers lack or hold at another size, and each receiver then
    removes the files the head does not have; without them the whole directory replaces theirs."""
    inv = sess.inv
    head = manifests.get(inv.head.name) if manifests else None

    def files_for(to: Sequence[Host]) -> Sequence[str] | None:
        if head is None or any(x.name not in manifests for x in to):
            return None
        return MF.sync_files(head, [manifests[x.name] for x in to])

    def stale_for(h: Host) -> Sequence[str] | None:
        return MF.stale_files(head, manifests[h.name]) if head is not None and h.name in manifests else None

    name = inv.cluster.container_name
    port = inv.cluster.ports.image_copy
    seed_py = check_script("image_seed.py").decode()
    stream_py = check_script("model_stream.py").decode()

    files = files_for(targets)  # every node passes on the same stream: what any of them lacks

    def send(h: Host, to: Sequence[Host]) -> dict | str:
        node = N.of(sess, h, name)
        r = node.run_in("python3", "-c", seed_py, *send_args(h.ip, port, [x.ip for x in to], model, files),
                        check=False, hangup=True, timeout=_copy_timeout(node),
                        display=f"tar -C {model} -c | image_seed.py {h.ip}:{port}")
        return last_json(r.stdout) or (r.stderr or r.stdout).strip()[-300:]

    def receive(h: Host, src: Host, to: Sequence[Host], sent) -> str:
        node = N.of(sess, h, name)
        t0 = time.monotonic()
        r = node.run_in("python3", "-c", seed_py, *pass_args(h.ip, port, [x.ip for x in to], src.ip, model),
                        check=False, hangup=True, timeout=_copy_timeout(node),
                        display=f"model stream from {src.name} into {model}"
                                + (f", passed on to {', '.join(x.name for x in to)}" if to else ""))
        relayed = last_json(r.stdout) or {}
        sink = relayed.get("sink") if isinstance(relayed.get("sink"), dict) else {}
        # what this node unpacked is what it read: the script's own digest of the stream
        got = {**sink, "ok": bool(sink.get("ok")) and not _read_error(relayed), "sha256": relayed.get("sha256"),
               "bytes": relayed.get("bytes"), "error": sink.get("error") or _read_error(relayed)}
        out = sent()
        if r.exit_code == IC.NO_SENDER:
            _discard(sess, h, model, stream_py)
            raise PreflightFailed(h.name, f"cannot reach {src.name} ({PL.hostport(src.ip, port)}) over the data "
                                          "network for the model copy")
        if isinstance(out, dict) and out.get("error"):  # the head's tar failed: what it sent is not the model
            _discard(sess, h, model, stream_py)
            raise PreflightFailed(h.name, f"the model stream from {inv.head.name} is incomplete: {out['error']}")
        want = out.get("sha256") if isinstance(out, dict) else None
        _check_and_commit(sess, h, model, stream_py, got, want, src.name,
                          relayed.get("error") or r.stderr or r.stdout, stale_for(h))
        return f"from {src.name} in {time.monotonic() - t0:.1f}s ({IC.human_bytes(got.get('bytes') or 0)})"

    got_from: dict[str, str] = {}
    failed = peers.copy_in_tree(sess, inv.head, targets, stage="copy-model", send=send, receive=receive,
                                got_from=got_from, fanout=fanout)
    if failed:
        for h, why in failed.items():
            sess.reporter.event(h.name, "copy-model", "warning", f"{why}; relaying it through this machine instead")
        sess.stage("relay-model", list(failed),
                   lambda h: relay(sess, model, h, stream_py, files_for([h]), stale_for(h)))
        got_from.update({h.name: "this machine" for h in failed})
    return got_from


def _copy_timeout(node: N.Node) -> float:
    """A copy's time limit on the node: COPY_TIMEOUT_S, or the inventory's command_timeout if longer."""
    return max(COPY_TIMEOUT_S, node.ssh.settings.command_timeout)


def relay(sess: Session, model: str, h: Host, stream_py: str, files: Sequence[str] | None = None,
          stale: Sequence[str] | None = None) -> str:
    """The fallback: the head's tar stream through this machine into the node, checked the same way
    (this machine takes the digest of what it passes on)."""
    name = sess.inv.cluster.container_name
    head = sess.inv.head
    digest = hashlib.sha256()

    def hashed(chunks: Iterable[bytes]) -> Iterable[bytes]:
        for c in chunks:
            digest.update(c)
            yield c

    chunks = sess.ssh[head.name].stream_out(tar_argv(name, model, files))
    r = sess.ssh[h.name].run_with_input(stream_argv(name, "receive", model, stream_py, interactive=True),
                                        hashed(chunks), timeout=COPY_TIMEOUT_S, check=False)
    _check_and_commit(sess, h, model, stream_py, last_json(r.stdout) or {}, digest.hexdigest(), head.name,
                      r.stderr or r.stdout, stale)
    return f"from {head.name} through this machine"


def _check_and_commit(sess: Session, h: Host, model: str, stream_py: str, got: dict, want: str | None,
                      src: str, output: str, stale: Sequence[str] | None = None) -> None:
    """Put the received tree in place when its digest is the sender's; else discard it and raise.
    ``stale`` None: the tree replaces the directory's contents (commit); else it replaces the files
    it holds and the stale ones are removed (merge)."""
    if not got.get("ok"):
        _discard(sess, h, model, stream_py)
        why = got.get("error") or (output.strip().splitlines() or ["no answer"])[-1][:300]
        raise PreflightFailed(h.name, f"the model stream from {src} could not be unpacked: {why}")
    if not want or got.get("sha256") != want:
        _discard(sess, h, model, stream_py)
        sent = (want or "")[:16] or "what was sent"
        raise PreflightFailed(h.name, f"the model stream from {src} arrived as {str(got.get('sha256'))[:16]} "
                                      f"({got.get('bytes')} bytes), not {sent}: refused")
    put = ("commit",) if stale is None else ("merge", *stale)
    node = N.of(sess, h)
    r = node.run(stream_argv(node.container, put[0], model, stream_py, *put[1:]), timeout=600, check=False)
    done = last_json(r.stdout) or {}
    if not done.get("ok"):
        raise BootstrapError(f"{h.name}: could not put the received model in place under {model}: "
                             f"{done.get('error') or (r.stderr or r.stdout).strip()[-300:]}")


def _discard(sess: Session, h: Host, model: str, stream_py: str) -> None:
    """Drop a refused copy. Not checked: every caller raises the refusal right after, and what a failed
    discard leaves (.bootstrap-incoming) is outside the model (manifest_cmd prunes it) and replaced by
    the next copy."""
    node = N.of(sess, h)
    node.run(stream_argv(node.container, "discard", model, stream_py), timeout=600, check=False)
