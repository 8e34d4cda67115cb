"""`check-nccl` and `doctor` on the real sandbox, healthy and with planted faults.

The planted faults are real: a wrong interface name, a worker cut off from the data network with
iptables (SSH from this machine still works), a container started by hand with a wrong
VLLM_HOST_IP, an image without Ray, a paused (unreachable) worker.
"""
import json
import subprocess
import time

import pytest

from tests.support.sandbox import CONTAINER, cli, on_node, write_inventory

pytestmark = pytest.mark.sandbox
SIZES = "1024,65536,1048576"


@pytest.fixture(scope="module")
def cluster(sandbox3):
    inv = str(sandbox3.inventory)
    r = cli("up", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr
    yield sandbox3
    cli("down", "--yes", "-i", inv)


#: a mixture-of-experts model's config.json alone (a dry run reads nothing else): 8 experts, 4 heads
TINY_MOE_DIR = "/tmp/tiny-moe"
TINY_MOE = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
            "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "torch_dtype": "float32"}


def put_config(node, directory, config):
    """A config.json in the node's container (gone with the container)."""
    subprocess.run(["docker", "exec", "-i", node.container, "docker", "exec", "-i", CONTAINER, "sh", "-c",
                    f"mkdir -p {directory} && cat > {directory}/config.json"], input=json.dumps(config), text=True,
                   check=True, capture_output=True, timeout=60)


def leftovers(node):
    """Processes of the check still alive inside the node's container, and its script file."""
    ps = on_node(node, "docker", "exec", CONTAINER, "sh", "-c",
                 "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done", check=False).stdout
    procs = [ln for ln in ps.splitlines() if "nccl_check" in ln]
    f = on_node(node, "docker", "exec", CONTAINER, "test", "-e", "/tmp/bootstrap_nccl_check.py", check=False)
    return procs, f.returncode == 0


def nccl(inv, *extra):
    r = cli("check-nccl", "-i", str(inv), "--json", "--sizes", SIZES, "--iters", "5", *extra)
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def test_check_nccl_passes_over_gloo_with_bandwidth(cluster):
    r, doc = nccl(cluster.inventory)
    assert r.returncode == 0, r.stderr
    assert doc["ok"] and doc["backend"] == "gloo" and doc["world_size"] == 3
    assert doc["verdict"].startswith("PASS")
    assert [(n["host"], n["ok"], n["last_phase"]) for n in doc["nodes"]] == [
        (n.name, True, "done") for n in cluster.nodes]
    sizes = [b["bytes"] for b in doc["bandwidth"]]
    assert sizes == [1024, 65536, 1048576]
    for b in doc["bandwidth"]:
        assert b["busbw_GBps"] == pytest.approx(b["algbw_GBps"] * 2 * 2 / 3, rel=1e-3, abs=2e-6)
        assert b["algbw_GBps"] == pytest.approx(b["bytes"] / (b["time_us"] * 1e-6) / 1e9, rel=1e-2, abs=2e-6)
    assert [f for f in doc["findings"] if f["severity"] == "error"] == []
    for n in cluster.nodes:
        assert leftovers(n) == ([], False), n.name


def test_check_nccl_with_one_rank_reports_nothing_to_measure(cluster, tmp_path):
    """One node, one rank: every phase runs, but there is no communication to time."""
    inv = write_inventory(cluster.inventory, tmp_path / "one.yaml", lambda d: d.update(hosts=d["hosts"][:1]))
    r, doc = nccl(inv)
    assert r.returncode == 0, r.stderr
    assert doc["ok"] and doc["world_size"] == 1 and doc["bandwidth"] == []
    assert doc["bandwidth_note"] == "one rank: nothing to measure"
    assert doc["verdict"].endswith("bandwidth: one rank: nothing to measure"), doc["verdict"]
    text = cli("check-nccl", "-i", inv, "--sizes", SIZES, "--iters", "5")
    assert text.returncode == 0, text.stderr
    assert "all-reduce bandwidth (gloo): one rank: nothing to measure" in text.stdout
    assert "GB/s" not in text.stdout


def test_doctor_on_a_healthy_cluster_finds_no_error(cluster):
    r = cli("doctor", "-i", str(cluster.inventory), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 0, doc
    assert doc["ok"] and not [f for f in doc["findings"] if f["severity"] == "error"]


def test_wrong_interface_on_one_node(cluster, tmp_path):
    n3 = cluster.nodes[2]

    def bad_ifname(d):
        d["hosts"][2]["env"] = {"GLOO_SOCKET_IFNAME": "eth9"}
    inv = write_inventory(cluster.inventory, tmp_path / "badif.yaml", bad_ifname)
    # `up`'s rack preflight refuses it before anything changes, naming the node and the interface to use
    before = [on_node(n, "docker", "inspect", "-f", "{{.Id}}", CONTAINER, check=False).stdout for n in cluster.nodes]
    refused = cli("up", "--yes", "-i", inv)
    assert refused.returncode == 3, refused.stderr
    assert f"{n3.name}: GLOO_SOCKET_IFNAME=eth9 selects no interface" in refused.stderr, refused.stderr
    assert "set GLOO_SOCKET_IFNAME=eth0" in refused.stderr and "--skip-check" in refused.stderr
    assert [on_node(n, "docker", "inspect", "-f", "{{.Id}}", CONTAINER, check=False).stdout
            for n in cluster.nodes] == before
    # an expert who skips the check gets the cluster, and check-nccl and doctor name the same cause
    assert cli("up", "--yes", "-i", inv, "--skip-check", "socket-ifname").returncode == 0
    t = time.monotonic()
    r, doc = nccl(inv, "--timeout", "60")
    took = time.monotonic() - t
    assert r.returncode != 0 and not doc["ok"]
    assert took < 60 + 30, took
    assert doc["verdict"].startswith(f"FAIL on {n3.name}:"), doc["verdict"]
    f = [x for x in doc["findings"] if x["host"] == n3.name and x["id"] == "socket-ifname-missing"]
    assert f and "eth9" in f[0]["evidence"] and "eth0" in f[0]["fix"]
    d = cli("doctor", "-i", inv, "--json")
    assert d.returncode == 1
    assert any(x["id"] == "socket-ifname-missing" and x["host"] == n3.name for x in json.loads(d.stdout)["findings"])
    for n in cluster.nodes:
        assert leftovers(n) == ([], False), n.name
    assert cli("up", "--yes", "-i", str(cluster.inventory)).returncode == 0  # heal: node3 recreated


def test_worker_cut_off_from_the_data_network(cluster):
    n1, n2, n3 = cluster.nodes
    rules = [["iptables", "-I", "INPUT", "-s", n.ip, "-j", "DROP"] for n in (n1, n2)] + \
            [["iptables", "-I", "OUTPUT", "-d", n.ip, "-j", "DROP"] for n in (n1, n2)]
    for rule in rules:
        on_node(n3, *rule)
    try:
        t = time.monotonic()
        r, doc = nccl(cluster.inventory, "--timeout", "60")
        took = time.monotonic() - t
    finally:
        on_node(n3, "iptables", "-F", "INPUT")
        on_node(n3, "iptables", "-F", "OUTPUT")
    assert r.returncode != 0 and not doc["ok"]
    assert took < 60 + 30, took
    assert doc["verdict"].startswith(f"FAIL on {n3.name}: cannot reach the head"), doc["verdict"]
    rows = {n["host"]: n for n in doc["nodes"]}
    assert not rows[n3.name]["ok"] and rows[n2.name]["ok"]
    for n in cluster.nodes:
        assert leftovers(n) == ([], False), n.name
    # A later `up` heals whatever Ray lost during the partition.
    assert cli("up", "--yes", "-i", str(cluster.inventory), "--timeout", "120").returncode == 0


def test_doctor_names_a_wrong_vllm_host_ip(cluster):
    n2 = cluster.nodes[1]
    plan = json.loads(cli("plan", "-i", str(cluster.inventory), "--json").stdout)
    argv = next(p["argv"] for p in plan["replicas"][0]["hosts"] if p["host"] == n2.name)
    i = argv.index(f"VLLM_HOST_IP={n2.ip}")
    argv[i] = "VLLM_HOST_IP=172.31.240.99"  # what a hand-made container with a stale IP looks like
    argv = [a for j, a in enumerate(argv) if not (a == "--label" or (j and argv[j - 1] == "--label"))]
    argv = [a.replace("<host hard limit>", "20000") for a in argv]
    on_node(n2, "docker", "rm", "-f", CONTAINER)
    on_node(n2, *argv)
    r = cli("doctor", "-i", str(cluster.inventory), "--json")
    assert r.returncode == 1
    f = [x for x in json.loads(r.stdout)["findings"] if x["id"] == "ray-ip-mismatch"]
    assert f and f[0]["host"] == n2.name and "172.31.240.99" in f[0]["evidence"]
    up = cli("up", "--yes", "-i", str(cluster.inventory), "--json")  # heal: not created by bootstrap -> recreated
    acts = {h["host"]: h["action"] for h in json.loads(up.stdout)["hosts"]}
    assert acts[n2.name] == "recreate"


def test_doctor_names_an_unreachable_worker(cluster):
    n3 = cluster.nodes[2]
    subprocess.run(["docker", "pause", n3.container], check=True)
    try:
        r = cli("doctor", "-i", str(cluster.inventory), "--json")
    finally:
        subprocess.run(["docker", "unpause", n3.container], check=True)
    assert r.returncode == 1
    f = [x for x in json.loads(r.stdout)["findings"] if x["id"] == "host-unreachable"]
    assert [x["host"] for x in f] == [n3.name]


def test_doctor_names_an_image_without_ray(cluster, tmp_path):
    image = "bootstrap-sandbox/base:bookworm"
    inv = write_inventory(cluster.inventory, tmp_path / "noray.yaml",
                          lambda d: d["cluster"].update(image=image, container_name="noray"))
    n1 = cluster.nodes[0]
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    subprocess.run(["docker", "exec", "-i", n1.container, "docker", "load", "-q"], stdin=save.stdout, check=True,
                   capture_output=True)
    save.wait()
    # What vLLM's run_cluster.sh does with such an image: the node container dies at once.
    on_node(n1, "docker", "run", "-d", "--name", "noray", "--entrypoint", "sh", image, "-c", "ray start --block")
    try:
        r = cli("doctor", "-i", inv, "--json")
        doc = json.loads(r.stdout)
    finally:
        on_node(n1, "docker", "rm", "-f", "noray", check=False)
    assert r.returncode == 1
    ids = {(x["id"], x["host"]) for x in doc["findings"]}
    assert ("ray-missing", n1.name) in ids, ids


def test_the_same_nodes_as_a_gpu_cluster_run_the_gpu_paths_and_check_nccl_will_not_pass_on_fake_gpus(cluster):
    """The shared sandbox's nodes are GPU-shaped (2 fake GPUs each, tests/support/sandbox.shared_shape);
    its GPU inventory makes them a GPU cluster: `up` starts every container with --gpus all (node3 of the
    mixed rack, whose GPUs come through CDI only: --device nvidia.com/gpu=all) and tells Ray
    the GPU count (`plan` shows the same offline), the container's nvidia-smi lists that node's own
    GPUs, `status` shows them, `serve
    --dry-run` plans a copy per node (data parallel: the model fits one node), TP = GPUs per node and
    PP = nodes on Ray with --pp, and refuses a split the model cannot take,
    `check-nccl` fails in one line naming every node because CUDA in the container (vLLM's CPU build)
    cannot use the GPUs nvidia-smi lists, `--backend gloo` still measures over 2 ranks per node, and
    `top` shows a GPU made busy on one node, and `doctor` names a node whose driver differs. The CPU
    cluster is put back at the end."""
    from bootstrap.sandbox import gpu as sb_gpu

    gpu_inv = str(cluster.gpu_inventory)
    n1, n2, n3 = cluster.nodes
    try:
        r = cli("plan", "-i", gpu_inv, "--json")  # offline: from the inventory alone; each host's argv whole
        assert r.returncode == 0, r.stderr
        argvs = [" ".join(h["argv"]) for h in json.loads(r.stdout)["replicas"][0]["hosts"]]
        assert [a.count("--gpus all") for a in argvs] == [1, 1, 1] and [a.count("--num-gpus=2") for a in argvs] == \
            [1, 1, 1], argvs
        r = cli("up", "--yes", "-i", gpu_inv)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "Ray cluster ready: 3 node(s), 6 GPU(s)" in r.stdout, r.stdout[-1500:]
        uuids = set()
        for n in cluster.nodes:
            listed = on_node(n, "docker", "exec", CONTAINER, "nvidia-smi", "-L").stdout.splitlines()
            assert len(listed) == 2 and all(ln.startswith("GPU ") for ln in listed), (n.name, listed)
            uuids |= {ln.split("UUID: ")[1] for ln in listed}
        assert len(uuids) == 6  # each node its own GPUs
        # by the way each host's Docker gives them (the plan above could not know: it is offline): node3 of the
        # mixed rack has no toolkit hook, only a CDI spec, and gets them through CDI
        reqs = {n.name: json.loads(on_node(n, "docker", "inspect", "--format", "{{json .HostConfig.DeviceRequests}}",
                                           CONTAINER).stdout) for n in cluster.nodes}
        assert {name: [(d["Driver"], d["DeviceIDs"], d["Capabilities"]) for d in r] for name, r in reqs.items()} == {
            n1.name: [("", None, [["gpu"]])], n2.name: [("", None, [["gpu"]])],
            n3.name: [("cdi", ["nvidia.com/gpu=all"], None)]}, reqs
        st = json.loads(cli("status", "-i", gpu_inv, "--json").stdout)
        assert [(x["host"], x["gpus"], x["ray_alive"]) for x in st["nodes"]] == [
            (n.name, 2.0, True) for n in cluster.nodes]

        # the model fits one node (the fit reads each GPU's memory from nvidia-smi): a copy per node
        r = cli("serve", "-i", gpu_inv, "/opt/models/tiny-llama", "--dry-run")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "split:   DP=3 x TP=2: the model fits one node, so each of the 3 nodes serves a copy" in r.stdout, \
            r.stdout
        assert "backend: native (data parallel: vLLM's own DP" in r.stdout, r.stdout
        assert r.stdout.count("--data-parallel-size 3 --data-parallel-size-local 1") == 3, r.stdout
        # one copy across the nodes, as the mission's layout: TP = GPUs per node, PP = nodes, on Ray
        r = cli("serve", "-i", gpu_inv, "/opt/models/tiny-llama", "--dry-run", "--pp", "3")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "backend: ray (GPU cluster running Ray)" in r.stdout
        assert "split:   TP=2 PP=3: as given by --tp/--pp" in r.stdout, r.stdout
        assert "--tensor-parallel-size 2 --pipeline-parallel-size 3 --distributed-executor-backend ray" in r.stdout
        r = cli("serve", "-i", gpu_inv, "/opt/models/tiny-llama", "--dry-run", "--tp", "3")
        assert r.returncode != 0 and "4 attention heads do not divide by TP=3" in r.stderr, r.stderr[-1000:]
        # data parallel on the GPU nodes: an engine per GPU (2 per node), vLLM's own DP, native backend
        r = cli("serve", "-i", gpu_inv, "/opt/models/tiny-llama", "--dry-run", "--dp", "6")
        assert r.returncode == 0, r.stderr[-2000:]
        assert "split:   DP=6 x TP=1: 6 data parallel engines, 2 per node, behind the head's API server" in r.stdout
        assert "backend: native (--dp: vLLM's own data parallel" in r.stdout, r.stdout
        cmds = [next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(n.name + " ")) for n in cluster.nodes]
        assert all("--data-parallel-size 6 --data-parallel-size-local 2" in c for c in cmds), cmds
        assert [c.split("--data-parallel-start-rank ")[1].split()[0] if "--headless" in c else None for c in cmds] == \
            [None, "2", "4"], cmds
        r = cli("serve", "-i", gpu_inv, "/opt/models/tiny-llama", "--dry-run", "--dp", "3")
        assert r.returncode == 0 and "split:   DP=3 x TP=2: 3 data parallel engines, 1 per node" in r.stdout, r.stdout
        r = cli("serve", "-i", gpu_inv, "/opt/models/tiny-llama", "--dry-run", "--dp", "4")
        assert r.returncode == 2 and "--dp 4 does not fit 3 node(s) x 2 GPUs" in r.stderr, r.stderr[-1000:]

        # a mixture-of-experts model (its config.json on every node): expert parallel over the 6 GPUs, with the
        # all-to-all the image's vLLM has and the hardware runs (no DeepEP in the image, no RDMA: over NCCL)
        for n in cluster.nodes:
            put_config(n, TINY_MOE_DIR, TINY_MOE)
        r = cli("serve", "-i", gpu_inv, TINY_MOE_DIR, "--dry-run")
        assert r.returncode == 0, r.stderr[-2000:]
        assert ("split:   DP=6 x TP=1, EP=6: a mixture-of-experts model (8 experts): 6 engines (2 per node) share "
                "the experts over all 6 GPUs; all-to-all allgather_reducescatter: over NCCL (no DeepEP: "
                "deepep_low_latency needs the deep_ep module, which the image does not have)") in r.stdout, r.stdout
        assert "backend: native (expert parallel: vLLM's data parallel engines" in r.stdout, r.stdout
        cmds = [next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(n.name + " ")) for n in cluster.nodes]
        assert all("--data-parallel-size 6 --data-parallel-size-local 2" in c and
                   "--enable-expert-parallel --all2all-backend allgather_reducescatter" in c for c in cmds), cmds
        r = cli("serve", "-i", gpu_inv, TINY_MOE_DIR, "--dry-run", "--all2all", "deepep_low_latency")
        assert r.returncode == 2 and "--all2all deepep_low_latency: deepep_low_latency needs the deep_ep module" in \
            r.stderr, r.stderr[-1000:]
        r = cli("serve", "-i", gpu_inv, "/opt/models/tiny-llama", "--dry-run", "--ep")
        assert r.returncode == 2 and "--ep: the model has no experts" in r.stderr, r.stderr[-1000:]

        r, doc = nccl(gpu_inv)
        assert r.returncode == 1 and not doc["ok"], r.stderr[-2000:]
        assert doc["verdict"].startswith(f"FAIL on {n1.name}, {n2.name}, {n3.name}: CUDA in the container sees 0 of "
                                         "the 2 GPU(s) nvidia-smi lists, so NCCL cannot run"), doc["verdict"]
        assert "Torch not compiled with CUDA enabled" in doc["verdict"]
        assert {f["id"] for f in doc["findings"] if f["severity"] == "error"} == {"cuda-unusable"}
        r, doc = nccl(gpu_inv, "--backend", "gloo")
        assert r.returncode == 0 and doc["ok"] and doc["world_size"] == 6, r.stderr[-2000:]
        for n in cluster.nodes:
            assert leftovers(n) == ([], False), n.name

        assert sb_gpu.set_load(cluster.workdir, n2.name, n2.container, utilization=100, memory_used=78000) == 1
        t = cli("top", "-i", gpu_inv, "--once", "--json")
        rows = {x["name"]: x for x in json.loads(t.stdout)["nodes"]}
        assert (rows[n2.name]["gpu_util"], round(rows[n2.name]["gpu_mem"])) == (100.0, 96), rows[n2.name]
        assert rows[n1.name]["gpu_util"] == 0.0 and rows[n3.name]["gpu_mem"] == 0.0

        # doctor reads the GPU facts: node3 given another driver after `up` is named
        sb_gpu.set_gpus(cluster.workdir, n3.name, driver="570.86.15")
        d = cli("doctor", "-i", gpu_inv, "--json")
        found = [(f["id"], f["host"]) for f in json.loads(d.stdout)["findings"]]
        assert ("driver-mismatch", n3.name) in found and ("driver-mismatch", n1.name) not in found, found
        assert not any(i == "gpu-not-visible" for i, _ in found), found
    finally:
        sb_gpu.set_gpus(cluster.workdir, n3.name, driver=sb_gpu.DRIVER)
        sb_gpu.set_load(cluster.workdir, n2.name, n2.container, utilization=0, memory_used=0)
        back = cli("up", "--yes", "-i", str(cluster.inventory))
    assert back.returncode == 0, back.stderr[-2000:]
    assert "Ray cluster ready: 3 node(s), 0 GPU(s)" in back.stdout


def test_cuda_that_cannot_initialise_on_one_node_is_refused_before_any_container_starts(cluster, tmp_path):
    """Issue 64: nvidia-smi lists node2's GPUs while CUDA says error 802 (its Fabric Manager is not running: the
    fake GPU layer's cuda_error, read by the CUDA-shaped variant of the image, whose torch answers as a CUDA build
    on the node's fake GPUs). `up` with the GPU inventory on that image probes CUDA in a throw-away container of
    it on every node, given the GPUs each node's way (node3: CDI), before any container starts: it refuses node2
    in one line naming 802, the Fabric Manager and its fix, node1 and node3 pass, and the running containers are
    left as they were. `doctor` names it afterwards too."""
    from bootstrap.sandbox import gpu as sb_gpu
    from bootstrap.sandbox.cluster import push_cuda_shaped
    from tests.support.sandbox import container_id

    n1, n2, n3 = cluster.nodes
    image = push_cuda_shaped(cluster.workdir, log=lambda m: print(f"sandbox: {m}", flush=True))
    inv = write_inventory(cluster.gpu_inventory, tmp_path / "cuda.yaml", lambda d: d["cluster"].update(image=image))
    before = [container_id(n) for n in cluster.nodes]
    sb_gpu.set_gpus(cluster.workdir, n2.name, cuda_error=802)
    try:
        r = cli("up", "--yes", "-i", inv)
        d = cli("doctor", "-i", inv, "--json")
    finally:
        sb_gpu.set_gpus(cluster.workdir, n2.name, cuda_error=0)
    assert r.returncode == 3, r.stderr[-3000:]
    assert (f"{n2.name}: CUDA in the container sees 0 of the 2 GPU(s) nvidia-smi lists, so NCCL cannot run: CUDA "
            "error 802 (system not yet initialized), an NVSwitch host whose NVIDIA Fabric Manager is not running") \
        in r.stderr, r.stderr[-3000:]
    assert "systemctl enable --now nvidia-fabricmanager" in r.stderr and "Traceback" not in r.stderr
    assert f"{n1.name}: CUDA" not in r.stderr and f"{n3.name}: CUDA" not in r.stderr, r.stderr[-3000:]
    assert [container_id(n) for n in cluster.nodes] == before  # nothing was started or stopped
    found = {(f["id"], f["host"]) for f in json.loads(d.stdout)["findings"]}
    assert ("cuda-unusable", n2.name) in found and ("cuda-unusable", n1.name) not in found, found


def test_a_mixture_of_experts_model_on_cpu_nodes_is_refused_data_and_expert_parallel(cluster):
    """vLLM-CPU cannot run MoE across DP engines nor expert parallel: refused before anything starts."""
    inv = str(cluster.inventory)
    for n in cluster.nodes:
        put_config(n, TINY_MOE_DIR, TINY_MOE)
    r = cli("serve", "-i", inv, TINY_MOE_DIR, "--dry-run", "--dp", "3")
    assert r.returncode == 2 and "no all_gatherv" in r.stderr, r.stderr[-1000:]
    r = cli("serve", "-i", inv, TINY_MOE_DIR, "--ep")
    assert r.returncode == 2 and "--ep: vLLM-CPU runs no expert parallel" in r.stderr, r.stderr[-1000:]
    # without either, it is split TP x PP like any model
    r = cli("serve", "-i", inv, TINY_MOE_DIR, "--dry-run")
    assert r.returncode == 0 and "split:   TP=1 PP=3: 4 attention heads do not divide by 3 nodes" in r.stdout, \
        r.stdout + r.stderr[-1000:]
