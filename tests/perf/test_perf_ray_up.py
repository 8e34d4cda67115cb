"""perf/ray_up.py: the cluster launcher's config a `ray up` user would write for the inventory."""
import yaml

from perf import ray_up as RU
from tests.support.fleet_inventories import hosts_yaml, write


def test_the_launcher_config_names_the_inventorys_nodes_image_and_ports(tmp_path):
    path = write(tmp_path, "cluster:\n  accelerator: none\n  image: reg:5000/vllm:1\n" + hosts_yaml(3))
    cfg = yaml.safe_load(RU.launcher_config(path, tmp_path).read_text())
    inv = RU.load_inventory(str(path))
    assert [w.ip for w in inv.workers] == ["10.0.0.2", "10.0.0.3"]
    assert cfg["provider"] == {"type": "local", "head_ip": inv.head.ip, "worker_ips": [w.ip for w in inv.workers]}
    assert "available_node_types" not in cfg  # the local provider refuses them
    assert cfg["min_workers"] == cfg["max_workers"] == len(inv.workers)
    assert cfg["docker"]["image"] == inv.cluster.image and cfg["docker"]["pull_before_run"] is False
    port = inv.cluster.ports.ray_gcs
    assert f"--port={port} --node-ip-address={inv.head.ip}" in cfg["head_start_ray_commands"][-1]
    assert cfg["worker_start_ray_commands"][-1] == f"ray start --address={inv.head.ip}:{port}"


def test_rsync_and_ssh_are_lent_read_only():
    opts = RU.LENT_TOOLS
    mounts = [opts[i + 1] for i in range(0, len(opts), 2) if opts[i] == "-v"]
    assert len(mounts) * 2 == len(opts)
    assert {m.split(":")[0] for m in mounts} >= {"/usr/bin/rsync", "/usr/bin/ssh"}
    assert all(m.endswith(":ro") and m.split(":")[0] == m.split(":")[1] for m in mounts)
