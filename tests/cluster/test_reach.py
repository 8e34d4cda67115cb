"""Node-to-node reachability (bootstrap/cluster/preflight/ports.py, checks/port_probe.py): the probe run for
real on this machine's loopback (a listener, a dialler, a port a rule would drop simulated by a
port nobody listens on), and the findings it leads to. The sandbox drops a port with iptables
between two nodes (tests/sandbox/test_sandbox_infra.py)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from bootstrap.cluster.preflight import ports as RC
from tests.support.plan_fixtures import cpu_inventory

PROBE = (Path(__file__).resolve().parents[2] / "checks" / "port_probe.py").read_text()


def probe(*args: str) -> dict:
    r = subprocess.run([sys.executable, "-", *args], input=PROBE, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _holds(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _freed(port: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _holds(port):
            return True
        time.sleep(0.2)
    return False


def test_the_listener_binds_returns_at_once_and_answers_the_probe_after_strangers_dialled_it():
    """A head restarted under live Ray workers: their raylets redial its GCS port from the peers' own
    addresses before the probe does. The listener must still answer the probe (a listener that
    closed after one connection per peer answered them and refused the probe: CI of 8f0f15b)."""
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    free = _free_port()
    t = time.monotonic()
    doc = probe("listen", "127.0.0.1", "20", str(free), str(busy.getsockname()[1]), "0")
    assert time.monotonic() - t < 10  # it did not wait for its peers
    ports = doc["ports"]
    assert ports[str(free)] == free and ports[str(busy.getsockname()[1])] == "busy"
    eph = ports["0"]
    assert isinstance(eph, int) and eph > 1024 and isinstance(doc["pid"], int)
    try:
        for _ in range(5):  # strangers first
            assert _holds(free)
        got = probe("connect", "2", f"127.0.0.1:{free}", f"127.0.0.1:{eph}", f"127.0.0.1:{busy.getsockname()[1]}")
        assert [r["ok"] for r in got["results"]] == [True, True, True]
    finally:
        os.kill(doc["pid"], signal.SIGTERM)  # what the controller does after the connect step
    assert _freed(free, 10), "the listener still holds its port after it was killed"
    busy.close()


def test_a_listener_nobody_kills_frees_its_ports_after_its_seconds():
    free = _free_port()
    doc = probe("listen", "127.0.0.1", "2", str(free))
    assert doc["ports"] == {str(free): free} and _holds(free)
    assert _freed(free, 10), "the listener outlived its seconds"


def test_a_port_nobody_answers_is_reported_refused():
    port = _free_port()
    (r,) = probe("connect", "1", f"127.0.0.1:{port}")["results"]
    assert r == {"target": f"127.0.0.1:{port}", "ok": False, "ms": r["ms"], "error": "refused"}


def test_the_head_listens_for_ray_and_vllm_every_node_on_an_ephemeral_port():
    inv = cpu_inventory(3, peer_copy=False)  # runtime ray
    plan = RC.planned_ports(inv)
    assert [p for p, _ in plan["node1"]] == [6379, 8000, 0]
    assert [p for p, _ in plan["node2"]] == [0]
    from dataclasses import replace
    native = replace(inv, cluster=replace(inv.cluster, runtime="none", peer_copy=True))
    assert [p for p, _ in RC.planned_ports(native)["node1"]] == [8000, 29600, 29599, 8476, 0]


def test_a_dropped_port_is_named_on_the_node_whose_port_it_is_with_who_could_not_reach_it():
    inv = cpu_inventory(3, peer_copy=False)
    h1, h2, h3 = inv.hosts
    bound = {"node1": {"6379": 6379, "8000": "busy", "0": 40001}, "node2": {"0": 40002}, "node3": {"0": 40003}}
    dial = RC.targets(inv.hosts, bound)
    assert dial["node2"] == [f"{h1.ip}:6379", f"{h1.ip}:8000", f"{h1.ip}:40001", f"{h3.ip}:40003"]
    ok = {n: [{"target": t, "ok": True, "error": None} for t in ts] for n, ts in dial.items()}
    assert RC.findings(inv, inv.hosts, bound, ok) == []
    # node3 cannot reach the head's GCS (dropped), node1 cannot reach node2's ephemeral port (rejected)
    bad = {n: [dict(r) for r in rs] for n, rs in ok.items()}
    for r in bad["node3"]:
        if r["target"] == f"{h1.ip}:6379":
            r.update(ok=False, error="timeout")
    for r in bad["node1"]:
        if r["target"] == f"{h2.ip}:40002":
            r.update(ok=False, error="refused")
    found = RC.findings(inv, inv.hosts, bound, bad)
    assert [(f.check, f.host) for f in found] == [("ports", "node1"), ("ports", "node2")]
    assert found[0].what == ("TCP port 6379 (Ray's GCS) is not reachable from node3 "
                             "(no answer within 2s: a firewall drops it)")
    assert "6379, 8000 and the ephemeral range" in found[0].fix
    assert "refused: a firewall rejects it" in found[1].what and "ephemeral" in found[1].what
    # where firewalld runs (guard facts), its own fix: a ufw or iptables rule does not override its zone's
    # reject (what `firewall-cmd` prints as that fix was run on a sandbox node: test_sandbox_serve)
    fw = RC.findings(inv, inv.hosts, bound, bad, frozenset({"node2"}))
    assert fw[0].fix == found[0].fix and "ufw allow" not in fw[1].fix
    assert fw[1].fix.startswith("firewalld runs on node2") and (
        f"`sudo firewall-cmd --permanent --zone=trusted --add-source={h1.ip} --add-source={h3.ip} && sudo "
        "firewall-cmd --reload`") in fw[1].fix, fw[1].fix


def test_a_port_that_cannot_be_bound_for_another_reason_is_a_finding():
    inv = cpu_inventory(2)
    (f,) = RC.findings(inv, inv.hosts, {"node1": {"6379": "error: [Errno 99] Cannot assign requested address"}},
                       {})
    assert f.host == "node1" and "cannot listen on port 6379" in f.what


def test_the_listener_echoes_datagrams_of_any_size_and_a_datagram_nobody_answers_is_not_ok():
    """The payload probe for real on loopback: the listener's UDP port echoes a small datagram and one of
    a 9000-byte MTU (DF set); a UDP port nobody listens on answers nothing the probe counts."""
    doc = probe("listen", "127.0.0.1", "10")
    assert doc["ports"] == {} and isinstance(doc["udp"], int) and isinstance(doc["pid"], int)
    try:
        nobody = _free_port()
        got = probe("connect", "1", f"udp/64/127.0.0.1:{doc['udp']}", f"udp/8972/127.0.0.1:{doc['udp']}",
                    f"udp/64/127.0.0.1:{nobody}")["results"]
    finally:
        os.kill(doc["pid"], signal.SIGTERM)
    assert [(r["target"].split("/")[1], r["ok"]) for r in got] == [("64", True), ("8972", True), ("64", False)], got
    assert got[2]["error"] and got[2]["error"] != "None"


def test_a_full_size_datagram_lost_where_a_small_one_arrives_is_named_on_the_receiver_with_its_senders():
    import dataclasses

    from bootstrap.cluster.facts import HostFacts, Link, RackFacts
    inv = cpu_inventory(3, peer_copy=False)
    h1, h2, h3 = inv.hosts
    facts = {h.name: HostFacts("26.1.5", rack=RackFacts(links=(Link("eth0", True, 9000), Link("lo", True, 65536)),
                                                         addrs=(("eth0", h.ip),))) for h in inv.hosts}
    facts["node3"] = dataclasses.replace(facts["node3"], rack=RackFacts(links=(Link("eth0", True, 1500),),
                                                                        addrs=(("eth0", h3.ip),)))
    mtus = RC.data_mtus(inv.hosts, facts)
    assert mtus == {"node1": 9000, "node2": 9000, "node3": 1500}
    udp = {"node1": 50001, "node2": 50002, "node3": 50003}
    dial = RC.payload_targets(inv.hosts, udp, mtus)
    # the smaller MTU of each pair (a node at 1500 is the mtu check's finding, not a lost frame)
    assert dial["node1"] == [f"udp/64/{h2.ip}:50002", f"udp/8972/{h2.ip}:50002", f"udp/64/{h3.ip}:50003",
                             f"udp/1472/{h3.ip}:50003"]
    assert RC.payload_targets(inv.hosts, {"node1": 50001}, {})["node2"] == [f"udp/64/{h1.ip}:50001"]
    ok = {n: [{"target": t, "ok": True} for t in ts] for n, ts in dial.items()}
    assert RC.payload_findings(inv.hosts, ok) == []
    # the path into node2 drops 9000-byte frames (from node1); from node3 at 1500 they arrive
    bad = {n: [dict(r, ok=not (n == "node1" and r["target"].startswith("udp/8972/"))) for r in rs]
           for n, rs in ok.items()}
    (f,) = RC.payload_findings(inv.hosts, bad)
    assert (f.check, f.host) == ("mtu-path", "node2"), f
    assert f.what.startswith("a 9000-byte packet (the data-plane MTU) from node1 never arrives while a small one does")
    assert "MTU of at least 9000" in f.fix and "ip link set DEV mtu 1500" in f.fix
    # neither arrives: UDP dropped (a firewall), not a frame size: the ports check's business, not this one's
    none = {n: [dict(r, ok=False) for r in rs] for n, rs in ok.items()}
    assert RC.payload_findings(inv.hosts, none) == []
