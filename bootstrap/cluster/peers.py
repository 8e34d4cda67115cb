"""Node-to-node copies in rounds (who sends to whom: imagecopy.copy_rounds). The controller starts
both ends of every copy over the SSH connections it has: no node-to-node trust. Used for the image
(cluster/imagedist/run.py) and for model weights (`serve --sync-model`, serve/modelsync.py); see
docs/image-distribution.md."""
from __future__ import annotations

import threading
from typing import Callable, Sequence

from bootstrap.cluster.imagedist import plan as IC
from bootstrap.errors import BootstrapError, notes_of
from bootstrap.model import Host
from bootstrap.remote.session import Session


def copy_in_rounds(sess: Session, seeds: Sequence[Host], receivers: Sequence[Host], *, stage: str,
                   send: Callable[[Host, Sequence[Host]], dict | str],
                   receive: Callable[[Host, Host, Callable[[], dict | str]], str],
                   got_from: dict[str, str], fanout: int = IC.FANOUT) -> dict[Host, str]:
    """Rounds of copies from the hosts that have the payload (``seeds``) to ``receivers``.

    ``send(sender, receivers)`` serves one stream to those receivers and returns the sender's JSON
    line (or why it failed). ``receive(receiver, sender, sent)`` takes the stream and checks it;
    ``sent()`` waits for the sender and returns what it returned (to compare digests). A receiver
    that succeeds serves in the next round and is recorded in ``got_from`` (its sender's name).
    Each sender serves up to ``fanout`` receivers at once (imagecopy.copy_rounds).
    Return the receivers that did not get it, and why (the caller falls back for those)."""
    by_name = {h.name: h for h in sess.inv.hosts}
    failed: dict[Host, str] = {}
    have = [h.name for h in seeds]
    todo = [h.name for h in receivers]
    while todo:
        transfers = IC.copy_rounds(have, todo, fanout)[0]
        sent_by = {r: t.sender for t in transfers for r in t.receivers}
        outs: dict[str, dict | str] = {}
        done = {t.sender: threading.Event() for t in transfers}

        def serve(t: IC.Transfer, outs: dict = outs, done: dict = done) -> None:
            try:
                outs[t.sender] = send(by_name[t.sender], [by_name[r] for r in t.receivers])
            except BootstrapError as exc:
                outs[t.sender] = str(exc)
            finally:
                done[t.sender].set()

        threads = [threading.Thread(target=serve, args=(t,), daemon=True) for t in transfers]
        for th in threads:
            th.start()

        def take(h: Host, sent_by: dict = sent_by, outs: dict = outs, done: dict = done) -> str:
            src = sent_by[h.name]

            def sent() -> dict | str:
                while not done[src].wait(0.2):
                    if sess.cancel.is_set():
                        raise BootstrapError(f"interrupted while {src} was sending")
                return outs.get(src, "")
            return receive(h, by_name[src], sent)

        res = sess.stage(stage, [by_name[n] for n in sent_by], take, strict=False)
        for th in threads:
            th.join()
        for t in transfers:
            out = outs.get(t.sender)
            if isinstance(out, dict) and out.get("bytes"):
                secs = max(out.get("seconds") or 0.0, 1e-3)
                sess.reporter.event(t.sender, f"seed-{stage.removeprefix('copy-')}", "done",
                                    f"{IC.human_bytes(out['bytes'])} to {', '.join(t.receivers)} in {secs:.1f}s "
                                    f"({IC.human_bytes(out['bytes'] / secs)}/s)")
        for n, v in res.failed.items():
            why = "; ".join([str(v), *notes_of(v)])  # a note: e.g. a wrong image it could not remove
            out = outs.get(sent_by[n])
            if isinstance(out, str) and out and out not in why:
                why += f" (sender: {out})"
            failed[by_name[n]] = why
        for n in res.succeeded:
            have.append(n)
            got_from[n] = sent_by[n]
        todo = [n for n in todo if n not in sent_by]
    return failed


def copy_in_tree(sess: Session, root: Host, receivers: Sequence[Host], *, stage: str,
                 send: Callable[[Host, Sequence[Host]], dict | str],
                 receive: Callable[[Host, Host, Sequence[Host], Callable[[], dict | str]], str],
                 got_from: dict[str, str], fanout: int = 1) -> dict[Host, str]:
    """One pipelined copy from ``root`` to every receiver: each node passes the stream on to its
    children (IC.tree_children: with fanout 1 a chain) while it receives it, so every link carries
    it once and at the same time. ``send(root, children)`` serves the root's stream and returns its
    JSON line (or why it failed); ``receive(node, parent, children, sent)`` takes the stream from
    parent, passes it on and checks it (``sent()`` waits for the root and returns what it returned).
    Every node of a tree runs at once, so a tree holds at most sess.parallel receivers; more go in
    further trees from the root. Return the receivers that did not get it, and why."""
    failed: dict[Host, str] = {}
    size = max(1, sess.parallel)
    for i in range(0, len(receivers), size):
        wave = list(receivers[i:i + size])
        kids = IC.tree_children(len(wave), fanout)
        nodes = [root, *wave]
        by_name = {h.name: h for h in wave}
        children = {nodes[p].name: [nodes[c] for c in cs] for p, cs in kids.items()}
        parent = {nodes[c].name: nodes[p] for p, cs in kids.items() for c in cs}
        out: dict[str, dict | str] = {}
        done = threading.Event()

        def serve(out: dict = out, done: threading.Event = done, first: list = children[root.name]) -> None:
            try:
                out["root"] = send(root, first)
            except BootstrapError as exc:
                out["root"] = str(exc)
            finally:
                done.set()

        th = threading.Thread(target=serve, daemon=True)
        th.start()

        def take(h: Host, out: dict = out, done: threading.Event = done, parent: dict = parent,
                 children: dict = children) -> str:
            def sent() -> dict | str:
                while not done.wait(0.2):
                    if sess.cancel.is_set():
                        raise BootstrapError(f"interrupted while {root.name} was sending")
                return out.get("root", "")
            return receive(h, parent[h.name], children.get(h.name, []), sent)

        res = sess.stage(stage, wave, take, strict=False)
        th.join()
        first_out = out.get("root")
        if isinstance(first_out, dict) and first_out.get("bytes"):
            secs = max(first_out.get("seconds") or 0.0, 1e-3)
            size_s = IC.human_bytes(first_out["bytes"])
            sess.reporter.event(root.name, f"seed-{stage.removeprefix('copy-')}", "done",
                                f"{size_s} to {', '.join(h.name for h in children[root.name])} in {secs:.1f}s "
                                f"({IC.human_bytes(first_out['bytes'] / secs)}/s)")
        for n, v in res.failed.items():
            why = "; ".join([str(v), *notes_of(v)])
            if isinstance(first_out, str) and first_out and first_out not in why:
                why += f" (sender: {first_out})"
            failed[by_name[n]] = why
        for n in res.succeeded:
            got_from[n] = parent[n].name
    return failed
