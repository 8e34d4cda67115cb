"""The fleet's whole life in the library (issue 26.3): up, status and down of an inventory with
replicas go through bootstrap.fleet.lifecycle, from the CLI and from Python alike, and cluster/run.py
refuses such an inventory instead of leaving the router, keepers and serve containers behind.
Fake hosts and monkeypatched calls: no socket is opened."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.cluster import run as A
from bootstrap.errors import ExitStatus, GroupError, HostUnreachable, Interrupted, LockBusy, UsageError
from bootstrap.fleet import lifecycle as FLC
from bootstrap.fleet import names as FN
from bootstrap.fleet import status as FS
from bootstrap.remote.session import Session, Timings
from tests.support.fake_hosts import GUARD_ANSWERS, FakeHost, fake_session
from tests.support.fleet_inventories import ENVIRON, fleet_yaml, hosts_yaml, load, write

RUNNING = (0, (Path(__file__).resolve().parents[1] / "data" / "docker_container_inspect.json").read_text(), "")
ABSENT = (1, "[]", "Error: No such container: x")


@pytest.fixture
def fleet(tmp_path):
    return load(tmp_path, fleet_yaml(4, 2))


# -- cluster/run.py refuses a fleet; the fleet functions refuse one replica ------------------------


@pytest.mark.parametrize("call, fleet_fn, command", [
    (lambda inv: A.up(inv), "up_fleet", "up"),
    (lambda inv: A.down(inv), "down_fleet", "down"),
    (lambda inv: A.cluster_status(inv), "fleet_status", "status"),
])
def test_cluster_run_refuses_a_fleet_and_names_what_to_call(fleet, no_hosts, call, fleet_fn, command):
    with pytest.raises(UsageError) as ei:
        call(fleet)
    msg = str(ei.value)
    assert "cluster.replicas: 2" in msg and f"bootstrap.fleet.lifecycle.{fleet_fn}" in msg
    assert f"`bootstrap {command}`" in msg and "router" in msg and "keepers" in msg
    assert ei.value.exit_status == ExitStatus.BAD_INPUT


@pytest.mark.parametrize("call, single", [
    (lambda inv: FLC.up_fleet(inv), "up"),
    (lambda inv: FLC.down_fleet(inv), "down"),
    (lambda inv: FLC.fleet_status(inv), "cluster_status"),
])
def test_the_fleet_functions_refuse_one_replica_and_name_the_cluster_ones(tmp_path, no_hosts, call, single):
    inv = load(tmp_path, "cluster: {accelerator: none}\n" + hosts_yaml(2))
    with pytest.raises(UsageError) as ei:
        call(inv)
    assert f"bootstrap.cluster.run.{single}" in str(ei.value)


def test_the_fleet_containers_follow_the_container_name_keeper_first(tmp_path):
    inv = load(tmp_path, fleet_yaml(4, 2, cluster="container_name: llm"))
    assert FLC.fleet_containers(inv) == ("llm-keeper", "llm-vip", "llm-router", "llm-serve", "llm-serve-standby",
                                         "llm-serve-spent", "llm-serve-old", "llm-serve-standby-old")
    assert FLC.fleet_containers(inv) == (FN.keeper_name(inv), FN.vip_name(inv), FN.router_name(inv),
                                         FN.serve_name(inv), FN.standby_name(inv), FN.spent_name(inv),
                                         FN.old_name(inv), FN.standby_old_name(inv))


# -- down -----------------------------------------------------------------------------------------


class _Held:
    def release(self) -> None:
        pass


class LockingHost(FakeHost):
    """A fake host that also takes the cluster lock (cluster.run.down takes it on each group's head)."""

    def __init__(self, name, answers=(), *, busy: bool = False, **kw):
        super().__init__(name, answers, **kw)
        self.busy = busy

    def acquire_lock(self, path, holder, *, wait=0.0, on_wait=None):
        self.connect()
        if self.busy:
            raise LockBusy(self.name, path, "someone pid 1 `bootstrap up`", wait)
        self.commands.append(f"lock {path}")
        return _Held()


def _docker_host(inv, name, *, serving=True, node=True, **kw) -> LockingHost:
    """A host where Docker has (serving: ) the keeper and serve containers, and (node: ) the node
    container; `docker rm -f` prints each container it removed, as Docker does."""
    keeper, vip, router, serve, *rest = FLC.fleet_containers(inv)
    cname = inv.cluster.container_name
    return LockingHost(name, [
        (f"docker rm -f {keeper}",
         (0, f"{keeper}\n", "") if serving else (0, "", f"Error: No such container: {keeper}")),
        (f"docker rm -f {vip} {router} {serve} {' '.join(rest)}",
         (0, f"{serve}\n", f"Error: No such container: {vip}\nError: No such container: {router}\n"
                          + "\n".join(f"Error: No such container: {c}" for c in rest)) if serving
         else (0, "", "Error: No such container: x")),
        (f"container inspect {cname}", RUNNING if node else ABSENT),
        (f"docker rm -f {cname}", (0, f"{cname}\n", "")),
        (f"docker volume rm -f {cname}-compile-cache", (0, f"{cname}-compile-cache\n", "")),
        *GUARD_ANSWERS,
    ], **kw)


def _fake_sessions(monkeypatch, hosts: dict[str, FakeHost]) -> None:
    """Every Session the fleet and the cluster open gets the fakes of its own hosts."""
    def make(inv, **kw):
        return fake_session(inv, {h.name: hosts[h.name] for h in inv.hosts}, **kw)
    monkeypatch.setattr(FLC, "Session", make)
    monkeypatch.setattr(A, "Session", make)


def test_down_removes_the_keepers_then_router_and_serve_then_each_groups_node_containers(fleet, monkeypatch):
    hosts = {n: _docker_host(fleet, n) for n in ("h0", "h1", "h2", "h3")}
    _fake_sessions(monkeypatch, hosts)
    res = FLC.down_fleet(fleet)
    keeper, vip, router, serve, *rest = FLC.fleet_containers(fleet)
    assert res.fleet_removed == {n: (keeper, serve) for n in hosts}
    assert [set(g.removed) for g in res.replicas] == [{"h0", "h1"}, {"h2", "h3"}]
    assert [g.absent for g in res.replicas] == [(), ()]
    for name, h in hosts.items():
        rms = [c for c in h.commands if c.startswith("docker rm -f")]
        assert rms == [f"docker rm -f {keeper}", f"docker rm -f {vip} {router} {serve} {' '.join(rest)}",
                       "docker rm -f bootstrap-vllm"], (name, h.commands)
        # the compile caches' volume once no container mounts it, then the fence and Ray's token
        # (and the mark `drain HOST` leaves: down removes everything of the cluster)
        vol = h.commands.index("docker volume rm -f bootstrap-vllm-compile-cache bootstrap-vllm-drained")
        assert vol > h.commands.index("docker rm -f bootstrap-vllm"), (name, h.commands)
        after = h.commands[vol + 1:]
        if name in ("h0", "h2"):  # a group's head: first a registry mirror a cold `up` may have left there
            assert after[0].startswith("sh -c 'docker rm -f bootstrap-image-mirror"), (name, after)
            after = after[1:]
        assert [c.split()[:2] for c in after] == [["sh", "-c"], ["nft", "-f"], ["sh", "-c"], ["sh", "-c"]]
        assert "ray-auth-token" in h.commands[-2] and "/run/bootstrap/vllm" in h.commands[-1], (name, h.commands)
    # each group's cluster is torn down under its own head's lock, the head after its worker
    assert [c for c in hosts["h0"].commands if c.startswith("lock")] == ["lock /tmp/bootstrap-vllm.lock"]
    assert [c for c in hosts["h2"].commands if c.startswith("lock")] == ["lock /tmp/bootstrap-vllm.lock"]
    assert not [c for c in hosts["h1"].commands + hosts["h3"].commands if c.startswith("lock")]
    assert res.replicas[0].removed == ("h1", "h0") and res.replicas[1].removed == ("h3", "h2")


def test_a_second_down_is_a_no_op(fleet, monkeypatch):
    hosts = {n: _docker_host(fleet, n, serving=False, node=False) for n in ("h0", "h1", "h2", "h3")}
    _fake_sessions(monkeypatch, hosts)
    res = FLC.down_fleet(fleet)
    assert res.fleet_removed == {n: () for n in hosts}
    assert [set(g.absent) for g in res.replicas] == [{"h0", "h1"}, {"h2", "h3"}]
    assert [g.removed for g in res.replicas] == [(), ()]


def test_down_tears_down_every_other_host_when_one_is_unreachable(fleet, monkeypatch):
    gone = HostUnreachable("h3", "timed out")
    hosts = {n: _docker_host(fleet, n) for n in ("h0", "h1", "h2")}
    hosts["h3"] = LockingHost("h3", unreachable=gone)
    _fake_sessions(monkeypatch, hosts)
    with pytest.raises(GroupError) as ei:
        FLC.down_fleet(fleet)
    assert set(ei.value.failures) == {"h3"} and set(ei.value.results) == {"h0", "h1", "h2", "h3"}
    assert "h3: cannot connect over SSH: timed out" in str(ei.value)
    for n in ("h0", "h1", "h2"):  # the fleet's containers and the node container are gone there
        assert "docker rm -f bootstrap-vllm" in hosts[n].commands, (n, hosts[n].commands)
        assert "docker rm -f bootstrap-vllm-keeper" in hosts[n].commands


def test_down_goes_on_with_the_other_groups_when_a_groups_lock_is_held(fleet, monkeypatch):
    hosts = {n: _docker_host(fleet, n, busy=(n == "h0")) for n in ("h0", "h1", "h2", "h3")}
    _fake_sessions(monkeypatch, hosts)
    with pytest.raises(LockBusy) as ei:  # the one error, with its own exit status
        FLC.down_fleet(fleet)
    assert ei.value.exit_status == ExitStatus.LOCKED and ei.value.host == "h0"
    assert "docker rm -f bootstrap-vllm" not in hosts["h1"].commands  # replica 0 left to the run that holds it
    for n in ("h2", "h3"):
        assert "docker rm -f bootstrap-vllm" in hosts[n].commands, n
    for n in hosts:  # the fleet's own containers are gone everywhere
        assert "docker rm -f bootstrap-vllm-keeper" in hosts[n].commands, n


def test_down_says_which_host_could_not_remove_the_fleet_containers(fleet, monkeypatch):
    hosts = {n: _docker_host(fleet, n) for n in ("h0", "h1", "h2", "h3")}
    denied = (1, "", "permission denied while trying to connect to the Docker daemon socket")
    hosts["h1"].answers.insert(0, ("docker rm -f bootstrap-vllm-vip bootstrap-vllm-router", denied))
    _fake_sessions(monkeypatch, hosts)
    with pytest.raises(GroupError) as ei:
        FLC.down_fleet(fleet)
    assert set(ei.value.failures) == {"h1"} and "permission denied" in str(ei.value)
    assert all("docker rm -f bootstrap-vllm" in hosts[n].commands for n in hosts)  # the groups still went down


# -- up and status --------------------------------------------------------------------------------


def _up_result(inv):
    return A.UpResult((), None, Timings(), changed=False, runtime="none")


def test_up_brings_every_group_up_at_once_with_the_same_options(fleet, monkeypatch):
    calls, seen = [], []
    both = threading.Barrier(2, timeout=10)  # broken (an error) unless both groups are in stage_up together

    def up_in(sess, **kw):
        calls.append(([h.name for h in sess.inv.hosts], sess.inv.cluster.replicas, sess.parallel, kw))
        both.wait()
        return _up_result(sess.inv)
    monkeypatch.setattr(A, "stage_up", up_in)
    out = FLC.up_fleet(fleet, parallel=3, pull=True, wait=42.0, lock_wait=5.0, allow_partial=True,
                       on_replica=lambda k, g: seen.append(("start", k, g.head.name)),
                       on_done=lambda r: seen.append(("done", r.index, r.inv.head.name)))
    assert sorted(c[0] for c in calls) == [["h0", "h1"], ["h2", "h3"]] and {c[1] for c in calls} == {1}
    kw = calls[1][3]
    assert (calls[1][2], kw["pull"], kw["wait"], kw["lock_wait"], kw["allow_partial"], kw["dry_run"]) == \
        (3, True, 42.0, 5.0, True, False)
    # every group announced before any starts; each reported as it is done
    assert seen[:2] == [("start", 0, "h0"), ("start", 1, "h2")]
    assert sorted(seen[2:]) == [("done", 0, "h0"), ("done", 1, "h2")]
    assert [r.index for r in out] == [0, 1] and all(r.seconds >= 0 for r in out)


def test_a_group_that_fails_does_not_stop_the_others_and_its_error_is_raised_after(fleet, monkeypatch):
    calls, done = [], []

    def up_in(sess, **kw):
        calls.append(sess.inv.head.name)
        if sess.inv.head.name == "h0":
            raise GroupError("preflight", {"h0": HostUnreachable("h0", "timed out"), "h1": None})
        return _up_result(sess.inv)
    monkeypatch.setattr(A, "stage_up", up_in)
    with pytest.raises(GroupError) as ei:
        FLC.up_fleet(fleet, on_done=lambda r: done.append(r.index))
    assert sorted(calls) == ["h0", "h2"] and done == [1]
    assert set(ei.value.failures) == {"h0"}


def test_groups_failing_in_one_stage_are_one_error_naming_every_host(fleet, monkeypatch):
    def up_in(sess, **kw):
        head = sess.inv.head.name
        raise GroupError("preflight", {head: HostUnreachable(head, "timed out")})
    monkeypatch.setattr(A, "stage_up", up_in)
    with pytest.raises(GroupError) as ei:
        FLC.up_fleet(fleet)
    assert set(ei.value.failures) == {"h0", "h2"} and "h0, h2" in str(ei.value)


@pytest.mark.parametrize("answer", ["yes", "no"])
def test_a_fleet_is_asked_once_for_every_group_before_any_group_changes_a_host(fleet, monkeypatch, answer):
    """Issue 68.2: every group staged (read, checked, planned), then one question naming every group's
    containers that would stop, then each group applied; refused, no group is applied."""
    from bootstrap.cluster.plan import HostAction
    from bootstrap.errors import Declined

    events = []

    def stage_up(sess, **kw):
        head = sess.inv.head.name
        events.append(("staged", head))
        stop = (HostAction(head, "recreate", "the image changed", None),)
        return A.Staged({}, stop, stop, None, None, {}, 1.0, {}, sess.inv)

    def apply_up(sess, staged):
        events.append(("applied", sess.inv.head.name))
        return _up_result(sess.inv)

    def approve(inv, actions):
        events.append(("asked", tuple(a.host for a in actions)))
        if answer == "no":
            raise Declined("not confirmed: nothing was changed")
    monkeypatch.setattr(A, "stage_up", stage_up)
    monkeypatch.setattr(A, "apply_up", apply_up)
    if answer == "no":
        with pytest.raises(Declined):
            FLC.up_fleet(fleet, approve=approve)
        assert sorted(events) == [("asked", ("h0", "h2")), ("staged", "h0"), ("staged", "h2")]
        assert events[-1] == ("asked", ("h0", "h2"))
    else:
        out = FLC.up_fleet(fleet, approve=approve)
        assert [r.index for r in out] == [0, 1]
        assert events.index(("asked", ("h0", "h2"))) == 2 and sorted(events[3:]) == [("applied", "h0"),
                                                                                   ("applied", "h2")]


def test_an_interrupt_stops_every_group_and_reports_every_host(fleet, monkeypatch):
    asked = []

    def up_in(sess, **kw):
        return _up_result(sess.inv)

    def interrupted(sess, command):
        asked.append((sess.inv.head.name, command))
        return Interrupted(command, "start-head", {h.name: "not started" for h in sess.inv.hosts})

    def on_done(rep):
        raise KeyboardInterrupt  # Ctrl-C while the first group to finish is shown
    monkeypatch.setattr(A, "stage_up", up_in)
    monkeypatch.setattr(A, "interrupted", interrupted)
    with pytest.raises(Interrupted) as ei:
        FLC.up_fleet(fleet, on_done=on_done)
    assert sorted(asked) == [("h0", "up"), ("h2", "up")]
    assert sorted(ei.value.states) == ["h0", "h1", "h2", "h3"] and ei.value.stage == "start-head"


def test_status_reads_each_group_then_the_fleet(fleet, monkeypatch):
    from bootstrap.cluster.run import ClusterStatus, NodeStatus

    asked = []

    def cluster_status(inv, **kw):
        asked.append(([h.name for h in inv.hosts], sorted(kw)))
        return ClusterStatus([NodeStatus(h.name, h.ip, h.role, True, "running", True, 0.0) for h in inv.hosts],
                             None, None, "none")
    replica = FS.ReplicaState(0, ["h0", "h1"], "http://10.0.0.1:8000", {}, 0, None, "healthy", True)
    state = FS.FleetState("http://10.0.0.1:30000/v1", "h0", "running", [], [replica])
    monkeypatch.setattr(A, "cluster_status", cluster_status)
    monkeypatch.setattr(FS, "status", lambda inv, **kw: state)
    st = FLC.fleet_status(fleet, parallel=2)
    assert [a[0] for a in asked] == [["h0", "h1"], ["h2", "h3"]]
    assert all("serving" not in a[1] for a in asked)  # the fleet serves through its own containers
    assert st.fleet is state and st.ok
    replica.health = "starting"
    assert not st.ok


# -- the CLI calls the library and prints what it printed before ----------------------------------


def invoke(*args):
    return CliRunner().invoke(main, list(args), env=ENVIRON)


def test_cli_down_on_a_fleet_calls_down_fleet_and_prints_each_group(tmp_path, monkeypatch, no_hosts):
    path = write(tmp_path, fleet_yaml(4, 2))
    got = []

    def down_fleet(inv, **kw):
        got.append((inv.cluster.replicas, sorted(kw)))
        return FLC.FleetDownResult({}, (A.DownResult(("h1", "h0"), ()), A.DownResult((), ("h3", "h2"))))
    monkeypatch.setattr(FLC, "down_fleet", down_fleet)
    r = invoke("down", "-i", str(path), "--yes")
    assert r.exit_code == 0, r.output
    assert got == [(2, ["drain", "lock_wait", "parallel", "reporter"])]
    assert r.stdout.splitlines() == ["removed the serve containers, the router and the keepers of 2 replicas",
                                     "removed the container on 2 host(s): h1, h0",
                                     "nothing to remove on 2 host(s): h3, h2"]


def test_cli_up_on_a_fleet_names_each_replica_and_prints_its_table(tmp_path, monkeypatch, no_hosts):
    path = write(tmp_path, fleet_yaml(4, 2))
    monkeypatch.setattr(A, "stage_up", lambda sess, **kw: _up_result(sess.inv))
    r = invoke("up", "-i", str(path))
    assert r.exit_code == 0, r.output
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("replica ")] == ["replica 0: h0, h1",
                                                                                 "replica 1: h2, h3"]
    assert "cluster vllm replica 0" in r.stdout and "cluster vllm replica 1" in r.stdout
    assert "head 10.0.0.1" in r.stdout and "head 10.0.0.3" in r.stdout  # each group's own head
    r = invoke("up", "-i", str(path), "--json")
    assert r.exit_code == 0, r.output
    docs, text, dec = [], r.stdout.strip(), json.JSONDecoder()
    while text:  # one document per replica, as before
        doc, end = dec.raw_decode(text)
        docs.append(doc)
        text = text[end:].strip()
    assert [d["changed"] for d in docs] == [False, False]


def test_cli_status_on_a_fleet_exits_1_unless_every_replica_serves(tmp_path, monkeypatch, no_hosts):
    from bootstrap.cluster.run import ClusterStatus

    path = write(tmp_path, fleet_yaml(4, 2))
    replica = FS.ReplicaState(0, ["h0", "h1"], "http://10.0.0.1:8000", {}, 0, None, "healthy", True)
    groups = [ClusterStatus([], None, None, "none")] * 2
    st = FLC.FleetStatus(groups, FS.FleetState("http://10.0.0.1:30000/v1", "h0", "running", [], [replica]))
    monkeypatch.setattr(FLC, "fleet_status", lambda inv, **kw: st)
    monkeypatch.setattr("bootstrap.monitor.run.running_url", lambda inv: None)
    r = invoke("status", "-i", str(path), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["fleet"]["replicas"][0]["health"] == "healthy"
    replica.health = "down"
    assert invoke("status", "-i", str(path), "--json").exit_code == 1


def test_a_python_caller_gets_the_same_teardown_as_the_cli(fleet, monkeypatch):
    """cluster.run.down on a fleet is refused before any host is touched; down_fleet is what the CLI runs."""
    calls = []
    monkeypatch.setattr(Session, "connect", lambda self, *a, **kw: calls.append(self.inv.cluster.replicas))
    with pytest.raises(UsageError):
        A.down(fleet)
    assert calls == []


def test_down_stops_keepalived_on_the_router_hosts_before_removing_it(tmp_path, monkeypatch):
    """SIGTERM first (it gives the floating address up and its entry removes the forwarding); a bare
    `docker rm -f` would leave both on the host."""
    inv = load(tmp_path, fleet_yaml(4, 2, cluster="router: {vip: {address: 10.0.0.100}}"))
    hosts = {n: _docker_host(inv, n) for n in ("h0", "h1", "h2", "h3")}
    _fake_sessions(monkeypatch, hosts)
    FLC.down_fleet(inv)
    for name, h in hosts.items():
        stops = [i for i, c in enumerate(h.commands) if c == "docker stop -t 10 bootstrap-vllm-vip"]
        rm = h.commands.index("docker rm -f bootstrap-vllm-vip bootstrap-vllm-router bootstrap-vllm-serve "
                              "bootstrap-vllm-serve-standby bootstrap-vllm-serve-spent bootstrap-vllm-serve-old "
                              "bootstrap-vllm-serve-standby-old")
        if name in ("h0", "h2"):  # the heads of the first two replicas: the router hosts
            assert len(stops) == 1 and stops[0] < rm, (name, h.commands)
        else:
            assert not stops, (name, h.commands)


def test_cli_status_shows_each_router_and_which_host_holds_the_address(tmp_path, monkeypatch, no_hosts):
    from bootstrap.cluster.run import ClusterStatus

    path = write(tmp_path, fleet_yaml(4, 2, cluster="router: {vip: {address: 10.0.0.100}}"))
    urls = ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    replicas = [FS.ReplicaState(k, [], u, {}, 0, None, "healthy", True) for k, u in enumerate(urls)]
    routers = [FS.RouterView("h0", "unknown (h0: no route to host)"),
               FS.RouterView("h2", "running", urls, "running", True)]
    fs = FS.FleetState("http://10.0.0.100:30000/v1", "h2", "running", urls, replicas, routers, "10.0.0.100", "h2")
    st = FLC.FleetStatus([ClusterStatus([], None, None, "none")] * 2, fs)
    monkeypatch.setattr(FLC, "fleet_status", lambda inv, **kw: st)
    monkeypatch.setattr("bootstrap.monitor.run.running_url", lambda inv: None)
    r = CliRunner().invoke(main, ["status", "-i", str(path)], env={**ENVIRON, "COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "routers: floating address 10.0.0.100" in r.stdout
    rows = {ln.split("│")[1].strip(): ln for ln in r.stdout.splitlines() if ln.startswith("│ h")}
    assert "unknown (h0: no route to host)" in rows["h0"] and "yes" in rows["h2"], r.stdout
    assert "endpoint: http://10.0.0.100:30000/v1 (floating address, held by h2)" in r.stdout
    doc = json.loads(invoke("status", "-i", str(path), "--json").stdout)["fleet"]
    assert doc["vip_holder"] == "h2" and doc["routers"][0]["state"].startswith("unknown")
    fs.vip_holder = None  # nobody holds it: said, not hidden, and status exits 1
    r = CliRunner().invoke(main, ["status", "-i", str(path)], env={**ENVIRON, "COLUMNS": "200"})
    assert "held by no router host" in r.stdout and r.exit_code == 1


def test_status_gives_each_replicas_engine_means_since_it_started():
    lat = {"ttft_sum": 3.0, "ttft_count": 6.0, "itl_sum": 0.5, "itl_count": 50.0, "queue_sum": 0.012,
           "queue_count": 6.0, "prefix_queries": 400.0, "prefix_hits": 100.0}
    r = FS.ReplicaState(0, ["h0"], "http://10.0.0.1:8000", {}, 0, None, "healthy", True, latency=lat)
    m = r.to_dict()["means"]
    assert m == pytest.approx({"ttft_ms": 500.0, "itl_ms": 10.0, "queue_ms": 2.0, "prefix_hit_pct": 25.0})
    none = FS.ReplicaState(1, ["h2"], "u", {}, 0, None, "starting", None).to_dict()["means"]
    assert none == {"ttft_ms": None, "itl_ms": None, "queue_ms": None, "prefix_hit_pct": None}


def test_down_of_a_pool_removes_its_idle_hosts_node_containers_too(tmp_path, monkeypatch):
    """A pool's host that no model takes now (a model removed from models:) still has what `up` put
    there when a model used it: down tears it down as a group of its own, after the replicas."""
    from tests.fleet.test_pool import pool_yaml
    pool = load(tmp_path, pool_yaml(5))
    assert [h.name for h in pool.idle] == ["h4"]
    hosts = {n: _docker_host(pool, n) for n in ("h0", "h1", "h2", "h3", "h4")}
    _fake_sessions(monkeypatch, hosts)
    res = FLC.down_fleet(pool)
    assert [g.removed for g in res.replicas] == [("h0",), ("h1",), ("h3", "h2"), ("h4",)]
    assert "docker rm -f bootstrap-vllm" in hosts["h4"].commands
    assert [c for c in hosts["h4"].commands if c.startswith("lock")] == ["lock /tmp/bootstrap-vllm.lock"]


def test_cli_up_names_the_running_containers_it_would_recreate_and_asks(tmp_path, monkeypatch, no_hosts):
    """Issue 51.1: up names each running container it would stop and recreate and asks; with no
    terminal and no --yes it is refused (exit 2) before any is stopped; --yes goes on. A fleet's groups,
    staged at once, are asked about in one question before any group changes a host (issue 68.2; on
    c7795f8 each group asked on its own, after the others had gone on)."""
    from bootstrap.cluster.plan import HostAction

    path = write(tmp_path, fleet_yaml(4, 2))
    went_on = []

    def stage_up(sess, **kw):
        stop = (HostAction(sess.inv.hosts[1].name, "recreate", "spec changed", None),)
        return A.Staged({}, stop, stop, None, None, {}, 1.0, {}, sess.inv)

    def apply_up(sess, staged):
        went_on.append(sess.inv.hosts[1].name)  # only after the question was answered
        return _up_result(sess.inv)
    monkeypatch.setattr(A, "stage_up", stage_up)
    monkeypatch.setattr(A, "apply_up", apply_up)
    r = invoke("up", "-i", str(path))
    assert r.exit_code == 2 and went_on == [], r.output
    assert "recreate: h1 (spec changed): its running container is stopped" in r.stderr
    assert "recreate: h3 (spec changed): its running container is stopped" in r.stderr
    assert f"up stops and recreates 2 running containers of the cluster 'vllm' (h1, h3; head h0); inventory {path}" \
        in r.stderr and "No terminal to ask: pass --yes to go on" in r.stderr
    r = invoke("up", "-i", str(path), "--yes")
    assert r.exit_code == 0 and sorted(went_on) == ["h1", "h3"], r.output
    assert r.stderr.count("recreate: ") == 2
