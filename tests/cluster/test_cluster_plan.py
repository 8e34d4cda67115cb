"""The pure plan: exact argv per host and the create/keep/recreate decision (facts in, plan out)."""
from dataclasses import replace

import pytest

from bootstrap.cluster.facts import ContainerState, HostFacts
from bootstrap.cluster.plan import LABEL_SPEC, container_spec, plan_up, ray_auth
from tests.support.plan_fixtures import SECRET, cpu_inventory, gpu_inventory


def test_head_and_worker_argv_exact():
    inv = gpu_inventory()
    head = container_spec(inv, inv.hosts[0], nofile=1048576)
    worker = container_spec(inv, inv.hosts[1], nofile=65536)
    assert head.run_argv() == (
        "docker", "run", "-d", "--name", "bootstrap-vllm", "--network", "host", "--ipc", "host",
        "--gpus", "all", "--ulimit", "nofile=1048576:1048576",
        "-v", "/data/hf:/root/.cache/huggingface", "-v", "bootstrap-vllm-compile-cache:/var/cache/bootstrap-compile",
        "-e", "NCCL_DEBUG=WARN", "-e", "NCCL_SOCKET_IFNAME=ens5",
        "-e", "TORCHINDUCTOR_CACHE_DIR=/var/cache/bootstrap-compile/inductor",
        "-e", "TRITON_CACHE_DIR=/var/cache/bootstrap-compile/triton",
        "-e", "VLLM_CACHE_ROOT=/var/cache/bootstrap-compile/vllm", "-e", "VLLM_HOST_IP=10.10.0.11",
        "--label", "bootstrap.cluster=llama", "--label", "bootstrap.host=gpu-a",
        "--label", "bootstrap.role=head", "--label", f"bootstrap.spec={head.spec_hash}",
        "--entrypoint", "ray", "vllm/vllm-openai:v0.8.5",
        "start", "--block", "--head", "--node-ip-address=10.10.0.11", "--port=6379",
        "--dashboard-port=8265", "--num-gpus=8", "--metrics-export-port=8080", "--disable-usage-stats")
    assert head.command == ("start", "--block", "--head", "--node-ip-address=10.10.0.11", "--port=6379",
                            "--dashboard-port=8265", "--num-gpus=8", "--metrics-export-port=8080",
                            "--disable-usage-stats")
    assert worker.command == ("start", "--block", "--address=10.10.0.11:6379", "--node-ip-address=10.10.0.12",
                              "--num-gpus=8", "--metrics-export-port=8080", "--disable-usage-stats")
    assert "VLLM_HOST_IP=10.10.0.12" in worker.options
    assert "NCCL_SOCKET_IFNAME=ens6" in worker.options
    assert "nofile=65536:65536" in worker.options


def test_the_compile_caches_sit_on_a_volume_per_host_and_cluster_env_can_move_them():
    inv = gpu_inventory()
    host = replace(inv.hosts[0], env=(*inv.hosts[0].env, ("TRITON_CACHE_DIR", "/scratch/triton")))
    opts = container_spec(inv, host, nofile=1024).options
    assert "bootstrap-vllm-compile-cache:/var/cache/bootstrap-compile" in opts
    assert "TRITON_CACHE_DIR=/scratch/triton" in opts
    assert "TRITON_CACHE_DIR=/var/cache/bootstrap-compile/triton" not in opts
    assert "TORCHINDUCTOR_CACHE_DIR=/var/cache/bootstrap-compile/inductor" in opts


@pytest.mark.parametrize("value, flag", [
    ("localhost", None),
    ("127.0.0.1", None),
    ("data-plane", "--dashboard-host=10.10.0.11"),
    ("all", "--dashboard-host=0.0.0.0"),
    ("::", "--dashboard-host=::"),
    ("10.10.0.99", "--dashboard-host=10.10.0.99"),
])
def test_dashboard_host_only_on_the_head_and_only_when_not_rays_default(value, flag):
    inv = gpu_inventory(dashboard_host=value)
    head = container_spec(inv, inv.hosts[0], nofile=1024).command
    worker = container_spec(inv, inv.hosts[1], nofile=1024).command
    assert not any(a.startswith("--dashboard-host") for a in worker)
    got = [a for a in head if a.startswith("--dashboard-host")]
    assert got == ([flag] if flag else [])
    if flag:
        assert head.index(flag) == head.index("--dashboard-port=8265") + 1


def test_default_dashboard_host_keeps_the_spec_hash():
    inv = gpu_inventory()
    same = gpu_inventory(dashboard_host="localhost")
    moved = gpu_inventory(dashboard_host="data-plane")
    h = container_spec(inv, inv.hosts[0], nofile=1024).spec_hash
    assert container_spec(same, same.hosts[0], nofile=1024).spec_hash == h
    assert container_spec(moved, moved.hosts[0], nofile=1024).spec_hash != h
    # workers do not run the dashboard: their containers are not recreated for it
    assert container_spec(moved, moved.hosts[1], nofile=1024).spec_hash == \
        container_spec(inv, inv.hosts[1], nofile=1024).spec_hash


def test_cpu_cluster_has_no_gpus_and_uses_shm():
    inv = cpu_inventory()
    spec = container_spec(inv, inv.hosts[1], nofile=20000)
    assert "--gpus" not in spec.options
    assert ("--shm-size", "1g") == spec.options[2:4]
    assert "--ipc" not in spec.options


def test_infiniband_is_least_privilege_unless_asked():
    inv = gpu_inventory(infiniband=True)
    opts = container_spec(inv, inv.hosts[0], nofile=1024).options
    assert ("--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1") == \
        opts[opts.index("--device"):opts.index("--device") + 6]
    assert "--privileged" not in opts
    inv = gpu_inventory(infiniband=True, privileged=True)
    assert "--privileged" in container_spec(inv, inv.hosts[0], nofile=1024).options


def test_secrets_never_in_argv_and_change_the_hash_by_name_only():
    inv = gpu_inventory(secrets=(SECRET,))
    spec = container_spec(inv, inv.hosts[0], nofile=1024)
    argv = spec.run_argv()
    assert "hf_SUPERSECRETVALUE" not in " ".join(argv) and "--env-file" not in argv
    assert f"/run/bootstrap/{inv.cluster.name}/serve:/run/bootstrap/secrets:ro" in argv
    assert argv[argv.index("--") - 1] == spec.secret_names[0]
    assert spec.spec_hash != container_spec(gpu_inventory(), gpu_inventory().hosts[0], nofile=1024).spec_hash


def test_hash_tracks_the_spec():
    inv = gpu_inventory()
    a = container_spec(inv, inv.hosts[0], nofile=1024)
    assert a.spec_hash == container_spec(inv, inv.hosts[0], nofile=1024).spec_hash
    assert a.spec_hash != container_spec(inv, inv.hosts[0], nofile=2048).spec_hash
    other = gpu_inventory(image="vllm/vllm-openai:v0.9.0")
    assert a.spec_hash != container_spec(other, inv.hosts[0], nofile=1024).spec_hash


def _facts_running(inv, nofile=20000, image_id="sha256:aaa"):
    out = {}
    for h in inv.hosts:
        spec = container_spec(inv, h, nofile, auth=ray_auth(inv, None))
        out[h.name] = HostFacts("20.10", nofile_hard=nofile, image_id=image_id,
                                container=ContainerState("running", image_id, {LABEL_SPEC: spec.spec_hash}))
    return out


def test_plan_fresh_cluster_creates_everything_head_first():
    inv = cpu_inventory(3)
    facts = {h.name: HostFacts("20.10", nofile_hard=20000) for h in inv.hosts}
    acts = plan_up(inv, facts)
    assert [(a.host, a.action) for a in acts] == [("node1", "create"), ("node2", "create"), ("node3", "create")]


def test_plan_unchanged_cluster_keeps_everything():
    inv = cpu_inventory(3)
    assert {a.action for a in plan_up(inv, _facts_running(inv))} == {"keep"}


def test_plan_recreates_only_the_changed_worker():
    inv = cpu_inventory(3)
    facts = _facts_running(inv)
    facts["node3"] = replace(facts["node3"], container=replace(facts["node3"].container, status="exited"))
    acts = {a.host: (a.action, a.reason) for a in plan_up(inv, facts)}
    assert acts == {"node1": ("keep", "up to date"), "node2": ("keep", "up to date"),
                    "node3": ("recreate", "container is exited")}


def test_plan_head_change_takes_the_workers_along():
    inv = cpu_inventory(3)
    facts = _facts_running(inv)
    facts["node1"] = replace(facts["node1"], container=replace(facts["node1"].container, labels={LABEL_SPEC: "old"}))
    acts = {a.host: (a.action, a.reason) for a in plan_up(inv, facts)}
    assert acts["node1"] == ("recreate", "spec changed")
    assert acts["node2"] == acts["node3"] == ("recreate", "the head is (re)started")


def test_up_asks_only_about_running_containers_it_would_stop():
    """plan.disruptive: what `up` names and asks about before going on. A stopped container
    recreated, a missing one created, one kept: nothing to ask; a running one recreated (its own
    change, or the head's taking it along): asked."""
    from bootstrap.cluster.plan import disruptive

    inv = cpu_inventory(3)
    facts = _facts_running(inv)
    facts["node3"] = replace(facts["node3"], container=replace(facts["node3"].container, status="exited"))
    assert disruptive(plan_up(inv, facts), facts) == ()
    facts["node1"] = replace(facts["node1"], container=replace(facts["node1"].container, labels={LABEL_SPEC: "old"}))
    asked = {a.host: a.reason for a in disruptive(plan_up(inv, facts), facts)}
    assert asked == {"node1": "spec changed", "node2": "the head is (re)started"}


def test_plan_new_image_recreates():
    inv = cpu_inventory(2)
    facts = _facts_running(inv)
    facts["node2"] = replace(facts["node2"], image_id="sha256:bbb")
    acts = {a.host: a.reason for a in plan_up(inv, facts)}
    assert acts == {"node1": "up to date", "node2": "image updated"}


def test_nofile_from_inventory_wins_over_host():
    inv = cpu_inventory(1, nofile=4096)
    facts = {"node1": HostFacts("20.10", nofile_hard=20000)}
    assert "nofile=4096:4096" in plan_up(inv, facts)[0].spec.options
    inv = cpu_inventory(1)
    assert "nofile=20000:20000" in plan_up(inv, facts)[0].spec.options


def test_runtime_none_holds_the_node_without_ray():
    inv = cpu_inventory(2, runtime="none")
    spec = container_spec(inv, inv.hosts[1], nofile=20000)
    assert spec.run_argv()[-3:] == ("sleep", inv.cluster.image, "infinity")
    assert "--entrypoint" in spec.run_argv() and "ray" not in spec.run_argv()
    assert spec.spec_hash != container_spec(cpu_inventory(2), cpu_inventory(2).hosts[1], nofile=20000).spec_hash


def _rack(ip, iface, ib=()):
    from bootstrap.cluster import facts as F

    return F.RackFacts(addrs=(("lo", "127.0.0.1"), (iface, ip)), ib=tuple(F.parse_ib_port(p) for p in ib))


def test_each_nodes_nccl_variables_come_from_its_own_facts_where_the_inventory_leaves_them_unset():
    from bootstrap.cluster.plan import derived_env

    inv = gpu_inventory(infiniband=True)
    a, b = inv.hosts
    a = replace(a, env=(("NCCL_SOCKET_IFNAME", "ens5"),))  # set by the user: kept
    b = replace(b, env=())
    inv = replace(inv, hosts=(a, b))
    facts = {
        "gpu-a": HostFacts("20.10", rack=_rack("10.10.0.11", "ens5", ("mlx5_0 1 InfiniBand 0 4: ACTIVE",
                                                                      "mlx5_1 1 InfiniBand 0 4: ACTIVE"))),
        # b differs: its data-plane interface is another, one HCA is DOWN
        "gpu-b": HostFacts("20.10", rack=_rack("10.10.0.12", "enp1s0", ("mlx5_0 1 InfiniBand 0 4: ACTIVE",
                                                                        "mlx5_1 1 InfiniBand 0 1: DOWN"))),
    }
    assert derived_env(inv, a, facts["gpu-a"]) == {"GLOO_SOCKET_IFNAME": "ens5", "NCCL_IB_HCA": "mlx5_0,mlx5_1"}
    assert derived_env(inv, b, facts["gpu-b"]) == {"NCCL_SOCKET_IFNAME": "enp1s0", "GLOO_SOCKET_IFNAME": "enp1s0",
                                                   "NCCL_IB_HCA": "mlx5_0"}
    acts = plan_up(inv, facts)
    env_b = [x for x in acts[1].spec.run_argv() if x.startswith(("NCCL_", "GLOO_"))]
    assert env_b == ["GLOO_SOCKET_IFNAME=enp1s0", "NCCL_IB_HCA=mlx5_0", "NCCL_SOCKET_IFNAME=enp1s0"]
    # without facts (an offline plan) nothing is guessed; without InfiniBand no HCA is named
    assert derived_env(inv, b, None) == {}
    assert "NCCL_IB_HCA" not in derived_env(replace(inv, cluster=replace(inv.cluster, infiniband=False)), b,
                                            facts["gpu-b"])


def test_roce_gets_the_rocev2_gid_index_only_when_every_active_port_has_the_same():
    from bootstrap.cluster.plan import derived_env

    inv = gpu_inventory(infiniband=True)
    b = replace(inv.hosts[1], env=())
    same = HostFacts("20.10", rack=_rack("10.10.0.12", "ens6", ("mlx5_0 1 Ethernet 1@3 4: ACTIVE",
                                                                "mlx5_1 1 Ethernet 1@3 4: ACTIVE")))
    assert derived_env(inv, b, same)["NCCL_IB_GID_INDEX"] == "3"
    mixed = HostFacts("20.10", rack=_rack("10.10.0.12", "ens6", ("mlx5_0 1 Ethernet 1@3 4: ACTIVE",
                                                                 "mlx5_1 1 Ethernet 1@1 4: ACTIVE")))
    assert "NCCL_IB_GID_INDEX" not in derived_env(inv, b, mixed)
    old_format = HostFacts("20.10", rack=_rack("10.10.0.12", "ens6", ("mlx5_0 1 Ethernet 1 4: ACTIVE",)))
    assert "NCCL_IB_GID_INDEX" not in derived_env(inv, b, old_format)
