"""Pure parts of apply: Ray membership folded into the plan, the readiness check's output."""
from dataclasses import replace

from bootstrap.cluster.facts import (
    RAY_NONE_PREFIX,
    ContainerState,
    HostFacts,
    parse_ray_ok,
    ray_none_marker,
    ray_ok_marker,
    write_marker_cmd,
)
from bootstrap.cluster.plan import (
    LABEL_SPEC,
    container_spec,
    parse_ray_nodes,
    plan_up,
    ray_auth,
    ray_checks_needed,
    with_ray_members,
)
from tests.support.plan_fixtures import cpu_inventory


def kept(inv):
    facts = {}
    for h in inv.hosts:
        spec = container_spec(inv, h, 20000, auth=ray_auth(inv, None))
        facts[h.name] = HostFacts("20.10", nofile_hard=20000, image_id="i",
                                  container=ContainerState("running", "i", {LABEL_SPEC: spec.spec_hash}))
    return plan_up(inv, facts)


def test_worker_lost_by_ray_is_recreated_alone():
    inv = cpu_inventory(3)
    acts = with_ray_members(inv, kept(inv), {"172.31.240.13"})
    assert [(a.host, a.action, a.reason) for a in acts] == [
        ("node1", "keep", "up to date"), ("node2", "keep", "up to date"), ("node3", "recreate", "not alive in Ray")]


def test_head_lost_by_ray_restarts_everything():
    inv = cpu_inventory(3)
    acts = with_ray_members(inv, kept(inv), {"172.31.240.11"})
    assert [a.reason for a in acts] == ["head not alive in Ray", "the head is (re)started", "the head is (re)started"]


def test_all_alive_keeps_everything():
    inv = cpu_inventory(2)
    assert {a.action for a in with_ray_members(inv, kept(inv), set())} == {"keep"}


def test_parse_ray_nodes_output():
    out = ('{"event": "progress", "t": 0.1, "alive": ["10.0.0.1"], "missing": ["10.0.0.2"]}\n'
           'some warning line\n'
           '{"event": "done", "ready": false, "t": 5.0, "nodes": [{"ip": "10.0.0.1", "alive": true, "gpus": 8, '
           '"cpus": 96}], "missing": ["10.0.0.2"]}\n')
    v = parse_ray_nodes(out)
    assert not v.ready and v.missing == ("10.0.0.2",) and v.nodes[0].gpus == 8.0 and v.elapsed == 5.0
    assert parse_ray_nodes("Traceback...\nImportError: no ray\n").error == "ImportError: no ray"


def test_parse_ray_nodes_first_seen_and_head_clock():
    out = ('{"event": "done", "ready": true, "t": 1.2, "nodes": [], "missing": [], '
           '"first_seen": {"10.0.0.1": 1700000000.5, "10.0.0.2": 1700000001.25}, "now": 1700000002.0}\n')
    v = parse_ray_nodes(out)
    assert v.first_seen == {"10.0.0.1": 1700000000.5, "10.0.0.2": 1700000001.25} and v.head_now == 1700000002.0
    old = parse_ray_nodes('{"event": "done", "ready": true, "nodes": [], "missing": []}\n')  # an older poller
    assert old.first_seen == {} and old.head_now is None


def test_ray_check_skipped_for_image_ids_with_a_marker():
    inv = cpu_inventory(3)
    acts = plan_up(inv, {h.name: HostFacts("20.10", nofile_hard=20000, image_id="sha256:ab12") for h in inv.hosts})
    facts = {h.name: HostFacts("20.10", nofile_hard=20000, image_id="sha256:ab12") for h in inv.hosts}
    assert ray_checks_needed(acts, facts) == {"sha256:ab12": "node1"}  # once per distinct ID
    facts["node3"] = replace(facts["node3"], ray_ok=frozenset({ray_ok_marker("sha256:ab12")}))
    assert ray_checks_needed(acts, facts) == {}  # a marker on any host proves that content
    facts["node2"] = replace(facts["node2"], image_id="sha256:cd34")
    assert ray_checks_needed(acts, facts) == {"sha256:cd34": "node2"}


def test_ray_ok_markers():
    assert ray_ok_marker("sha256:ab12") == "ray-ok-ab12"
    assert ray_ok_marker("sha256:a/../b;$(x)") == "ray-ok-abx"  # never a path or shell text
    assert parse_ray_ok("ray-ok-ab12\nother\nray-ok-\n") == frozenset({"ray-ok-ab12"})
    assert write_marker_cmd(ray_ok_marker("sha256:ab12"))[-1] == "ray-ok-ab12"
    assert ray_none_marker("sha256:a/../b;$(x)") == "ray-none-abx"
    # each kind is read back on its own: a "without Ray" marker never counts as "with"
    listing = "ray-ok-ab12\nray-none-cd34\nray-none-\n"
    assert parse_ray_ok(listing) == frozenset({"ray-ok-ab12"})
    assert parse_ray_ok(listing, RAY_NONE_PREFIX) == frozenset({"ray-none-cd34"})


def test_all_alive_needs_every_host_with_its_gpus():
    from bootstrap.cluster.plan import RayNode, RayView, all_alive
    inv = cpu_inventory(2)
    ips = [h.ip for h in inv.hosts]
    view = RayView(True, (RayNode(ips[0], True, 8, 4), RayNode(ips[1], True, 8, 4)), ())
    assert all_alive(view, inv.hosts, 8) and not all_alive(view, inv.hosts, 16)
    dead = RayView(True, (RayNode(ips[0], True, 8, 4), RayNode(ips[1], False, 8, 4)), ())
    assert not all_alive(dead, inv.hosts, 0)


def test_replaced_workers_old_ray_registrations_do_not_count():
    from bootstrap.cluster.plan import HostAction, RayNode, RayView, stale_registrations
    from tests.support.plan_fixtures import cpu_inventory

    inv = cpu_inventory(3)
    h = [x for x in inv.hosts]
    members = RayView(True, (RayNode(h[0].ip, True, 0, 1, "id-head"), RayNode(h[1].ip, True, 0, 1, "id-w1"),
                             RayNode(h[2].ip, True, 0, 1, "id-w2-old"), RayNode(h[2].ip, False, 0, 1, "id-dead")), ())
    acts = [HostAction(h[0].name, "keep", "", None), HostAction(h[1].name, "keep", "", None),
            HostAction(h[2].name, "recreate", "container is exited", None)]
    assert stale_registrations(inv, acts, members) == {"id-w2-old"}
    assert stale_registrations(inv, acts, None) == set()
