"""A `docker` step that fails for another reason than "no such container" is an error naming the host
and the command, never read as "absent" or "removed" (fake hosts: no socket is opened)."""
from __future__ import annotations

import pytest

from bootstrap.errors import CommandFailed
from bootstrap.remote import docker as DK
from bootstrap.remote.ssh import Result
from tests.support.fake_hosts import DOCKER_DOWN, FakeHost

ABSENT = (1, "[]", "Error: No such container: c")
ABSENT_OLD = (1, "", "Error response from daemon: No such container: c")


def test_inspect_of_an_absent_container_is_none():
    assert DK.inspect(FakeHost("h", [("inspect", ABSENT)]), "c") is None
    assert DK.inspect(FakeHost("h", [("inspect", ABSENT_OLD)]), "c") is None


def test_inspect_with_docker_not_answering_is_an_error_not_absent():
    with pytest.raises(CommandFailed) as ei:
        DK.inspect(FakeHost("gpu-a", [("inspect", DOCKER_DOWN)]), "c")
    assert ei.value.host == "gpu-a" and ei.value.command == "docker container inspect c"
    assert "Cannot connect to the Docker daemon" in str(ei.value)


def test_inspect_with_permission_denied_on_the_socket_is_an_error():
    denied = (1, "", "permission denied while trying to connect to the Docker daemon socket at "
                     "unix:///var/run/docker.sock: ... dial unix /var/run/docker.sock: connect: permission denied")
    with pytest.raises(CommandFailed, match="gpu-a: `docker container inspect c` failed"):
        DK.inspect(FakeHost("gpu-a", [("inspect", denied)]), "c")


@pytest.mark.parametrize("step", [
    lambda s: DK.rm(s, "a", "b", timeout=120),
    lambda s: DK.stop(s, "a", 10, timeout=60),
    lambda s: DK.volume_rm(s, "vol"),
])
def test_rm_stop_and_volume_rm_raise_when_docker_fails(step):
    s = FakeHost("gpu-a", [("docker", DOCKER_DOWN)])
    with pytest.raises(CommandFailed) as ei:
        step(s)
    assert ei.value.host == "gpu-a" and ei.value.command.startswith("docker ")


@pytest.mark.parametrize("step", [
    lambda s: DK.rm(s, "a", "b", timeout=120),
    lambda s: DK.stop(s, "a", 10, timeout=60),
])
def test_rm_and_stop_of_an_absent_container_are_fine(step):
    step(FakeHost("gpu-a", [("docker", (1, "", "Error: No such container: a\nError: No such container: b"))]))


def test_volume_rm_of_an_absent_volume_is_fine_one_in_use_is_not():
    DK.volume_rm(FakeHost("h", [("volume", (1, "", "Error: No such volume: vol"))]), "vol")
    with pytest.raises(CommandFailed, match="volume is in use"):
        DK.volume_rm(FakeHost("h", [("volume", (1, "", "Error response from daemon: remove vol: volume is in use"))]),
                     "vol")


def test_one_name_absent_and_another_failing_is_a_failure():
    mixed = (1, "", "Error: No such container: a\nError response from daemon: cannot remove container b: "
                    "could not kill: permission denied")
    with pytest.raises(CommandFailed):
        DK.rm(FakeHost("h", [("rm", mixed)]), "a", "b")


def test_not_running_only():
    def r(code, err):
        return Result("h", "docker exec", code, "", err)
    assert DK.not_running_only(r(1, "Error response from daemon: container 3f2a is not running"))
    assert DK.not_running_only(r(1, "Error: No such container: c"))
    assert not DK.not_running_only(r(1, DOCKER_DOWN[2]))
    assert not DK.not_running_only(r(137, ""))
