"""Prefill/decode disaggregation (cluster.router.prefill), without a host: what the inventory takes
and refuses, each replica's vLLM flags and environment, the router's PD mode, the ports preflight,
UCX's devices from the facts, and the refusals before anything starts. The sandbox serves it
(tests/sandbox/test_sandbox_zfleet.py)."""
from __future__ import annotations

import json

import pytest

from bootstrap.cluster import plan as PL
from bootstrap.cluster.facts import HostFacts, IBPort, RackFacts
from bootstrap.cluster.preflight import ports as RC
from bootstrap.errors import FleetError
from bootstrap.fleet import names as FN
from bootstrap.fleet import plan as FP
from bootstrap.serve.split import Parallelism, SplitChoice
from tests.support.fleet_inventories import check, error, fleet_yaml, load

SPLIT = SplitChoice(Parallelism(1, 1, 1), "TP=1 PP=1", True)
PD = """
router:
  prefill: [0]
"""


def test_the_first_replica_prefills_and_the_other_decodes(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2, cluster=PD))
    assert inv.cluster.router.prefill == (0,) and FN.is_pd(inv)
    assert [FN.role(inv, k) for k in range(2)] == ["prefill", "decode"]
    plan = FP.plan_fleet(inv, FP.Spec("/m", ("--max-model-len", "256")), SPLIT, nofile={})
    assert [r.role for r in plan.replicas] == ["prefill", "decode"]
    for r, kv_role in zip(plan.replicas, ("kv_producer", "kv_consumer")):
        (m,) = r.members
        i = m.vllm.index("--kv-transfer-config")
        assert json.loads(m.vllm[i + 1]) == {"kv_connector": "NixlConnector", "kv_role": kv_role,
                                             "kv_buffer_device": "cpu",
                                             "kv_connector_extra_config": {"kv_lease_duration": 5}}
        assert m.vllm[-2:] == ("--max-model-len", "256")  # the user's flags after the plan's
        ip = inv.host(m.host).ip
        env = [m.create[j + 1] for j, a in enumerate(m.create) if a == "-e"]
        assert f"VLLM_NIXL_SIDE_CHANNEL_HOST={ip}" in env and "VLLM_NIXL_SIDE_CHANNEL_PORT=5600" in env, env
    router = list(plan.router)
    assert "--worker-urls" not in router
    i = router.index("--vllm-pd-disaggregation")
    assert router[i:i + 5] == ["--vllm-pd-disaggregation", "--prefill", plan.replicas[0].url,
                               "--decode", plan.replicas[1].url]
    assert plan.to_dict()["replicas"][1]["role"] == "decode"
    # bootstrap chose the lease on CPU nodes: the plan says so and why
    assert any(n.startswith("KV lease 5 s") and "cluster.router.kv_lease" in n for n in plan.notes), plan.notes


def test_a_one_node_prefill_and_a_two_node_decode_replica_each_get_their_own_split(tmp_path):
    """Replicas of different sizes (every host pinned): the plan takes a split per size, each
    replica's members run their own (TP=1 on the prefill node, TP=2 across the decode's two), vLLM's
    NixlConnector maps the KV heads between the two TP sizes (heterogeneous TP)."""
    inv = load(tmp_path, fleet_yaml(3, 2, cluster=PD, extra={0: "replica: 0", 1: "replica: 1", 2: "replica: 1"}))
    one = SPLIT
    two = SplitChoice(Parallelism(2, 1, 2), "TP=2 PP=1: tensor parallel across the 2 nodes", True)
    plan = FP.plan_fleet(inv, FP.Spec("/m"), {1: one, 2: two}, nofile={}, cpus={"h0": 2, "h1": 2, "h2": 2})
    prefill, decode = plan.replicas
    assert (prefill.role, prefill.split, decode.role, decode.split) == ("prefill", one, "decode", two)
    assert not plan.uniform and plan.split == one
    (p0,) = prefill.members
    assert _flag(p0.vllm, "--tensor-parallel-size") == "1" and _flag(p0.vllm, "--nnodes") == "1"
    d0, d1 = decode.members
    for rank, m in enumerate((d0, d1)):
        assert _flag(m.vllm, "--tensor-parallel-size") == "2" and _flag(m.vllm, "--nnodes") == "2"
        assert _flag(m.vllm, "--node-rank") == str(rank) and _flag(m.vllm, "--master-addr") == inv.host("h1").ip
        assert json.loads(_flag(m.vllm, "--kv-transfer-config"))["kv_role"] == "kv_consumer"
    assert "--headless" in d1.vllm and "--headless" not in d0.vllm
    doc = plan.to_dict()
    assert [(r["tp"], r["pp"]) for r in doc["replicas"]] == [(1, 1), (2, 1)]
    # one worker per node on each: every node has 2 CPUs, no more than vLLM-CPU keeps, so all run unbound
    assert any(n.startswith("h0, h1, h2: 2 CPUs") for n in plan.notes), plan.notes
    # one split for every replica: the same plan as before
    same = FP.plan_fleet(load(tmp_path, fleet_yaml(2, 2, cluster=PD)), FP.Spec("/m"), SPLIT, nofile={})
    assert same.uniform and [r.split for r in same.replicas] == [SPLIT, SPLIT]


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_a_kv_lease_in_the_inventory_is_what_every_replica_gets_and_no_note_is_added(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2, cluster=PD + "  kv_lease: 45\n"))
    assert inv.cluster.router.kv_lease == 45
    plan = FP.plan_fleet(inv, FP.Spec("/m"), SPLIT, nofile={}, notes=("a note",))
    for r in plan.replicas:
        (m,) = r.members
        kv = json.loads(m.vllm[m.vllm.index("--kv-transfer-config") + 1])
        assert kv["kv_connector_extra_config"] == {"kv_lease_duration": 45}
    assert plan.notes == ("a note", FP.one_host_note(inv))  # no KV note; the one-host note


@pytest.mark.parametrize("value, parts", [
    ("0", ("must be between 1 and 3600, got 0",)),
    ("3601", ("must be between 1 and 3600",)),
    ("'5'", ("expected an integer",)),
])
def test_a_kv_lease_that_cannot_work_is_refused_on_its_line(tmp_path, value, parts):
    err = error(tmp_path, fleet_yaml(2, 2, cluster=PD + f"  kv_lease: {value}\n"))
    check(err, tmp_path / "inventory.yaml", 6, "cluster.router.kv_lease", *parts)


def test_a_kv_lease_without_disaggregation_is_refused_rather_than_ignored(tmp_path):
    err = error(tmp_path, fleet_yaml(2, 2, cluster="router:\n  kv_lease: 10\n"))
    check(err, tmp_path / "inventory.yaml", 5, "cluster.router.kv_lease", "needs prefill/decode disaggregation")


def test_without_prefill_nothing_changes(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2))
    assert not FN.is_pd(inv) and FN.role(inv, 0) is None
    plan = FP.plan_fleet(inv, FP.Spec("/m"), SPLIT, nofile={})
    assert all("--kv-transfer-config" not in m.vllm and not any("NIXL" in a for a in m.create)
               for r in plan.replicas for m in r.members)
    assert "--worker-urls" in plan.router and "--vllm-pd-disaggregation" not in plan.router


def test_gpu_replicas_keep_the_kv_buffer_in_gpu_memory_and_ucx_takes_the_active_rdma_ports(tmp_path):
    text = fleet_yaml(2, 2, cluster=PD + "gpus_per_node: 8\ninfiniband: true\n")
    inv = load(tmp_path, text.replace("accelerator: none", "accelerator: gpu", 1))
    h0 = inv.hosts[0]
    ports = (IBPort("mlx5_1", 1, "InfiniBand", False, "ACTIVE"), IBPort("mlx5_0", 1, "InfiniBand", False, "ACTIVE"),
             IBPort("mlx5_2", 1, "InfiniBand", False, "DOWN"))
    facts = HostFacts("27.0", rack=RackFacts(ib=ports))
    ucx = PL.ucx_env(inv, h0, facts)
    assert ucx == {"UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1"}
    plan = FP.plan_fleet(inv, FP.Spec("/m"), SplitChoice(Parallelism(8, 1, 8), "TP=8", True), nofile={},
                         ucx={h0.name: ucx})
    m = plan.replicas[0].members[0]
    kv = json.loads(m.vllm[m.vllm.index("--kv-transfer-config") + 1])
    assert kv["kv_buffer_device"] == "cuda" and "kv_connector_extra_config" not in kv  # vLLM's own lease
    assert not any(n.startswith("KV lease") for n in plan.notes)
    assert "UCX_NET_DEVICES=mlx5_0:1,mlx5_1:1" in m.create
    assert PL.ucx_env(inv, h0, None) == {}


def env_of(member) -> dict[str, str]:
    return dict(member.create[j + 1].split("=", 1) for j, a in enumerate(member.create) if a == "-e")


@pytest.mark.parametrize("tp, cpus, unbound", [
    (1, {"h0": 2, "h1": 2, "h2": 2}, ["h0", "h1", "h2"]),  # the sandbox's nodes: vLLM would keep 2 of 2 CPUs
    (1, {"h0": 2, "h1": 3}, ["h0"]),  # h2's count unknown: left as vLLM binds it
    (2, {"h0": 4, "h1": 4, "h2": 5}, ["h0"]),  # TP=2 on a node: vLLM keeps 4; h1 sets its own
    (1, {"h0": 64, "h1": 64}, []),
])
def test_cpu_members_with_no_core_left_for_nixl_run_unbound_and_the_plan_says_why(tmp_path, tp, cpus, unbound):
    """vLLM-CPU keeps one core per local rank for its scheduler and one for NIXL; where a node has no
    more, its automatic binding pins OpenMP to NIXL's core too, so the plan leaves that engine unbound."""
    # h1 sets the binding itself: its own value stays
    inv = load(tmp_path, fleet_yaml(3, 3, cluster="router:\n  prefill: [0]\n",
                                    extra={1: "env: {VLLM_CPU_OMP_THREADS_BIND: '0'}"} if tp == 2 else None))
    split = SplitChoice(Parallelism(tp, 1, tp), f"TP={tp}", True)
    plan = FP.plan_fleet(inv, FP.Spec("/m"), split, nofile={}, cpus=cpus)
    got = [m.host for r in plan.replicas for m in r.members if env_of(m).get("VLLM_CPU_OMP_THREADS_BIND") == "nobind"]
    assert got == unbound
    note = [n for n in plan.notes if "VLLM_CPU_OMP_THREADS_BIND=nobind" in n]
    if unbound:
        assert len(note) == 1 and note[0].startswith(f"{', '.join(unbound)}: ") and f"({2 * tp}: " in note[0], note
    else:
        assert not note, plan.notes
    if tp == 2:
        assert env_of(plan.replicas[1].members[0])["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    # not disaggregated, or GPU nodes: vLLM's own binding, whatever the count
    plain = load(tmp_path, fleet_yaml(3, 3))
    assert not FP.unbound_hosts(plain, cpus, tp)
    gpu = load(tmp_path, fleet_yaml(3, 3, cluster="router:\n  prefill: [0]\ngpus_per_node: 1\n").replace(
        "accelerator: none", "accelerator: gpu", 1))
    assert not FP.unbound_hosts(gpu, cpus, tp)


def test_every_node_checks_the_side_channel_port_before_up(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2, cluster=PD))
    assert all(5600 in [p for p, _ in ports] for ports in RC.planned_ports(inv).values())
    plain = load(tmp_path, fleet_yaml(2, 2))
    assert not any(5600 in [p for p, _ in ports] for ports in RC.planned_ports(plain).values())


@pytest.mark.parametrize("value, line, parts", [
    ("[2]", 5, ("replica 2 is not a replica of this cluster", "numbered 0 to 1")),
    ("[0, 1]", 5, ("every replica would prefill and none decode",)),
    ("[]", 5, ("a non-empty list of replica numbers",)),
    ("[0, 0]", 5, ("replica 0 is listed twice",)),
    ("[true]", 5, ("True is not a replica number",)),
    ("0", 5, ("a non-empty list",)),
])
def test_a_prefill_list_that_cannot_work_is_refused_on_its_line(tmp_path, value, line, parts):
    err = error(tmp_path, fleet_yaml(2, 2, cluster=f"router:\n  prefill: {value}\n"))
    check(err, tmp_path / "inventory.yaml", line, "cluster.router.prefill", *parts)


def test_the_plans_connector_flag_and_an_image_without_nixl_are_refused(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2, cluster=PD))
    with pytest.raises(FleetError, match="--kv_transfer_config is set by the plan on a disaggregated fleet"):
        FP.check_pd(inv, ("--kv_transfer_config={}",), nixl_connector=True, nixl=True)
    with pytest.raises(FleetError, match="the image's vLLM has none"):
        FP.check_pd(inv, (), nixl_connector=False, nixl=True)
    with pytest.raises(FleetError, match="needs NIXL in the image"):
        FP.check_pd(inv, (), nixl_connector=True, nixl=False)
    FP.check_pd(inv, (), nixl_connector=True, nixl=True)
    FP.check_pd(load(tmp_path, fleet_yaml(2, 2)), ("--kv-transfer-config", "{}"), nixl_connector=None, nixl=False)


def test_pipeline_parallel_replicas_are_refused_on_a_disaggregated_fleet_only(tmp_path):
    """vLLM's NixlConnector refuses PP > 1 on the decode side when its engine starts (vLLM 0.32's
    nixl/base_worker.py); every replica has the same split, so PP > 1 is refused before launch."""
    inv = load(tmp_path, fleet_yaml(4, 2, cluster=PD))
    with pytest.raises(FleetError, match=r"PP=2 on a disaggregated fleet: .* no pipeline parallel on the decode side"):
        FP.check_pd(inv, (), nixl_connector=True, nixl=True, pp=2)
    FP.check_pd(inv, (), nixl_connector=True, nixl=True, pp=1)  # TP over the replica's nodes: fine
    FP.check_pd(load(tmp_path, fleet_yaml(4, 2)), (), nixl_connector=True, nixl=True, pp=2)  # no PD: fine


def test_bench_reports_each_roles_own_latency_from_the_engines_histograms():
    from bootstrap.fleet.status import FleetState, ReplicaState, spread

    def state(succeeded, lat):
        return FleetState("e", "h0", "running", [], [
            ReplicaState(0, ["h0"], "u0", {}, 0, None, "healthy", True, succeeded=succeeded[0], role="prefill",
                         latency=lat[0]),
            ReplicaState(1, ["h1"], "u1", {}, 0, None, "healthy", True, succeeded=succeeded[1], role="decode",
                         latency=lat[1])])
    before = state((4, 4), ({"ttft_sum": 1.0, "ttft_count": 4}, {"ttft_sum": 2.0, "ttft_count": 4,
                                                                 "itl_sum": 0.5, "itl_count": 50}))
    after = state((12, 12), ({"ttft_sum": 1.4, "ttft_count": 12}, {"ttft_sum": 3.0, "ttft_count": 12,
                                                                   "itl_sum": 1.3, "itl_count": 130}))
    got = spread(before, after)
    assert got.per_replica == {0: 8, 1: 8} and got.roles == {0: "prefill", 1: "decode"}
    assert got.latency_ms[0]["ttft_ms"] == pytest.approx(50.0) and got.latency_ms[1]["itl_ms"] == pytest.approx(10.0)
    assert got.latency_ms[0]["itl_ms"] is None  # the prefill engine exports no inter-token latency
    assert got.describe().splitlines()[1] == ("per role, as the engines measure it: replica 0 (prefill): TTFT mean "
                                              "50.0 ms; replica 1 (decode): TTFT mean 125.0 ms, ITL mean 10.0 ms")
    plain = spread(FleetState("e", "h0", "running", [], [ReplicaState(0, ["h0"], "u0", {}, 0, None, "healthy", True,
                                                                      succeeded=1)]),
                   FleetState("e", "h0", "running", [], [ReplicaState(0, ["h0"], "u0", {}, 0, None, "healthy", True,
                                                                      succeeded=3)]))
    assert "\n" not in plain.describe() and plain.roles == {}


def test_data_parallel_replicas_behind_the_router(tmp_path):
    """serve --dp with replicas: each replica runs vLLM's DP engines over its own nodes behind its head's
    API server, and the router balances over the replicas; the spec keeps --dp, so a rollout keeps it."""
    from bootstrap.serve.split import choose_split

    inv = load(tmp_path, fleet_yaml(4, 2))
    split = choose_split(None, 2, 1, accelerator="none", dp=2)
    plan = FP.plan_fleet(inv, FP.Spec("/m", dp=2), split, nofile={})
    for r in plan.replicas:
        head, other = r.members
        assert "--data-parallel-size 2 --data-parallel-size-local 1" in " ".join(head.vllm)
        assert f"--data-parallel-address {inv.host(head.host).ip}" in " ".join(other.vllm)
        assert "--headless --data-parallel-start-rank 1" in " ".join(other.vllm)
    assert "--worker-urls" in plan.router
    spec = FP.Spec("/m", ("--max-model-len", "256"), "img", None, 2)
    assert FP.Spec.from_label(spec.to_label()) == spec and "(--dp 2)" in spec.describe()
    old = FP.Spec.from_label('{"model": "/m", "extra": [], "image": "img", "served_name": null}')
    assert old == FP.Spec("/m", (), "img") and old.dp is None  # a label written before --dp
    assert FP.Spec.from_label('{"model": "/m", "dp": true}').dp is None


def test_eager_engines_are_kept_on_cpu_and_gpu_disaggregated_fleets(tmp_path):
    """vLLM-CPU's eager worker died of AMX (SIGILL, with or without a KV connector), not of
    NixlConnector: eager flags pass on CPU and GPU disaggregated fleets alike."""
    inv = load(tmp_path, fleet_yaml(2, 2, cluster=PD))
    for flags in (("--enforce-eager",), ("-O", "0")):
        FP.check_pd(inv, flags, nixl_connector=True, nixl=True)
    text = fleet_yaml(2, 2, cluster=PD + "gpus_per_node: 8\n").replace("accelerator: none", "accelerator: gpu", 1)
    FP.check_pd(load(tmp_path, text), ("--enforce-eager",), nixl_connector=True, nixl=True)
