"""The runtime follows the image when the inventory leaves it unset (bootstrap.cluster.runtime)."""
from dataclasses import replace

from bootstrap.cluster import runtime as RT
from bootstrap.cluster.facts import ContainerState, HostFacts, parse_container_inspect, ray_none_marker, ray_ok_marker
from bootstrap.cluster.plan import plan_offline, plan_up
from tests.support.plan_fixtures import cpu_inventory

A, B = "sha256:aa11", "sha256:bb22"


def facts(**ids):
    return {name: HostFacts("27.0", nofile_hard=1024, image_id=iid) for name, iid in ids.items()}


def test_a_node_container_says_what_it_runs():
    ray = ContainerState("running", A, path="ray", args=("start", "--block", "--head"))
    sleep = ContainerState("exited", A, path="sleep", args=("infinity",))
    assert RT.of_container(ray) == "ray" and RT.of_container(sleep) == "none"
    assert RT.of_container(ContainerState("running", A, path="sh", args=("-c", "ray start"))) is None
    assert RT.of_container(None) is None
    # docker inspect's Path and Args, as a real `docker container inspect` prints them
    doc = '[{"Path": "sleep", "Args": ["infinity"], "State": {"Status": "running"}, "Image": "sha256:aa11"}]'
    assert RT.of_container(parse_container_inspect(doc)) == "none"


def test_an_unset_runtime_is_read_from_the_head_first_then_a_worker():
    inv = cpu_inventory(3, runtime=None)
    ray = ContainerState("running", A, path="ray", args=("start",))
    sleep = ContainerState("running", A, path="sleep", args=("infinity",))
    assert RT.from_containers(inv, {"node1": sleep, "node2": ray}).cluster.runtime == "none"
    assert RT.from_containers(inv, {"node1": None, "node2": ray}).cluster.runtime == "ray"
    assert RT.from_containers(inv, {"node1": None, "node2": RuntimeError("unreachable")}).cluster.runtime is None
    # a runtime the inventory sets is never overridden by what runs
    assert RT.from_containers(cpu_inventory(3, runtime="ray"), {"node1": sleep}).cluster.runtime == "ray"


def test_markers_answer_for_every_host_with_the_same_image_id():
    f = facts(node1=A, node2=A, node3=B)
    assert RT.image_hosts(f) == {A: "node1", B: "node3"}
    assert RT.known_from_markers(f) == {}
    f["node3"] = replace(f["node3"], ray_ok=frozenset({ray_ok_marker(A)}), ray_none=frozenset({ray_none_marker(B)}))
    assert RT.known_from_markers(f) == {A: True, B: False}
    # no image anywhere: nothing to look at
    assert RT.image_hosts(facts(node1=None)) == {}


def test_ray_only_when_every_image_on_the_hosts_has_it():
    assert RT.choose({A: True}, {A: "node1"}, "img")[0] == "ray"
    rt, why = RT.choose({A: True, B: False}, {A: "node1", B: "node3"}, "img")
    assert rt == "none" and why.startswith("the image has no Ray (checked on node3)"), why
    assert RT.choose({}, {}, "img") == ("none", "the image img is on no host")


def test_the_containers_follow_the_settled_runtime():
    inv = cpu_inventory(2, runtime=None)
    none = plan_up(RT.resolved(inv, "none"), facts(node1=A, node2=A))
    assert [(a.spec.entrypoint, a.spec.command) for a in none] == [("sleep", ("infinity",))] * 2
    ray = plan_up(RT.resolved(inv, "ray"), facts(node1=A, node2=A))
    assert [a.spec.entrypoint for a in ray] == ["ray", "ray"] and "--head" in ray[0].spec.command
    # unset, the offline plan shows the containers with Ray (and `plan` says the image decides)
    assert [a.spec.entrypoint for a in plan_offline(inv)] == ["ray", "ray"]
    assert RT.resolved(inv, "none").cluster.runtime == "none" and inv.cluster.runtime is None
