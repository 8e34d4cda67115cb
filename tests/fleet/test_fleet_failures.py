"""Fleet status and stop when a host's Docker does not answer: "unknown" or an error naming the
host, never "absent"/"not serving"/"stopped". Fake hosts: no socket is opened."""
from __future__ import annotations

import pytest

from bootstrap.errors import ConnectionLost, GroupError
from bootstrap.fleet import run as FL
from bootstrap.fleet import status as FS
from bootstrap.fleet import steps as FST
from tests.support.fake_hosts import DOCKER_DOWN, FakeHost, fake_session
from tests.support.fleet_inventories import fleet_yaml, load

ABSENT = (1, "[]", "Error: No such container")


def test_fleet_status_says_unknown_for_a_host_it_could_not_inspect(tmp_path):
    inv = load(tmp_path, fleet_yaml(4, 2))
    absent = [("container inspect", ABSENT), ("RestartCount", (1, "", "Error: No such object: x")),
              ("volume inspect", (1, "[]", "Error: No such volume: bootstrap-vllm-drained"))]
    sess = fake_session(inv, {"h0": FakeHost("h0", absent), "h1": FakeHost("h1", absent),
                              "h2": FakeHost("h2", [("docker", DOCKER_DOWN)]), "h3": FakeHost("h3", absent)})
    st = FS.fleet_state(sess)
    r0, r1 = st.replicas
    assert r0.health == "not serving" and r0.containers == {"h0": "absent", "h1": "absent"}
    assert r1.containers["h2"] == "unknown" and r1.health.startswith("unknown (h2: ")
    assert "Cannot connect to the Docker daemon" in r1.health


def test_fleet_stop_fails_naming_the_host_where_docker_does_not_answer(tmp_path, monkeypatch):
    inv = load(tmp_path, fleet_yaml(2, 2))
    monkeypatch.setattr(FL, "Session", lambda inv, **kw: fake_session(
        inv, {"h0": FakeHost("h0", [("docker rm", (0, "", ""))]), "h1": FakeHost("h1", [("docker rm", DOCKER_DOWN)])},
        **kw))
    with pytest.raises(GroupError) as ei:
        FL.stop_fleet(inv)
    assert set(ei.value.failures) == {"h1"}


def test_a_router_host_that_does_not_answer_is_shown_unknown_and_no_holder_is_made_up(tmp_path):
    inv = load(tmp_path, fleet_yaml(4, 2, cluster="router: {vip: {address: 10.0.0.100}}"))
    absent = [("container inspect", ABSENT), ("RestartCount", (1, "", "Error: No such object: x")),
              ("volume inspect", (1, "[]", "Error: No such volume: bootstrap-vllm-drained"))]
    sess = fake_session(inv, {"h0": FakeHost("h0", [("docker", DOCKER_DOWN)]), "h1": FakeHost("h1", absent),
                              "h2": FakeHost("h2", absent), "h3": FakeHost("h3", absent)})
    st = FS.fleet_state(sess)
    assert [(r.host, r.state.split(" ")[0]) for r in st.routers] == [("h0", "unknown"), ("h2", "absent")]
    assert st.routers[1].vip_state == "absent" and st.routers[1].holds_vip is None
    assert st.vip == "10.0.0.100" and st.vip_holder is None
    assert st.endpoint == "http://10.0.0.100:30000/v1"
    doc = st.to_dict()
    assert doc["vip_holder"] is None and [r["host"] for r in doc["routers"]] == ["h0", "h2"]


def test_a_rollout_step_changes_the_workers_of_every_router_each_on_its_own_url(tmp_path):
    """rollout's remove/add goes to each router host's router (its own data-plane URL, not the
    floating address); it counts as done only when every router did it."""
    inv = load(tmp_path, fleet_yaml(4, 2, cluster="router: {vip: {address: 10.0.0.100}}"))
    ok, refused = (0, '{"ok": true}\n', ""), (0, '{"ok": false, "error": "503"}\n', "")
    hosts = {n: FakeHost(n, [("docker exec", ok if n != "h2" else refused)]) for n in ("h0", "h1", "h2", "h3")}
    sess = fake_session(inv, hosts)
    out = FST._router_call(sess, inv, "remove", "http://10.0.0.3:8000")
    assert out["ok"] is False and out["h0"]["ok"] is True and out["h2"]["error"] == "503"
    asked = {n: [c for c in h.commands if "docker exec" in c] for n, h in hosts.items()}
    assert "remove http://10.0.0.1:30000 http://10.0.0.3:8000" in asked["h0"][0]
    assert "remove http://10.0.0.3:30000 http://10.0.0.3:8000" in asked["h2"][0]
    assert asked["h1"] == [] and asked["h3"] == []


class _DropsOnce(FakeHost):
    """Its first `fleet_probe.py ready` (the script goes on stdin; argv carries `ready URL`) loses the
    connection; everything after answers."""

    def __init__(self, name, answers):
        super().__init__(name, answers)
        self.dropped = False

    def _answer(self, argv, check):
        if " ready http" in " ".join(argv) and not self.dropped:
            self.dropped = True
            self.commands.append(" ".join(argv))
            raise ConnectionLost(self.name, "connection lost while running `docker exec ...`: EOF")
        return super()._answer(argv, check)


def test_a_replica_gate_whose_ssh_connection_drops_asks_again_and_reports_it(tmp_path):
    """The gate only reads (fleet_probe.py ready): an SSH connection that drops under it is asked once
    more, for the time left, over a new connection, and the run says so; a second drop is an error."""
    inv = load(tmp_path, fleet_yaml(2, 1))
    ready = (0, '{"ready": true, "seconds": 3}\n', "")
    logs = (0, "", "")
    h0 = _DropsOnce("h0", [(" ready http", ready), ("docker logs", logs)])
    sess = fake_session(inv, {"h0": h0, "h1": FakeHost("h1", [])})
    events = []
    sess.reporter.event = lambda host, step, state, detail="": events.append((host, step, state, detail))
    assert FST._gate(sess, inv, 0, 60) == {"ready": True, "seconds": 3}
    asked = [c.split(" ready ")[1] for c in h0.commands if " ready http" in c]
    assert len(asked) == 2 and asked[0].split()[1] == "60" and asked[1].split()[1] in ("59", "60"), asked
    assert [e for e in events if e[3].startswith("asking again: connection lost")], events

    class DropsAlways(_DropsOnce):
        def _answer(self, argv, check):
            self.dropped = False
            return super()._answer(argv, check)
    sess = fake_session(inv, {"h0": DropsAlways("h0", [("docker logs", logs)]), "h1": FakeHost("h1", [])})
    with pytest.raises(ConnectionLost):
        FST._gate(sess, inv, 0, 60)


def test_a_pool_replica_goes_into_every_router_under_its_models_names_with_its_policy(tmp_path):
    """_in_router of a pool's replica: fleet_probe's `route` on the router host, its URL under the
    model's name and its adapters' names, with the model's own policy; out: under no name."""
    from tests.fleet.test_pool import pool_yaml
    models = """
    models:
      - name: chat
        replicas: 2
        policy: power_of_two
        adapters: [{name: chat-sql, source: /loras/sql}]
    """
    inv = load(tmp_path, pool_yaml(2, models, cluster="router: {policy: round_robin}"))
    ok = (0, '{"ok": true}\n', "")
    hosts = {"h0": FakeHost("h0", [("docker exec", ok)]), "h1": FakeHost("h1", [])}
    sess = fake_session(inv, hosts)
    assert FST._in_router(sess, inv, 1, True)["ok"] is True
    assert FST._in_router(sess, inv, 1, False)["ok"] is True
    asked = [c.rsplit(" sh ", 1)[1] for c in hosts["h0"].commands]
    assert asked == ["route http://192.0.2.1:30000 http://192.0.2.2:8000 power_of_two chat chat-sql",
                     "route http://192.0.2.1:30000 http://192.0.2.2:8000 power_of_two"], asked


def test_replicas_started_together_name_the_first_that_did_not_serve_and_the_others(tmp_path, monkeypatch):
    """steps.start_gated (serve's launch and a pool's converge): every replica started, every gate
    asked at once; the first that did not serve named with its model, hosts and cause, the others
    after it, and what still stands; all served: each gate's answer."""
    from bootstrap.errors import ServeFailed
    from bootstrap.fleet import plan as FP

    inv = load(tmp_path, fleet_yaml(4, 2))
    started, gates = [], {0: {"ready": False, "error": "boom"}, 1: {"ready": False}}
    monkeypatch.setattr(FST, "_ensure_keeper", lambda sess, inv: started.append("keeper"))
    monkeypatch.setattr(FST, "_start_replica", lambda sess, inv, rp, stage="start": started.append((rp.index, stage)))
    monkeypatch.setattr(FST, "_gate", lambda sess, inv, k, wait: gates[k])
    monkeypatch.setattr(FST, "_replica_failure", lambda sess, inv, k, r: (f"cause of {k}", "tail"))
    rps = [FP.ReplicaPlan(k, (), f"http://x{k}:8000", ()) for k in (0, 1)]
    with pytest.raises(ServeFailed) as err:
        FST.start_gated(None, inv, rps, 60, own_stages=True, after="; the others serve")
    assert str(err.value).startswith("replica 0 (h0, h1) did not serve: cause of 0 (also replica 1); the others serve")
    assert started == ["keeper", (0, "start-r0"), (1, "start-r1")]
    gates.update({0: {"ready": True, "t": 3}, 1: {"ready": True, "t": 4}})
    started.clear()
    assert FST.start_gated(None, inv, rps, 60) == {0: {"ready": True, "t": 3}, 1: {"ready": True, "t": 4}}
    assert started == ["keeper", (0, "start"), (1, "start")]
