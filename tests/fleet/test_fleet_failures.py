"""Fleet status and stop when a host's Docker does not answer: "unknown" or an error naming the
host, never "absent"/"not serving"/"stopped". Fake hosts: no socket is opened."""
from __future__ import annotations

import pytest

from bootstrap.errors import GroupError
from bootstrap.fleet import run as FL
from tests.support.fake_hosts import DOCKER_DOWN, FakeHost, fake_session
from tests.support.fleet_inventories import fleet_yaml, load

ABSENT = (1, "[]", "Error: No such container")


def test_fleet_status_says_unknown_for_a_host_it_could_not_inspect(tmp_path):
    inv = load(tmp_path, fleet_yaml(4, 2))
    absent = [("container inspect", ABSENT), ("RestartCount", (1, "", "Error: No such object: x"))]
    sess = fake_session(inv, {"h0": FakeHost("h0", absent), "h1": FakeHost("h1", absent),
                              "h2": FakeHost("h2", [("docker", DOCKER_DOWN)]), "h3": FakeHost("h3", absent)})
    st = FL.fleet_state(sess)
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
    absent = [("container inspect", ABSENT), ("RestartCount", (1, "", "Error: No such object: x"))]
    sess = fake_session(inv, {"h0": FakeHost("h0", [("docker", DOCKER_DOWN)]), "h1": FakeHost("h1", absent),
                              "h2": FakeHost("h2", absent), "h3": FakeHost("h3", absent)})
    st = FL.fleet_state(sess)
    assert [(r.host, r.state.split(" ")[0]) for r in st.routers] == [("h0", "unknown"), ("h2", "absent")]
    assert st.routers[1].vip_state == "absent" and st.routers[1].holds_vip is None
    assert st.vip == "10.0.0.100" and st.vip_holder is None
    assert st.endpoint == "http://10.0.0.100:30000/v1"
    doc = st.to_dict()
    assert doc["vip_holder"] is None and [r["host"] for r in doc["routers"]] == ["h0", "h2"]
