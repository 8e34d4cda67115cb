"""`bootstrap up/status/down` on a real multi-host sandbox: sshd, dockerd, registry and Ray.

Every claim is checked from outside the tool, with `docker exec` into the simulated hosts.
"""
import difflib
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from tests.support.sandbox import (
    CONTAINER,
    ROOT,
    cli,
    container_id,
    nft_ruleset,
    node_env,
    on_node,
    ray_alive_ids,
    ray_alive_ips,
    stranger_scan,
    writable_layers,
    write_inventory,
)

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def cluster(sandbox3):
    inv = str(sandbox3.inventory)
    cli("down", "--yes", "-i", inv)
    yield sandbox3
    cli("down", "--yes", "-i", inv)


# A sender that flips one byte early in the stream (inside the first layer), in the image's own
# Python on a node that has the image: what a faulty NIC or a tampering peer would deliver.
CORRUPT_SENDER = """
import socket, sys
ip, port, at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((ip, port)); srv.listen(1); srv.settimeout(120)
c, _ = srv.accept(); srv.close(); n = 0
while True:
    b = sys.stdin.buffer.read1(1 << 20)
    if not b:
        break
    if n <= at < n + len(b):
        b = bytearray(b); b[at - n] ^= 0xFF; b = bytes(b)
    try:
        c.sendall(b)
    except OSError:
        break
    n += len(b)
c.close()
"""


def _local_image_key(image):
    from bootstrap.remote.localdocker import image_key

    return image_key(image)


def _image_key(node, image):
    """The image's identity by content on `node` (containers.image_content_key): the mixed rack's node3 keeps
    images in containerd's store, where the same image has another ID than in Docker 20.10's."""
    from bootstrap.containers import image_content_key

    r = on_node(node, "docker", "image", "inspect", image, check=False)
    return image_content_key(json.loads(r.stdout)[0]) if r.returncode == 0 else None


def test_a_corrupted_stream_is_refused_and_load_image_sends_the_image_once_for_three_nodes(cluster, tmp_path,
                                                                                         request):
    """No node has the image and the registry is stopped. A stream with one flipped byte is refused
    and leaves nothing behind; then `up --load-image` streams an image from this machine to the
    head alone, and node2 and node3 get it from the head over the data network, ID checked.

    The image moved is the sandbox's node image (Debian with python3, 0.4 GB, `runtime: none`):
    the path is the same for any image, and the multi-GB vLLM image costs minutes per node here
    (a stream from this machine 86 s, a peer copy 110 s, a registry pull 71 s, measured
    2026-11-28), so the nodes get that one the way most users' nodes do, by the registry pull of
    the first `up` (the next test)."""
    from bootstrap.cluster.imagedist.run import receive_image
    from bootstrap.errors import PreflightFailed
    from bootstrap.inventory import load_inventory
    from bootstrap.remote.ssh import SSHHost

    n1, n2, n3 = cluster.nodes
    inv = load_inventory(str(cluster.inventory))
    port = inv.cluster.ports.image_copy
    # The corrupting sender runs here, on the sandbox network's gateway address. It sends a small
    # image made for this test (`docker load` reads a whole stream before it checks, and skips the
    # check of a layer the node already has): one layer of 4 MB of random bytes.
    small = f"bootstrap-sandbox/copy-check:{os.getpid()}"
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        info = tarfile.TarInfo("blob")
        info.size = 4 << 20
        tar.addfile(info, io.BytesIO(os.urandom(info.size)))
    subprocess.run(["docker", "import", str(layer), small], check=True, capture_output=True)
    request.addfinalizer(lambda: subprocess.run(["docker", "rmi", "-f", small], capture_output=True))
    gateway = subprocess.run(["docker", "network", "inspect", "--format", "{{(index .IPAM.Config 0).Gateway}}",
                              cluster.network], capture_output=True, text=True, check=True).stdout.strip()
    sender = subprocess.Popen(["sh", "-c", 'docker save "$0" | python3 -c "$1" "$2" "$3" 2000000',
                               small, CORRUPT_SENDER, gateway, str(port)], stderr=subprocess.DEVNULL)
    ssh = SSHHost(inv.host(n2.name), inv.cluster.ssh)
    try:
        with pytest.raises(PreflightFailed) as refused:
            receive_image(ssh, small, _local_image_key(small), "this machine", gateway, port)
    finally:
        ssh.close()
        sender.wait(timeout=120)
    assert "refused by docker load" in str(refused.value) and "diffID" in str(refused.value), refused.value
    assert _image_key(n2, small) is None  # nothing is left under the image's name

    assert cli("down", "--yes", "-i", str(cluster.inventory)).returncode == 0
    node_image = subprocess.run(["docker", "inspect", "--format", "{{.Config.Image}}", n1.container],
                                capture_output=True, text=True, check=True).stdout.strip()
    want = _local_image_key(node_image)
    for n in cluster.nodes:  # the vLLM image too: the next test's `up` pulls it into every node
        on_node(n, "docker", "rmi", "-f", node_image, inv.cluster.image)

    def copy(d):
        d["cluster"].update(image=node_image, runtime="none", peer_copy=True, container_name="bootstrap-copy-check")
    peers = write_inventory(cluster.inventory, tmp_path / "peers.yaml", copy)
    subprocess.run(["docker", "stop", "bootstrap-sandbox-registry"], check=True, capture_output=True)
    try:
        r = cli("up", "--yes", "-i", peers, "--load-image", "--json")
    finally:
        subprocess.run(["docker", "start", "bootstrap-sandbox-registry"], check=True, capture_output=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {h["host"]: h["image_from"] for h in doc["hosts"]} == {
        n1.name: "this machine", n2.name: n1.name, n3.name: n1.name}
    assert {"load-image", "copy-image"} <= set(doc["stages"]) and "pull" not in doc["stages"]
    assert [_image_key(n, node_image) for n in cluster.nodes] == [want] * 3
    assert cli("down", "--yes", "-i", peers).returncode == 0
    for n in cluster.nodes:
        on_node(n, "docker", "rmi", node_image)


#: each node's nftables ruleset before `up` (test_down_... compares it after `down`)
RULES_BEFORE = {}


def registry_sent() -> int:
    """Bytes the sandbox registry's container has sent (its eth0 counter)."""
    return int(subprocess.run(["docker", "exec", "bootstrap-sandbox-registry", "cat",
                               "/sys/class/net/eth0/statistics/tx_bytes"],
                              capture_output=True, text=True, check=True).stdout)


def compressed_size(image: str) -> int:
    """The image's layers and config as the registry stores them (its manifest's sizes)."""
    from bootstrap.cluster.imagedist.plan import split_image
    from bootstrap.sandbox.layout import registry_host_port
    from bootstrap.sandbox.registry import _registry_request

    ref = split_image(image)
    status, _, body = _registry_request(registry_host_port(), f"{ref.path}/manifests/{ref.tag}")
    assert status == 200, status
    doc = json.loads(body)
    return doc["config"]["size"] + sum(layer["size"] for layer in doc["layers"])


def test_up_forms_a_ray_cluster_with_one_node_per_host(cluster, tmp_path):
    """The first `up` on nodes without the image (the 3-node sandbox's nodes start empty: this is how
    they get the vLLM image) runs a registry mirror on the head that every node pulls through at
    once (peer_copy, the default on a real cluster; cluster.image_mirror, the sandbox's nginx): the
    registry sends the image once. Then it forms the Ray cluster."""
    from bootstrap.cluster.imagedist import plan as MR
    from bootstrap.inventory import load_inventory

    RULES_BEFORE.update({n.name: nft_ruleset(n) for n in cluster.nodes})
    inv = load_inventory(str(cluster.inventory))
    image = inv.cluster.image
    for n in cluster.nodes:  # cold by construction: neither the image nor the mirror's on any node
        on_node(n, "docker", "rmi", "-f", image, inv.cluster.image_mirror, check=False)
    mirrored = write_inventory(cluster.inventory, tmp_path / "mirror.yaml",
                               lambda d: d["cluster"].update(peer_copy=True))
    before = registry_sent()
    r = cli("up", "--yes", "-i", mirrored, "--json")
    sent = registry_sent() - before
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["changed"] is True
    head = cluster.nodes[0].name
    assert {h["host"]: h.get("image_from") for h in doc["hosts"]} == {
        n.name: "registry" if n.name == head else head for n in cluster.nodes}, doc["hosts"]
    assert "pull-mirror" in doc["stages"] and "copy-image" not in doc["stages"], doc["stages"]
    one = compressed_size(image)
    # one image (and the mirror's own, about 50 MB), where three pulls would send three
    assert sent < 1.25 * one, (sent, one)
    assert len({_image_key(n, image) for n in cluster.nodes}) == 1 and _image_key(cluster.nodes[0], image)
    for n in cluster.nodes:  # under the inventory's name only; the mirror and its cache are gone
        names = on_node(n, "docker", "images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert image in names and not [x for x in names if x.startswith("127.0.0.1:")], names
    gone = on_node(cluster.nodes[0], "docker", "ps", "-a", "-q", "--filter", f"name={MR.CONTAINER}").stdout
    assert gone.strip() == "" and MR.VOLUME not in on_node(cluster.nodes[0], "docker", "volume", "ls", "-q").stdout
    assert [(h["host"], h["action"], h["ray_alive"]) for h in doc["hosts"]] == [
        (n.name, "create", True) for n in cluster.nodes]
    # From outside the tool: a running container per host, VLLM_HOST_IP = the host's own IP,
    # and Ray's node IPs are exactly those.
    ips = []
    for n in cluster.nodes:
        assert container_id(n), f"no container on {n.name}"
        assert node_env(n, "VLLM_HOST_IP") == n.ip
        ips.append(n.ip)
    assert ray_alive_ips(cluster.nodes[0]) == sorted(ips)
    # `ray status` (the autoscaler's view) trails the GCS node table by a few seconds
    for _ in range(30):
        status = on_node(cluster.nodes[0], "docker", "exec", CONTAINER, "ray", "status").stdout
        if status.count(" node_") == 3:
            break
        time.sleep(1)
    assert status.count(" node_") == 3, status


def test_status_reports_every_node(cluster):
    r = cli("status", "-i", str(cluster.inventory), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["nodes"]
    assert [(x["host"], x["ip"], x["role"], x["container"], x["ray_alive"]) for x in rows] == [
        (n.name, n.ip, "head" if i == 0 else "worker", "running", True) for i, n in enumerate(cluster.nodes)]


def test_ray_refuses_a_client_without_the_token_and_the_token_rests_nowhere_in_docker(cluster):
    """cluster.ray_auth (on by default): every node runs Ray with token authentication, the token a
    0600 file mounted read-only; a Ray client on a member host without it is refused, with it let in.
    The fence (cluster.fence, on by default) is our own nftables table on every node."""
    n1, n2 = cluster.nodes[:2]
    gcs = f"{n1.ip}:6379"
    # a Ray client on a member host (in the node container's image and network) without the token,
    # then with it
    status = ["timeout", "90", "docker", "exec"]
    bare = on_node(n2, *status, "-e", "RAY_AUTH_MODE=disabled", "-e", "RAY_AUTH_TOKEN_PATH=/nonexistent", CONTAINER,
                   "ray", "status", "--address", gcs, check=False)
    assert bare.returncode != 0 and "AuthenticationError" in bare.stderr + bare.stdout, bare.stderr[-2000:]
    token_file = "/root/.bootstrap/sandbox/ray-auth-token"
    signed = on_node(n2, *status, CONTAINER, "ray", "status", "--address", gcs, check=False)
    assert signed.returncode == 0 and signed.stdout.count(" node_") == 3, signed.stderr[-2000:]
    tokens = set()
    for n in cluster.nodes:
        assert on_node(n, "stat", "-c", "%a", token_file).stdout.strip() == "600"
        tokens.add(on_node(n, "cat", token_file).stdout.strip())
        inspect = on_node(n, "docker", "inspect", CONTAINER).stdout
        assert "RAY_AUTH_TOKEN_PATH=/run/bootstrap/ray-auth-token" in inspect
        assert "table inet bootstrap_sandbox" in on_node(n, "nft", "list", "tables").stdout
    assert len(tokens) == 1 and len(token := tokens.pop()) >= 32  # one token for the whole cluster
    for n in cluster.nodes:  # Docker's records of the container (config, host config, volumes, its writable layer)
        uppers = writable_layers(n, [CONTAINER])
        found = on_node(n, "grep", "-rlF", token, "/var/lib/docker/containers", "/var/lib/docker/volumes", *uppers,
                        check=False)
        assert found.returncode == 1 and not found.stdout, f"{n.name}: the token is in {found.stdout}"


def test_without_the_fence_a_stranger_reaches_ray_and_the_exposure_report_says_so(cluster, tmp_path):
    """cluster.fence: false takes our table off (nothing else); `status --exposure` then names what a
    non-member reaches and exits 1, and a stranger's connection to Ray's GCS goes through. With the
    fence back (as an iptables chain on hosts without nft, then as our nftables table), the report
    exits 0 and the same connection is refused."""
    n1 = cluster.nodes[0]
    open_inv = write_inventory(cluster.inventory, tmp_path / "open.yaml", lambda d: d["cluster"].update(fence=False))
    assert cli("up", "--yes", "-i", open_inv).returncode == 0
    assert "bootstrap_sandbox" not in on_node(n1, "nft", "list", "tables").stdout
    r = cli("status", "-i", open_inv, "--exposure", "--json")
    assert r.returncode == 1, r.stderr
    rows = json.loads(r.stdout)["listeners"]
    gcs = next(x for x in rows if x["host"] == n1.name and x["port"] == 6379)
    assert (gcs["bind"], gcs["auth"], gcs["reach"], gcs["open_beyond"]) == (
        "all interfaces", "Ray token", "anyone", True)
    assert stranger_scan([n1])[(n1.ip, 6379)] == "open"
    # a host without nft gets the same fence as an iptables chain of ours (both families)
    for n in cluster.nodes:
        on_node(n, "mv", "/usr/sbin/nft", "/usr/sbin/nft.hidden")
    try:
        assert cli("up", "--yes", "-i", str(cluster.inventory)).returncode == 0
        chain = on_node(n1, "iptables", "-S", "bootstrap-sandbox").stdout
        assert "REJECT --reject-with tcp-reset" in chain and "6379" in chain, chain
        assert "-j bootstrap-sandbox" in on_node(n1, "ip6tables", "-S", "INPUT").stdout
        assert stranger_scan([n1])[(n1.ip, 6379)] == "refused"
        ipt = cli("status", "-i", str(cluster.inventory), "--exposure")
        assert ipt.returncode == 0 and "nothing open to non-members beyond SSH and the endpoint" in ipt.stdout
    finally:
        for n in cluster.nodes:
            on_node(n, "mv", "/usr/sbin/nft.hidden", "/usr/sbin/nft")
    # with nft back, the next `up` puts the nftables fence and takes the chain off
    assert cli("up", "--yes", "-i", str(cluster.inventory)).returncode == 0
    assert on_node(n1, "iptables", "-S", "bootstrap-sandbox", check=False).returncode != 0
    assert "-j bootstrap-sandbox" not in on_node(n1, "iptables", "-S", "INPUT").stdout
    fenced = cli("status", "-i", str(cluster.inventory), "--exposure")
    assert fenced.returncode == 0 and "nothing open to non-members beyond SSH and the endpoint" in fenced.stdout
    assert stranger_scan([n1])[(n1.ip, 6379)] == "refused"


def test_a_node_added_to_the_inventory_is_let_through_the_fence_of_an_earlier_up(cluster, tmp_path):
    """`up` on two of the nodes fences them for those two; the third, added to the inventory again,
    is not refused by that fence in the port preflight (found by perf/cold_up.py growing 2 -> 4
    nodes: "TCP port 6379 ... is not reachable from node3, node4"), and the fences then admit all three."""
    n1, n2, n3 = cluster.nodes
    two = write_inventory(cluster.inventory, tmp_path / "two.yaml", lambda d: d.update(hosts=d["hosts"][:2]))
    r = cli("up", "--yes", "-i", two)
    assert r.returncode == 0, r.stderr[-3000:]
    member = ("nft", "get", "element", "inet", "bootstrap_sandbox", "members4", f"{{ {n3.ip} }}")
    assert on_node(n1, *member, check=False).returncode != 0  # node1's fence admits node1 and node2 only
    r = cli("up", "--yes", "-i", str(cluster.inventory), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fence-members" in json.loads(r.stdout)["stages"]
    for n in (n1, n2):
        assert on_node(n, *member, check=False).returncode == 0, n.name
    assert ray_alive_ips(n1) == sorted(n.ip for n in cluster.nodes)


def test_second_up_changes_nothing(cluster):
    before = [container_id(n) for n in cluster.nodes]
    r = cli("up", "--yes", "-i", str(cluster.inventory), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["changed"] is False
    assert {h["action"] for h in doc["hosts"]} == {"keep"}
    assert [container_id(n) for n in cluster.nodes] == before
    human = cli("up", "--yes", "-i", str(cluster.inventory))
    assert "nothing changed" in human.stdout


def what_up_may_change(node):
    """The fence (nft's ruleset, without counters), the secrets on /run (names and digests) and Ray's token
    file of a node."""
    found = on_node(node, "sh", "-c", "nft -s list ruleset 2>&1; echo ==; find /run/bootstrap -type f -exec sha256sum "
                    "{} + 2>/dev/null | sort; echo ==; sha256sum /root/.bootstrap/*/ray-auth-token "
                    "/home/*/.bootstrap/*/ray-auth-token 2>/dev/null", check=False).stdout
    assert "table inet bootstrap_" in found and "ray-auth-token" in found, found
    return found


def test_changed_spec_recreates_only_that_host(cluster, tmp_path, monkeypatch):
    before = [container_id(n) for n in cluster.nodes]
    old_ids = ray_alive_ids(cluster.nodes[0]).get(cluster.nodes[2].ip, [])

    def add_env(doc):
        doc["hosts"][2]["env"] = {"NCCL_DEBUG": "INFO", "ODD_VALUE": "it's $(touch /tmp/pwned) `x`"}
    inv = write_inventory(cluster.inventory, tmp_path / "changed.yaml", add_env)
    # issue 68.2: up refused at its question changes nothing on any host, though what it would do also
    # changes every fence (another allowed network) and puts a new secret (c7795f8 had put both by then)
    monkeypatch.setenv("ASKED_FIRST", "a-new-secret-value")

    def more(doc):
        add_env(doc)
        doc["cluster"]["fence_allow"] = [*doc["cluster"].get("fence_allow", []), "198.51.100.0/24"]
        doc["cluster"]["secrets"] = [*doc["cluster"].get("secrets", []), "ASKED_FIRST"]
    kept = [what_up_may_change(n) for n in cluster.nodes]
    refused = cli("up", "-i", write_inventory(cluster.inventory, tmp_path / "more.yaml", more))
    assert refused.returncode == 2 and "No terminal to ask: pass --yes to go on" in refused.stderr, refused.stderr
    for n, was in zip(cluster.nodes, kept):
        now = what_up_may_change(n)
        assert now == was, (n.name, "\n".join(difflib.unified_diff(was.splitlines(), now.splitlines(), lineterm="")))
    assert [container_id(n) for n in cluster.nodes] == before
    # it would stop a running container: named, then asked; no terminal and no --yes: refused, nothing stopped
    refused = cli("up", "-i", inv)
    assert refused.returncode == 2, refused.stderr
    assert f"recreate: {cluster.nodes[2].name} (spec changed): its running container is stopped" in refused.stderr
    assert "up stops and recreates 1 running container of the cluster" in refused.stderr
    assert "No terminal to ask: pass --yes to go on" in refused.stderr and str(inv) in refused.stderr
    assert [container_id(n) for n in cluster.nodes] == before
    r = cli("up", "--yes", "-i", inv, "--json")
    assert r.returncode == 0, r.stderr
    acts = {h["host"]: (h["action"], h["reason"]) for h in json.loads(r.stdout)["hosts"]}
    n1, n2, n3 = cluster.nodes
    assert acts == {n1.name: ("keep", "up to date"), n2.name: ("keep", "up to date"),
                    n3.name: ("recreate", "spec changed")}
    after = [container_id(n) for n in cluster.nodes]
    assert after[:2] == before[:2] and after[2] != before[2]
    assert node_env(n3, "ODD_VALUE") == "it's $(touch /tmp/pwned) `x`"
    assert on_node(n3, "test", "-e", "/tmp/pwned", check=False).returncode == 1
    assert ray_alive_ips(n1) == sorted(n.ip for n in cluster.nodes)
    assert set(ray_alive_ids(n1)[n3.ip]) - set(old_ids)  # rejoined: a new registration, not the old one


def test_down_names_an_unreachable_host_and_still_tears_down_the_others(cluster):
    n1, n2, n3 = cluster.nodes
    subprocess.run(["docker", "pause", n3.container], check=True)
    try:
        r = cli("down", "--yes", "-i", str(cluster.inventory))
    finally:
        subprocess.run(["docker", "unpause", n3.container], check=True)
    assert r.returncode == 3, r.stderr
    assert n3.name in r.stderr and "cannot connect" in r.stderr
    assert container_id(n1) is None and container_id(n2) is None
    assert container_id(n3) is not None  # it was unreachable: left as it was
    r = cli("down", "--yes", "-i", str(cluster.inventory))
    assert r.returncode == 0, r.stderr
    assert all(container_id(n) is None for n in cluster.nodes)
    left = [on_node(n, "docker", "ps", "-aq", "--filter", "label=bootstrap.cluster").stdout.strip()
            for n in cluster.nodes]
    assert left == ["", "", ""]
    again = cli("down", "--yes", "-i", str(cluster.inventory))
    assert again.returncode == 0 and "nothing to remove on 3 host(s)" in again.stdout
    # the fence and the token went with the containers: every other rule is as it was before `up`
    for n in cluster.nodes:
        assert nft_ruleset(n) == RULES_BEFORE[n.name], n.name
        assert on_node(n, "test", "-e", "/root/.bootstrap/sandbox/ray-auth-token", check=False).returncode == 1


def test_image_without_ray_fails_preflight_and_changes_nothing(cluster, tmp_path):
    """cluster.runtime: ray on an image without Ray (recent vllm/vllm-openai images dropped it): say
    so before touching any container, naming runtime none first."""
    image = "bootstrap-sandbox/base:bookworm"  # a real image with no `ray` in it
    inv = write_inventory(cluster.inventory, tmp_path / "noray.yaml",
                          lambda d: (d["cluster"].update(image=image, peer_copy=False, runtime="ray"),
                                     d.update(hosts=d["hosts"][:2])))
    before = [container_id(n) for n in cluster.nodes]
    r = cli("up", "--yes", "-i", inv, "--load-image")  # no peer copy: the base image has no python3 to serve it
    assert r.returncode == 3, r.stderr
    assert "`ray` is not in the image" in r.stderr and "pip install" in r.stderr
    assert r.stderr.index("cluster.runtime: none") < r.stderr.index("pip install"), r.stderr
    assert [container_id(n) for n in cluster.nodes] == before


def test_jump_host_and_ssh_config_alias(cluster, tmp_path):
    """Reach node2 and node3 through node1 as a bastion, and node1 through a ~/.ssh/config alias."""
    n1 = cluster.nodes[0]
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host sandbox-head\n  HostName {n1.ip}\n  User root\n  IdentityFile {cluster.key}\n")

    def mutate(d):
        d["hosts"][0] = {"name": d["hosts"][0]["name"], "address": "sandbox-head", "ip": n1.ip}
        for h in d["hosts"][1:]:
            h["jump"] = f"root@{n1.ip}"
        d["cluster"]["ssh"].pop("user", None)
        d["cluster"]["ssh"].pop("key", None)
        for h in d["hosts"][1:]:
            h["key"] = str(cluster.key)
            h["user"] = "root"
    inv = write_inventory(cluster.inventory, tmp_path / "jump.yaml", mutate)
    import os
    env = dict(os.environ, HOME=str(home))
    r = subprocess.run([sys.executable, "-m", "bootstrap", "status", "-i", inv, "--json"], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=120)
    print(r.stdout, r.stderr)
    rows = json.loads(r.stdout)["nodes"]
    assert [x["reachable"] for x in rows] == [True, True, True], r.stderr
    # node2's sshd saw the login come from node1's address (the jump), not from this machine.
    logs = subprocess.run(["docker", "logs", cluster.nodes[1].container], capture_output=True, text=True)
    accepted = [ln for ln in (logs.stdout + logs.stderr).splitlines() if "Accepted publickey" in ln]
    assert any(f"from {n1.ip} " in ln for ln in accepted), accepted[-5:]
