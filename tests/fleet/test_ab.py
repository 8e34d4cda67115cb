"""`bench --ab` without a host (fleet/ab.py): what it refuses, the routers' argv per arm, the order of
the arms and the policy given back even when an arm fails. The real run is in
tests/sandbox/test_sandbox_zfleet.py."""
from __future__ import annotations

import contextlib

import pytest

from bootstrap.errors import FleetError
from bootstrap.fleet import ab as FAB
from bootstrap.fleet import status as FS
from bootstrap.serve import abtest as AB
from bootstrap.serve import bench as B
from tests.support.fleet_inventories import fleet_yaml, load


def test_bench_ab_needs_a_router_and_one_model(tmp_path):
    with pytest.raises(FleetError, match="no router"):
        FAB.check(load(tmp_path, fleet_yaml(2, replicas=1)))
    FAB.check(load(tmp_path, fleet_yaml()))


def test_each_arms_routers_run_with_its_policy_on_every_router_host(tmp_path, monkeypatch):
    inv = load(tmp_path, fleet_yaml(cluster="""
        router: {host: h3, policy: round_robin}
        """))
    seen = {}
    monkeypatch.setattr(FAB, "_rm", lambda sess, hosts, *names, stage: seen.update(rm=([h.name for h in hosts],
                                                                                      names, stage)))
    monkeypatch.setattr(FAB, "start_routers", lambda sess, pinv, launches: seen.update(
        policy=pinv.cluster.router.policy, launches=launches))
    FAB.restart_routers(object(), inv, "cache_aware")
    assert seen["rm"] == (["h3"], ("bootstrap-vllm-router",), "router-cache_aware")
    (host, launch), = seen["launches"].items()
    argv = list(launch.run)
    assert host == "h3" and argv[argv.index("--policy") + 1] == "cache_aware" and seen["policy"] == "cache_aware"
    assert argv[argv.index("--host") + 1] == "10.0.0.4"
    assert inv.cluster.router.policy == "round_robin"  # the inventory itself is untouched


def test_arms_run_in_interleaved_order_and_the_inventorys_policy_comes_back_after_a_failure(tmp_path, monkeypatch):
    inv = load(tmp_path, fleet_yaml(cluster="""
        router: {policy: random}
        """))
    restarts, seeds = [], []

    @contextlib.contextmanager
    def session(*a, **kw):
        class S:
            def connect(self):
                pass
        yield S()

    def arm(sess, policy, repeat, cfg, reqs, warm):
        if len(seeds) == 3:
            raise OSError("the fleet went away")
        seeds.append(reqs)
        return AB.Arm(policy, repeat, None)

    monkeypatch.setattr(FAB, "Session", session)
    monkeypatch.setattr(FAB, "restart_routers", lambda sess, inv, policy, kv=None: restarts.append(policy))
    monkeypatch.setattr(FAB, "_arm", arm)
    cfg = B.BenchConfig(url="http://127.0.0.1:1")
    with pytest.raises(OSError):
        FAB.run_ab(inv, ["a", "b"], lambda seed: [seed], cfg, repeats=2)
    assert restarts == ["a", "b", "b", "a", "random"] and seeds == [[0], [1], [2]]
    restarts.clear()
    seeds.clear()
    got = []
    FAB.run_ab(inv, ["a", "b"], lambda seed: [seed], cfg, repeats=1, on_arm=got.append)
    assert restarts == ["a", "b", "random"] and [a.policy for a in got] == ["a", "b"]


def state(*latencies) -> FS.FleetState:
    reps = [FS.ReplicaState(k, [f"h{k}"], f"http://u{k}", {}, 0, None, "healthy", True, latency=lat)
            for k, lat in enumerate(latencies)]
    return FS.FleetState("http://r/v1", "h0", "running", [], reps)


def test_an_arms_engine_figures_are_the_counters_increase_summed_over_replicas():
    before = state({"ttft_sum": 1.0, "ttft_count": 10, "prefix_queries": 100}, {"ttft_sum": 5.0, "ttft_count": 4})
    after = state({"ttft_sum": 1.5, "ttft_count": 12, "prefix_queries": 160},
                  {"ttft_sum": 0.3, "ttft_count": 2})  # replica 1 restarted: counted from 0
    assert FAB._delta(before, after, "ttft_sum") == pytest.approx(0.8)
    assert FAB._delta(before, after, "ttft_count") == 4
    assert FAB._delta(before, after, "prefix_queries") is None  # replica 1 does not export it
