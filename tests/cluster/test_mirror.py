"""The registry mirror of a cold `up` (bootstrap/cluster/imagedist/plan.py and run.py, checks/mirror_forward.py): names,
nginx's configuration, the commands, and the forwarder over real sockets."""
import http.server
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bootstrap.cluster.imagedist import plan as MR
from bootstrap.containers import image_content_key

FORWARD = Path(__file__).resolve().parents[2] / "checks" / "mirror_forward.py"


@pytest.mark.parametrize("image, want", [
    ("172.31.240.2:5000/bootstrap/vllm-cpu:amx-1", ("172.31.240.2:5000", "bootstrap/vllm-cpu", "amx-1", None)),
    ("vllm/vllm-openai:v0.32.0", (MR.DOCKER_HUB, "vllm/vllm-openai", "v0.32.0", None)),
    ("nginx", (MR.DOCKER_HUB, "library/nginx", "latest", None)),
    ("docker.io/library/ubuntu:22.04", (MR.DOCKER_HUB, "library/ubuntu", "22.04", None)),
    ("localhost:5000/a/b", ("localhost:5000", "a/b", "latest", None)),
    ("registry.example.com/team/vllm", ("registry.example.com", "team/vllm", "latest", None)),
    ("ghcr.io/x/y@sha256:" + "a" * 64, ("ghcr.io", "x/y", None, "sha256:" + "a" * 64)),
    ("ghcr.io/x/y:1@sha256:" + "b" * 64, ("ghcr.io", "x/y", "1", "sha256:" + "b" * 64)),
])
def test_an_image_is_split_as_docker_reads_it(image, want):
    r = MR.split_image(image)
    assert (r.registry, r.path, r.tag, r.digest) == want


def test_nodes_pull_by_a_loopback_name_and_an_image_pinned_by_digest_is_not_mirrored():
    assert MR.mirror_ref("10.0.0.5:5000/team/vllm:v1", 8476) == "127.0.0.1:8476/team/vllm:v1"
    assert MR.mirror_ref("vllm/vllm-openai:v0.32.0", 9000) == "127.0.0.1:9000/vllm/vllm-openai:v0.32.0"
    assert MR.mirror_ref("ghcr.io/x/y@sha256:" + "a" * 64, 8476) is None


def test_the_mirror_speaks_plain_http_only_where_the_heads_docker_does():
    conf = ('{"IndexConfigs": {"10.0.0.5:5000": {"Name": "10.0.0.5:5000", "Secure": false}, '
            '"docker.io": {"Name": "docker.io", "Secure": true}}}')
    assert MR.plain_http("10.0.0.5:5000", conf) is True
    assert MR.plain_http("registry.example.com", conf) is False
    assert MR.plain_http("docker.io", conf) is False
    assert MR.plain_http("localhost:5000", "") is True
    assert MR.plain_http("10.0.0.5:5000", "not json") is False


def test_the_mirror_serves_the_members_on_loopback_and_the_data_plane_ip_only_and_fetches_each_slice_once():
    conf = MR.nginx_conf("10.0.0.5:5000", False, "192.168.1.1", 8476, ["192.168.1.2", "192.168.1.3"])
    listens = [ln.strip() for ln in conf.splitlines() if ln.strip().startswith("listen")]
    assert listens == ["listen 127.0.0.1:8476;", "listen 192.168.1.1:8476;"]
    assert "0.0.0.0" not in conf and "listen 8476" not in conf
    access = [ln.strip() for ln in conf.splitlines() if ln.strip().startswith(("allow", "deny all;"))]
    assert access[:4] == ["allow 127.0.0.1;", "allow 192.168.1.2;", "allow 192.168.1.3;", "deny all;"]
    blobs = conf[conf.index("/blobs/sha256:"):conf.index("location /v2/ {")]
    for line in ("slice 8m;", "proxy_cache_key $uri$slice_range;", "proxy_set_header Range $slice_range;",
                 "proxy_cache_lock on;", "proxy_cache_valid 200 206 1d;"):
        assert line in blobs
    rest = conf[conf.index("location /v2/ {"):]
    assert "proxy_cache " not in rest  # manifests by tag and auth: never cached
    assert conf.count("limit_except GET { deny all; }") == 2  # pulls only, no push
    assert "proxy_pass http://registry;" in conf and "server 10.0.0.5:5000;" in conf
    assert "proxy_set_header Host 10.0.0.5:5000;" in conf and "proxy_ssl" not in conf


def test_a_tls_registry_is_verified_by_name():
    conf = MR.nginx_conf("registry.example.com", True, "fd00::1", 8476, ["fd00::2"])
    assert "server registry.example.com:443;" in conf and "proxy_pass https://registry;" in conf
    for line in ("proxy_ssl_verify on;", "proxy_ssl_name registry.example.com;", "proxy_ssl_server_name on;"):
        assert line in conf
    assert "listen [fd00::1]:8476;" in conf and "allow fd00::2;" in conf


def test_the_mirror_container_is_least_privilege_and_removed_with_its_cache():
    run = " ".join(MR.run_argv("nginx:1.27-alpine", "conf"))
    for part in ("--cap-drop ALL", "--read-only", "--user 65534:65534", "--security-opt no-new-privileges",
                 "--pull never", f"--name {MR.CONTAINER}", f"-v {MR.VOLUME}:/cache"):
        assert part in run
    assert "--privileged" not in run and "--cap-add" not in run
    prep = " ".join(MR.prepare_argv("nginx:1.27-alpine"))
    assert "--cap-add CHOWN" in prep and "--network none" in prep and "chown" in prep
    assert f"docker rm -f {MR.CONTAINER}" in " ".join(MR.remove_argv())
    assert f"docker volume rm -f {MR.VOLUME}" in " ".join(MR.remove_argv())


def test_the_head_pulls_from_its_own_loopback_and_the_others_through_the_forwarder():
    ref = "127.0.0.1:8476/team/vllm:v1"
    assert MR.pull_argv(ref, None, 8476, "10.0.0.1", "SCRIPT") == ("docker", "pull", "--quiet", ref)
    assert MR.pull_argv(ref, "10.0.0.1", 8476, "10.0.0.2", "SCRIPT") == (
        "python3", "-c", "SCRIPT", "8476", "10.0.0.1", "10.0.0.2", "docker", "pull", "--quiet", ref)
    assert MR.probe_status("HTTP/1.1 200 OK\r\n") == 200
    assert MR.probe_status("HTTP/1.1 401 Unauthorized") == 401
    assert MR.probe_status("") is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_forwarder_passes_a_nodes_loopback_to_the_head_while_its_command_runs():
    """A real HTTP server on 127.0.0.2 (the head) at the port; the forwarder on 127.0.0.1 runs a
    command that fetches through it; the server sees the node's source address."""
    port = free_port()
    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            seen.append(self.client_address[0])
            body = b"x" * 3_000_000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.2", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        fetch = (f"import urllib.request as u; b = u.urlopen('http://127.0.0.1:{port}/v2/x', timeout=20).read(); "
                 f"print(len(b))")
        r = subprocess.run([sys.executable, str(FORWARD), str(port), "127.0.0.2", "127.0.0.3",
                            sys.executable, "-c", fetch], capture_output=True, text=True, timeout=60)
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3000000"
    assert seen == ["127.0.0.3"]  # connected from the node's data-plane IP
    with socket.socket() as s:  # the forwarder is gone with its command: nothing listens there again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_the_forwarder_gives_the_commands_exit_status_and_refuses_a_taken_port():
    port = free_port()
    r = subprocess.run([sys.executable, str(FORWARD), str(port), "127.0.0.2", "127.0.0.1",
                        sys.executable, "-c", "raise SystemExit(7)"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 7
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        r = subprocess.run([sys.executable, str(FORWARD), str(port), "127.0.0.2", "127.0.0.1",
                            sys.executable, "-c", "print('ran')"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 3 and "ran" not in r.stdout
    assert f"127.0.0.1:{port} is taken" in r.stderr and "cluster.ports.image_copy" in r.stderr


# -- distribute with the mirror (the remote steps answered by stand-ins: tests/support/fake_hosts.py) --------------
IMAGE = "10.0.0.9:5000/team/vllm:v1"
REF = "127.0.0.1:8476/team/vllm:v1"
REGISTRY_CONFIG = '{"IndexConfigs": {"10.0.0.9:5000": {"Name": "10.0.0.9:5000", "Secure": false}}}'


class Events:
    def __init__(self):
        self.seen = []

    def event(self, host, stage, status, detail=""):
        self.seen.append((host, stage, status, detail))


#: `docker image inspect --format '{{json .}}' IMAGE` of the image every host pulled (its ID and content)
INSPECT_ABC = '{"Id": "sha256:abc", "RootFS": {"Type": "layers", "Layers": ["sha256:l1"]}, "Config": {}}\n'


def _mirror_cluster(tmp_path, head_answers=(), node_answers=None, n=3):
    from bootstrap.cluster import facts as F
    from tests.support.fake_hosts import FakeHost, fake_session
    from tests.support.fleet_inventories import hosts_yaml, load

    inv = load(tmp_path, f"cluster:\n  accelerator: none\n  image: {IMAGE}\n  image_mirror: reg/nginx:1\n"
               + hosts_yaml(n))
    node_answers = node_answers or {}
    fakes = {}
    for h in inv.hosts:
        common = [("docker tag", (0, "", "")), ("'{{json .}}' " + IMAGE, (0, INSPECT_ABC, "")),
                  ("'{{.Size}}' " + IMAGE, (0, "2147483648\n", ""))]
        if h.is_head:
            answers = [*head_answers, ("'{{.Id}}' reg/nginx:1", (0, "sha256:ngx\n", "")),
                       ("RegistryConfig", (0, REGISTRY_CONFIG, "")),
                       ("docker volume create", (0, "", "")), ("docker run -d", (0, "", "")),
                       ("GET /v2/", (0, "HTTP/1.1 200 OK\r\n", "")), ("docker rm -f", (0, "", "")),
                       (f"docker pull --quiet {REF}", (0, REF + "\n", "")), *common]
        else:
            answers = [*node_answers.get(h.name, ()), (f"docker pull --quiet {REF}", (0, REF + "\n", "")), *common]
        fakes[h.name] = FakeHost(h.name, answers)
    ev = Events()
    sess = fake_session(inv, fakes, reporter=ev)
    facts = {h.name: F.HostFacts(docker_version="20.10", runtimes=("runc",), gpus=None, nofile_hard=1024,
                                 container=None, image_id=None) for h in inv.hosts}
    return inv, sess, fakes, facts, ev


def test_a_cold_cluster_pulls_through_the_heads_mirror_at_once_and_the_mirror_is_removed(tmp_path):
    from bootstrap.cluster.imagedist import run as IM

    inv, sess, fakes, facts, ev = _mirror_cluster(tmp_path)
    got = IM.distribute(sess, facts, IMAGE, load=False, pull=False)
    assert got == {"h0": "registry", "h1": "h0", "h2": "h0"}
    head = fakes["h0"].commands
    run = next(c for c in head if "docker run -d" in c)
    assert "listen 10.0.0.1:8476;" in run and "allow 10.0.0.2;" in run and "proxy_pass http://registry;" in run
    pull = head.index(next(c for c in head if "docker pull" in c))
    removed = [i for i, c in enumerate(head) if "docker rm -f bootstrap-image-mirror" in c and "volume create" not in c]
    assert head.index(run) < pull and removed and removed[0] > pull  # up for the pulls, gone after them
    for n in ("h1", "h2"):
        pull = next(c for c in fakes[n].commands if "docker pull" in c)
        # through its own loopback, forwarded to the head's data-plane IP from its own
        assert pull.startswith("python3 -c ") and f" 8476 10.0.0.1 {inv.host(n).ip} docker pull --quiet {REF}" in pull
        assert any(c.startswith("sh -c 'docker tag") and IMAGE in c for c in fakes[n].commands)
    assert ("h0", "image-mirror", "done", "10.0.0.1:8476 caching http://10.0.0.9:5000 in 0.0s") in [
        (h, s, st, d.replace(d.split(" in ")[-1], "0.0s") if s == "image-mirror" else d) for h, s, st, d in ev.seen]
    assert not [e for e in ev.seen if e[2] == "warning"]
    # each pull's done line says how much it brought, and how fast (the image's size in the host's Docker)
    dones = [d for h, s, st, d in ev.seen if s == "pull-mirror" and st == "done"]
    assert len(dones) == 3 and all(d.endswith("s: 2.1 GB unpacked") or "2.1 GB unpacked (" in d for d in dones), dones


@pytest.mark.parametrize("answer, why", [
    ("HTTP/1.1 401 Unauthorized\r\n", "the registry asks for credentials"),
    ("HTTP/1.1 502 Bad Gateway\r\n", "the registry answers it with HTTP 502"),
    ("", "it does not answer"),
])
def test_a_mirror_that_cannot_serve_is_removed_and_named_and_nobody_pulls_through_it(tmp_path, answer, why):
    from bootstrap.cluster.imagedist import run as IM

    inv, sess, fakes, facts, ev = _mirror_cluster(
        tmp_path, head_answers=[("GET /v2/", (0, answer, "")), ("docker logs", (0, "", "upstream timed out"))])
    assert IM._through_mirror(sess, inv.head, list(inv.hosts), IMAGE) == ({}, "")
    warn = [d for h, s, st, d in ev.seen if s == "image-mirror" and st == "warning"]
    assert len(warn) == 1 and why in warn[0] and "h0 pulls the image and copies it to the others instead" in warn[0]
    assert not [c for f in fakes.values() for c in f.commands if "docker pull" in c]
    assert "docker rm -f bootstrap-image-mirror" in fakes["h0"].commands[-1]


def test_a_node_whose_pull_through_the_mirror_fails_is_left_for_a_peer_copy(tmp_path):
    from bootstrap.cluster.imagedist import run as IM

    inv, sess, fakes, facts, ev = _mirror_cluster(
        tmp_path, node_answers={"h2": [("docker pull", (3, "", "mirror_forward: 127.0.0.1:8476 is taken"))]})
    got, head_id = IM._through_mirror(sess, inv.head, list(inv.hosts), IMAGE)
    # the head's image by its content (hosts of either image store compare alike: facts.image_key)
    assert got == {"h0": "registry", "h1": "h0"} and head_id == image_content_key(json.loads(INSPECT_ABC))
    warn = [(h, d) for h, s, st, d in ev.seen if s == "pull-mirror" and st == "warning"]
    assert warn and warn[0][0] == "h2" and "127.0.0.1:8476 is taken" in warn[0][1] and "from a peer" in warn[0][1]


def test_the_head_failing_through_its_mirror_falls_back_for_everyone_and_a_digest_pin_is_not_mirrored(tmp_path):
    from bootstrap.cluster.imagedist import run as IM

    inv, sess, fakes, facts, ev = _mirror_cluster(
        tmp_path, head_answers=[(f"docker pull --quiet {REF}", (1, "", "manifest unknown"))])
    assert IM._through_mirror(sess, inv.head, list(inv.hosts), IMAGE) == ({}, "")
    assert any("h0's pull through its mirror failed" in d and "manifest unknown" in d for _, _, _, d in ev.seen)
    assert IM._through_mirror(sess, inv.head, list(inv.hosts), "ghcr.io/x/y@sha256:" + "a" * 64) == ({}, "")


def test_a_pulls_done_line_gives_the_images_size_and_rate_and_nothing_it_does_not_know():
    from bootstrap.cluster.imagedist import run as IM

    assert IM.pulled(2_000_000_000, 100.0) == "2.0 GB unpacked (20.0 MB/s)"
    assert IM.pulled(2_000_000_000, 0.0) == "2.0 GB unpacked"
    assert IM.pulled(None, 5.0) == "" and IM.pulled(0, 5.0) == ""
