"""`serve --stop` and the serving line of `status` when the remote step fails: an error naming the
host, never "stopped" or "nothing served". Fake hosts: no socket is opened."""
from __future__ import annotations

import pytest

from bootstrap.errors import CommandFailed, GroupError
from bootstrap.serve import run as V
from bootstrap.serve import state as S
from tests.support.fake_hosts import DOCKER_DOWN, FakeHost, fake_session
from tests.support.fleet_inventories import hosts_yaml, load

INVENTORY = "cluster:\n  accelerator: none\n" + hosts_yaml(2)


def test_serve_stop_fails_naming_the_host_where_docker_does_not_answer(tmp_path, monkeypatch):
    inv = load(tmp_path, INVENTORY)
    monkeypatch.setattr(V, "Session", lambda inv, **kw: fake_session(
        inv, {"h0": FakeHost("h0", [("docker exec", (0, "", ""))]),
              "h1": FakeHost("h1", [("docker exec", DOCKER_DOWN)])}, **kw))
    with pytest.raises(GroupError) as ei:
        V.stop(inv)
    assert set(ei.value.failures) == {"h1"} and "Cannot connect to the Docker daemon" in str(ei.value)


@pytest.mark.parametrize("answer", [(1, "", "Error response from daemon: container 3f2a is not running"),
                                    (1, "", "Error: No such container: vllm-node")])
def test_serve_stop_on_a_stopped_or_absent_container_is_done(tmp_path, answer):
    inv = load(tmp_path, INVENTORY)
    sess = fake_session(inv, {"h0": FakeHost("h0", [("docker exec", answer)]), "h1": FakeHost("h1")})
    S.stop_serving(sess, inv.host("h0"))  # nothing runs there: nothing to stop


def test_serving_state_that_cannot_be_read_is_an_error_not_nothing_served(tmp_path):
    inv = load(tmp_path, INVENTORY)
    sess = fake_session(inv, {"h0": FakeHost("h0", [("docker exec", (126, "", "OCI runtime exec failed: "
                                                                          "exec: \"sh\": executable file not found"))]),
                              "h1": FakeHost("h1")})
    with pytest.raises(CommandFailed) as ei:
        S.serving_state(sess)
    assert ei.value.host == "h0" and ei.value.exit_code == 126 and "executable file not found" in str(ei.value)


def test_serving_state_still_reads_nothing_served(tmp_path):
    inv = load(tmp_path, INVENTORY)
    sess = fake_session(inv, {"h0": FakeHost("h0", [("docker exec", (0, '{"serving": false, "state": null}\n', ""))]),
                              "h1": FakeHost("h1")})
    assert S.serving_state(sess) is None
