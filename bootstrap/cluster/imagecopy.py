"""The image crosses the registry once: nodes that have it serve it to the nodes that lack it.

Pure layer: who sends to whom, and the two commands. The controller starts both ends over SSH (no
node-to-node SSH trust): the sender runs `docker save IMAGE` into a throw-away container of the image
(checks/image_seed.py) listening on its data-plane IP for exactly the receivers' addresses; each
receiver connects with bash's /dev/tcp and pipes the stream into `docker load`. The receiver's image
ID must then equal the sender's: an image ID is the digest of the image's config, which lists the
digest of every layer, and `docker load` checks each layer against it, so equal IDs mean equal
content. See docs/image-distribution.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

#: receivers one sender serves at once (one `docker save` read, copied to each)
FANOUT = 4
#: children per node of a model directory's pipelined copy: 1, a chain (every link carries the
#: stream once, at once; measured in perf/cold_up.py --sync-only --fanouts 1,4)
MODEL_FANOUT = 1
#: how long a sender waits for its receivers to connect, and receivers keep trying
CONNECT_WAIT_S = 60.0
SEED_CONTAINER = "bootstrap-image-seed"
#: bash exit status when the receiver never reached the sender
NO_SENDER = 111


@dataclass(frozen=True)
class Transfer:
    sender: str
    receivers: tuple[str, ...]


def copy_rounds(seeds: Sequence[str], receivers: Sequence[str], fanout: int = FANOUT) -> list[list[Transfer]]:
    """Rounds of transfers: in each, every node that has the image serves up to ``fanout`` of the
    nodes that lack it, which serve in the next round (a tree: log_(fanout+1) N rounds)."""
    if not seeds and receivers:
        raise ValueError("no node has the image to send")
    have, todo, rounds = list(seeds), list(receivers), []
    while todo:
        this: list[Transfer] = []
        for s in have:
            if not todo:
                break
            got, todo = todo[:fanout], todo[fanout:]
            this.append(Transfer(s, tuple(got)))
        rounds.append(this)
        have += [r for t in this for r in t.receivers]
    return rounds


def tree_children(receivers: int, fanout: int = 1) -> dict[int, list[int]]:
    """A pipelined copy's shape over positions 0 (the root) .. ``receivers``: each position's
    children, in order (position p feeds p*fanout+1 .. p*fanout+fanout). fanout 1 is a chain."""
    if fanout < 1:
        raise ValueError("fanout must be at least 1")
    kids: dict[int, list[int]] = {}
    for c in range(1, receivers + 1):
        kids.setdefault((c - 1) // fanout, []).append(c)
    return kids


def seed_argv(image: str, bind_ip: str, port: int, peer_ips: Sequence[str], script: str,
              wait_s: float = CONNECT_WAIT_S) -> tuple[str, ...]:
    """On the sender: `docker save IMAGE` into a container of the image that serves the stream
    (checks/image_seed.py). The container has no capabilities, no writable root, runs as nobody, on
    the host network only to bind the data-plane IP."""
    run = ("docker run -i --rm --name " + SEED_CONTAINER + " --network host --cap-drop ALL "
           "--security-opt no-new-privileges --read-only --user 65534:65534 --pull never "
           '--label bootstrap.role=image-seed --entrypoint python3 "$1" -c "$2" "$3" "$4" "$5" "$6"')
    sh = f'docker rm -f {SEED_CONTAINER} >/dev/null 2>&1; docker save "$1" | {run}'
    return ("sh", "-c", sh, "sh", image, script, bind_ip, str(port), ",".join(peer_ips), f"{wait_s:g}")


def receive_argv(sender_ip: str, port: int, wait_s: float = CONNECT_WAIT_S) -> tuple[str, ...]:
    """On a receiver: connect to the sender (retrying while it starts) and pipe the stream into
    `docker load`."""
    w = max(1, round(wait_s))
    # Bounded by bash's clock (SECONDS), not a count of tries: a refused connect can take a second.
    # A connect whose SYN is dropped blocks for minutes (the kernel's SYN retries): a watchdog
    # signals the shell 2 s after the wait, which ends that connect too; it is killed (with its sleep)
    # once connected. It holds none of the shell's output: the SSH channel closes when the copy ends.
    script = (f'( trap \'kill $! 2>/dev/null; exit 0\' TERM; sleep {w + 2} & wait $!; kill $$ ) '
              f'>/dev/null 2>&1 </dev/null & dog=$!; exec 4>&2; '
              f'trap \'echo "nothing answers on $0:$1 (no reply to the connect in {w + 2}s)" >&4; '
              f'exit {NO_SENDER}\' TERM; '
              f'until exec 3<"/dev/tcp/$0/$1"; do [ "$SECONDS" -ge {w} ] && break; '
              f'sleep 0.5; done 2>/dev/null; kill "$dog" 2>/dev/null; trap - TERM; exec 4>&-; '
              f'if ! {{ true <&3; }} 2>/dev/null; then '
              f'echo "nothing listens on $0:$1" >&2; exit {NO_SENDER}; fi; docker load <&3')
    host = sender_ip.strip("[]")
    return ("bash", "-c", script, host, str(port))


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"
