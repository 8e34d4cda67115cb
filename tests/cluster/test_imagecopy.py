"""Peer image copy: who sends to whom (pure), and the two ends of a copy over real loopback sockets
(the sender is checks/image_seed.py as it runs in the container, the receiver is bash's /dev/tcp)."""
import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bootstrap.cluster.imagedist import plan as IC

SEED = Path(__file__).resolve().parents[2] / "checks" / "image_seed.py"


def test_one_seed_serves_up_to_fanout_then_everyone_who_has_it_serves():
    rounds = IC.copy_rounds(["a"], [f"n{i}" for i in range(1, 11)], fanout=2)
    assert rounds == [
        [IC.Transfer("a", ("n1", "n2"))],
        [IC.Transfer("a", ("n3", "n4")), IC.Transfer("n1", ("n5", "n6")), IC.Transfer("n2", ("n7", "n8"))],
        [IC.Transfer("a", ("n9", "n10"))],
    ]


def test_who_gets_the_image_and_who_sends_it(tmp_path):
    from tests.support.fleet_inventories import hosts_yaml, load

    inv = load(tmp_path, "cluster:\n  accelerator: none\n" + hosts_yaml(4))
    h0, h1, h2, h3 = inv.hosts
    ids = {"h0": None, "h1": "sha256:a", "h2": "sha256:b", "h3": "sha256:a"}
    assert IC.lacking(inv.hosts, ids, None, pull=False) == [h0]
    assert IC.lacking(inv.hosts, ids, None, pull=True) == list(inv.hosts)
    assert IC.lacking(inv.hosts, ids, "sha256:a", pull=False) == [h0, h2]  # streamed from here: its ID wins
    assert IC.first_of([h2, h0, h1]) is h0 and IC.first_of([h2, h1]) is h2  # the head, else the first
    assert IC.seeds_of([h1, h2, h3], ids, None) == ([h1, h3], "sha256:a")  # no head among them: h1's tag
    assert IC.seeds_of([h1, h2, h3], ids, "sha256:b") == ([h2], "sha256:b")
    assert IC.seeds_of([], ids, None) == ([], None)


def test_every_receiver_is_served_once_and_rounds_grow_as_a_tree():
    receivers = [f"n{i}" for i in range(63)]
    rounds = IC.copy_rounds(["head"], receivers)  # FANOUT 4: 1 -> 5 -> 25 -> 125
    got = [r for rnd in rounds for t in rnd for r in t.receivers]
    assert sorted(got) == sorted(receivers) and len(got) == len(set(got))
    assert len(rounds) == 3
    for i, rnd in enumerate(rounds):
        senders = [t.sender for t in rnd]
        assert len(senders) == len(set(senders))
        have = {"head"} | {r for prev in rounds[:i] for t in prev for r in t.receivers}
        assert set(senders) <= have  # only nodes that already have the image send
        assert all(len(t.receivers) <= IC.FANOUT for t in rnd)


def test_several_seeds_share_the_work_and_nothing_to_do_is_no_round():
    assert IC.copy_rounds(["a", "b"], ["c", "d"], fanout=1) == [[IC.Transfer("a", ("c",)), IC.Transfer("b", ("d",))]]
    assert IC.copy_rounds(["a"], []) == []
    with pytest.raises(ValueError):
        IC.copy_rounds([], ["a"])


def test_the_sender_container_is_least_privilege_and_bound_to_the_data_plane_ip():
    argv = IC.seed_argv("reg:5000/vllm:1", "10.0.0.1", 8476, ["10.0.0.2", "10.0.0.3"], "SCRIPT")
    assert argv[:2] == ("sh", "-c")
    sh = argv[2]
    for flag in ("--cap-drop ALL", "--read-only", "--user 65534:65534", "--security-opt no-new-privileges",
                 "--network host", "--rm", "--pull never"):
        assert flag in sh
    assert "--privileged" not in sh and "0.0.0.0" not in sh
    # values travel as arguments, never spliced into the shell text
    assert argv[4:] == ("reg:5000/vllm:1", "SCRIPT", "10.0.0.1", "8476", "10.0.0.2,10.0.0.3", "60")
    assert "reg:5000" not in sh


def _seed(peers, wait=10.0):
    return subprocess.Popen([sys.executable, str(SEED), "127.0.0.1", str(_free_port()), ",".join(peers), str(wait)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _receiver(port, sink="cat", wait=10.0):
    """receive_argv with `docker load` swapped for a sink (the sandbox test runs the real one)."""
    argv = list(IC.receive_argv("127.0.0.1", port, wait))
    assert "docker load <&3" in argv[2]
    argv[2] = argv[2].replace("docker load", sink)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _feed(proc, data):
    def go():
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except BrokenPipeError:  # a sender with no receiver stops reading
            pass
    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


def test_a_stream_reaches_the_receiver_whole_and_the_sender_reports_its_digest():
    data = bytes(range(256)) * 50_000  # 12.8 MB, several chunks
    seed = _seed(["127.0.0.1"])
    port = int(seed.args[3])
    recv = _receiver(port)
    _feed(seed, data)
    out, _ = recv.communicate(timeout=60)
    report = json.loads(seed.stdout.read())
    seed.wait(timeout=60)
    assert recv.returncode == 0 and seed.returncode == 0
    assert hashlib.sha256(out).hexdigest() == hashlib.sha256(data).hexdigest() == report["sha256"]
    assert report["bytes"] == len(data) and report["served"] == ["127.0.0.1"] and report["missing"] == []


def test_the_sender_answers_no_address_but_its_receivers_and_names_those_that_never_came():
    seed = _seed(["127.0.0.9"], wait=3.0)
    port = int(seed.args[3])
    recv = _receiver(port, wait=3.0)  # connects from 127.0.0.1, which is not on the list
    _feed(seed, b"x" * 1000)
    out, _ = recv.communicate(timeout=30)
    report = json.loads(seed.stdout.read())
    seed.wait(timeout=30)
    assert out == b""  # closed unanswered
    assert report["served"] == [] and report["missing"] == ["127.0.0.9"] and report["bytes"] == 0
    assert seed.returncode == 1


def test_a_receiver_with_no_sender_gives_up_with_its_own_exit_status():
    recv = _receiver(_free_port(), wait=1.0)
    _, err = recv.communicate(timeout=30)
    assert recv.returncode == IC.NO_SENDER
    assert b"nothing listens on 127.0.0.1:" in err


def test_human_bytes():
    assert [IC.human_bytes(n) for n in (999, 4_620_000_000, 57.9e6)] == ["999 B", "4.6 GB", "57.9 MB"]


def test_a_receiver_whose_connect_is_never_answered_gives_up_after_its_wait():
    """A sender behind a firewall that drops packets: the connect gets no answer at all (here a
    listener whose accept queue is full, so the kernel drops the SYN), which would block for minutes
    of SYN retries; the receiver gives up after its wait, with its own exit status."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    first = socket.create_connection(("127.0.0.1", port), timeout=5)  # fills the queue (never accepted)
    try:
        t0 = time.monotonic()
        recv = _receiver(port, wait=2.0)
        _, err = recv.communicate(timeout=60)
        took = time.monotonic() - t0
        assert recv.returncode == IC.NO_SENDER, err
        assert b"nothing answers on 127.0.0.1:" in err and b"no reply to the connect in 4s" in err
        assert took < 15, took  # not the kernel's ~2 minutes
    finally:
        first.close()
        srv.close()


def test_the_receiver_returns_as_soon_as_the_stream_ends_and_leaves_no_process_behind():
    """Its connect watchdog must not hold the receiver's output open (the SSH channel would stay
    open, and the copy would seem to last, until the watchdog's wait ran out)."""
    seed = _seed(["127.0.0.1"], wait=30.0)
    port = int(seed.args[3])
    t0 = time.monotonic()
    recv = _receiver(port, wait=30.0)
    _feed(seed, b"y" * 100_000)
    out, err = recv.communicate(timeout=60)
    took = time.monotonic() - t0
    seed.wait(timeout=30)
    assert recv.returncode == 0 and out == b"y" * 100_000, err
    assert took < 10, took  # not the watchdog's 32 s
    left = subprocess.run(["pgrep", "-f", "sleep 32"], capture_output=True, text=True).stdout.split()
    assert left == [], left


def test_a_pipelined_copy_is_a_chain_by_default_and_a_tree_with_a_wider_fanout():
    assert IC.tree_children(3) == {0: [1], 1: [2], 2: [3]}
    assert IC.tree_children(6, 2) == {0: [1, 2], 1: [3, 4], 2: [5, 6]}
    assert IC.tree_children(3, 4) == {0: [1, 2, 3]}  # the root serves everyone: no node passes it on
    assert IC.tree_children(0) == {}
    with pytest.raises(ValueError):
        IC.tree_children(3, 0)


def _tree_session(tmp_path, n, parallel):
    from tests.support.fake_hosts import FakeHost, fake_session
    from tests.support.fleet_inventories import hosts_yaml, load

    inv = load(tmp_path, "cluster:\n  accelerator: none\n" + hosts_yaml(n))
    return inv, fake_session(inv, {h.name: FakeHost(h.name) for h in inv.hosts}, parallel=parallel)


def test_every_node_of_a_tree_starts_at_once_with_its_parent_and_children_and_a_break_is_named(tmp_path):
    """copy_in_tree's orchestration (the ends are stand-ins): one tree per sess.parallel receivers,
    each receiver told its parent and children, all of a tree's ends running at the same time (a
    node waits for its parent and its children), a failed node returned with its reason and the
    root's answer, the others recorded with the node they got it from."""
    from bootstrap.cluster import peers

    inv, sess = _tree_session(tmp_path, 6, parallel=3)
    root, rest = inv.hosts[0], list(inv.hosts[1:])
    calls, running, most = [], set(), [0]
    lock = threading.Lock()

    def send(h, to):
        calls.append(("send", h.name, [x.name for x in to]))
        return {"bytes": 10, "sha256": "ab", "seconds": 0.1}

    def receive(h, parent, to, sent):
        with lock:
            calls.append(("recv", h.name, parent.name, [x.name for x in to]))
            running.add(h.name)
            most[0] = max(most[0], len(running))
        time.sleep(0.2)
        with lock:
            running.discard(h.name)
        assert sent()["sha256"] == "ab"
        if h.name == "h2":
            raise peers.BootstrapError("h2: the stream from h1 arrived as cd, not ab: refused")
        return "ok"

    got_from = {}
    failed = peers.copy_in_tree(sess, root, rest, stage="copy-model", send=send, receive=receive,
                                got_from=got_from, fanout=1)
    assert [c for c in calls if c[0] == "send"] == [("send", "h0", ["h1"]), ("send", "h0", ["h4"])]
    recvs = sorted(c for c in calls if c[0] == "recv")
    assert recvs == [("recv", "h1", "h0", ["h2"]), ("recv", "h2", "h1", ["h3"]), ("recv", "h3", "h2", []),
                     ("recv", "h4", "h0", ["h5"]), ("recv", "h5", "h4", [])]
    assert most[0] == 3  # the first tree's three receivers at once, never more than sess.parallel
    assert got_from == {"h1": "h0", "h3": "h2", "h4": "h0", "h5": "h4"}
    assert [h.name for h in failed] == ["h2"] and "arrived as cd" in failed[inv.hosts[2]]
