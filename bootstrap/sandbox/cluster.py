"""Bring the sandbox up and down: a bridge network, a registry and N nodes with sshd (+ dockerd).

Layout of the work directory (default ~/.cache/bootstrap-sandbox, env BOOTSTRAP_SANDBOX_DIR):

    id_ed25519, id_ed25519.pub   client key (root on every node accepts it)
    known_hosts                  every node IP's host key: connect with verification on
    inventory.yaml               the native inventory for the running sandbox
    state.json                   what sandbox_up started (read by sandbox_info)
    hostkeys/<node>/             per-node host keys (kept across up/down)
    nodes/<node>/sandbox/        files mounted read-only at /sandbox in the node
    nodes/<node>/docker/         the node's /var/lib/docker (removed by sandbox_down)
    registry/                    the registry's storage (pushed images survive restarts)
    wheels/, base/, logs/, tmp/  image build inputs, caches and logs
"""
from __future__ import annotations

import concurrent.futures as cf
import ipaddress
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from bootstrap.remote import localdocker as LD

from . import gpu as GPU
from . import links as LK
from ._util import (
    LABEL,
    LABEL_KV,
    ROLE_LABEL,
    Log,
    SandboxBadInput,
    SandboxError,
    client,
    container_logs,
    file_lock,
    image_exists,
    inspect,
    labelled,
    nolog,
    push_logged,
    remove_containers,
    require_docker,
    sdk,
    tag_image,
    tail,
    timed,
)
from .gpu import GpuShape
from .images import SandboxImages, ensure_images, mirror_stage, planned_images

NETWORK = "bootstrap-sandbox"
DEFAULT_SUBNET = "172.31.240.0/24"
REGISTRY_CONTAINER = "bootstrap-sandbox-registry"
NODE_CONTAINER_PREFIX = "bootstrap-sandbox-node"
REGISTRY_PORT = 5000
#: Repository of the vLLM image inside the sandbox registry.
REMOTE_REPO = "bootstrap/vllm-cpu"
#: ... and of its Ray-less variant (`sandbox up --without-ray`).
RAY_LESS_REMOTE_REPO = "bootstrap/vllm-cpu-noray"
#: Repository of the registry mirror's image (cluster.image_mirror) inside the sandbox registry.
MIRROR_REMOTE_REPO = "bootstrap/nginx"
KIND_LABEL = "bootstrap.sandbox.kind"
KINDS = ("full", "sshd")
#: Offsets inside the subnet: .1 gateway, .2 registry, .11.. nodes.
REGISTRY_OFFSET = 2
FIRST_NODE_OFFSET = 11
STATE_VERSION = 1

#: Capabilities that make docker-in-docker work where --privileged does not (no CAP_SYS_RESOURCE):
#: `--cap-add ALL --cap-drop SYS_RESOURCE --security-opt seccomp=unconfined --security-opt
#: apparmor=unconfined -v /sys/fs/cgroup:/sys/fs/cgroup`, as Docker SDK arguments.
FULL_NODE_OPTIONS = {
    "cap_add": ["ALL"], "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
}
FULL_NODE_VOLUMES = ("/sys/fs/cgroup:/sys/fs/cgroup",)


@dataclass(frozen=True)
class SandboxNode:
    name: str
    ip: str
    container: str


@dataclass(frozen=True)
class SandboxInfo:
    workdir: Path
    network: str
    subnet: str
    #: "IP:5000", as the nodes reach the registry.
    registry: str
    #: The vLLM CPU image reference written into the inventory (nodes pull it from the registry;
    #: the same reference is tagged on this machine for `docker save`).
    image: str
    nodes: tuple[SandboxNode, ...]
    inventory: Path
    key: Path
    known_hosts: Path
    #: "full" (sshd + dockerd) or "sshd" (sshd only).
    kind: str = "full"
    #: GPUs and InfiniBand/RoCE ports each node shows (bootstrap.sandbox.gpu); none by default.
    gpu: GpuShape = GPU.NO_GPU
    #: send rates of the registry's and the nodes' interfaces (bootstrap.sandbox.links); none by default.
    links: LK.LinkShape = LK.NO_LINKS

    @property
    def gpu_inventory(self) -> Path | None:
        """The same nodes as a GPU cluster (inventory-gpu.yaml), for a sandbox with GPUs."""
        return gpu_inventory_path(self.workdir) if self.gpu.gpus else None

    @property
    def head(self) -> SandboxNode:
        return self.nodes[0]


# --- helpers ---------------------------------------------------------------------------------------


def subnet_from_env() -> str:
    return os.environ.get("BOOTSTRAP_SANDBOX_SUBNET", DEFAULT_SUBNET)


def registry_host_port() -> int:
    """The registry's port on this machine's loopback (env BOOTSTRAP_SANDBOX_REGISTRY_PORT)."""
    value = os.environ.get("BOOTSTRAP_SANDBOX_REGISTRY_PORT", str(REGISTRY_PORT))
    try:
        port = int(value)
    except ValueError:
        raise SandboxBadInput(f"BOOTSTRAP_SANDBOX_REGISTRY_PORT={value!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise SandboxBadInput(f"BOOTSTRAP_SANDBOX_REGISTRY_PORT={value!r} is not a port number")
    return port


#: The private ranges (RFC 1918) a sandbox network may take.
_PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")


def plan_addresses(subnet: str, nodes: int) -> tuple[str, str, list[str]]:
    """(gateway, registry IP, node IPs) for a subnet; raises when the nodes do not fit."""
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise SandboxBadInput(f"sandbox subnet {subnet!r} (BOOTSTRAP_SANDBOX_SUBNET) is not an IPv4 network: "
                              f"{exc}") from None
    if not any(net.subnet_of(ipaddress.IPv4Network(p)) for p in _PRIVATE):
        raise SandboxBadInput(f"sandbox subnet {subnet} (BOOTSTRAP_SANDBOX_SUBNET) is not a private network: a "
                              "Docker bridge network of its own needs one inside 10.0.0.0/8, 172.16.0.0/12 or "
                              "192.168.0.0/16 (not loopback, link-local, multicast or public addresses)")
    if nodes < 1:
        raise SandboxError(f"a sandbox needs at least one node, not {nodes}")
    usable = net.num_addresses - 1 - FIRST_NODE_OFFSET  # minus the broadcast address
    if nodes > usable:
        raise SandboxBadInput(
            f"{nodes} nodes do not fit in {subnet} (at most {max(usable, 0)}): "
            "set BOOTSTRAP_SANDBOX_SUBNET to a larger network"
        )
    ips = [str(net[FIRST_NODE_OFFSET + i]) for i in range(nodes)]
    return str(net[1]), str(net[REGISTRY_OFFSET]), ips


def node_name(i: int) -> str:
    return f"node{i}"


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def ensure_keypair(path: Path, comment: str) -> str:
    """An ed25519 key in OpenSSH format at path (mode 600) and path.pub; returns the public line."""
    pub = path.with_name(path.name + ".pub")
    if path.exists() and pub.exists():
        return pub.read_text().strip()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    line = f"{public} {comment}"
    _write_private(path, private)
    pub.write_text(line + "\n")
    pub.chmod(0o644)
    return line


def _inspect(kind: str, name: str) -> dict | None:
    return inspect(kind, name)


def _labelled(kind: str, *filters: str) -> list[str]:
    """Every sandbox container (running or not) or network, or those that also carry ``filters``."""
    return labelled(kind, LABEL_KV, *filters)


def _http_status(url: str, *, timeout: float = 5) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0


# --- network and registry --------------------------------------------------------------------------


def _ensure_network(subnet: str, gateway: str, log: Log) -> None:
    net = _inspect("network", NETWORK)
    if net is not None:
        labels = net.get("Labels") or {}
        if labels.get(LABEL) != "1":
            raise SandboxError(
                f"a Docker network named {NETWORK} exists but was not made by the sandbox: "
                f"remove it (`docker network rm {NETWORK}`) or rename it"
            )
        subnets = [c.get("Subnet") for c in (net.get("IPAM") or {}).get("Config") or []]
        if subnet in subnets:
            return
        log(f"network {NETWORK} has subnet {subnets}, want {subnet}: recreating")
        remove_containers(_labelled("container"), check=False, timeout=120)
        with sdk(f"docker network rm {NETWORK}"):
            client().api.remove_network(NETWORK)
    try:
        ipam = LD.types.IPAMConfig(pool_configs=[LD.types.IPAMPool(subnet=subnet, gateway=gateway)])
        client().api.create_network(NETWORK, driver="bridge", ipam=ipam, labels={LABEL: "1"})
    except LD.ERRORS as exc:
        msg = tail(LD.explain(exc), 3)
        hint = ""
        if "overlap" in msg.lower():
            hint = " -- another network uses that range: set BOOTSTRAP_SANDBOX_SUBNET (e.g. 10.123.45.0/24)"
        raise SandboxError(f"cannot create Docker network {NETWORK} ({subnet}): {msg}{hint}") from None
    log(f"network {NETWORK} ({subnet}) created")


def _ensure_registry(images: SandboxImages, workdir: Path, registry_ip: str, port: int, log: Log) -> None:
    cur = _inspect("container", REGISTRY_CONTAINER)
    if cur is not None:
        running = (cur.get("State") or {}).get("Running")
        nets = (cur.get("NetworkSettings") or {}).get("Networks") or {}
        ip_now = (nets.get(NETWORK) or {}).get("IPAMConfig", {}) or {}
        bindings = ((cur.get("HostConfig") or {}).get("PortBindings") or {}).get(f"{REGISTRY_PORT}/tcp") or []
        same = (
            running
            and cur.get("Config", {}).get("Image") == images.registry
            and ip_now.get("IPv4Address") == registry_ip
            and any(b.get("HostPort") == str(port) for b in bindings)
        )
        if same:
            _wait_registry(port, log)
            return
        remove_containers([REGISTRY_CONTAINER], timeout=120)
    storage = workdir / "registry"
    storage.mkdir(parents=True, exist_ok=True)
    cl = client(120)
    try:
        # docker run -d --name R --label ... --network N --ip IP -p 127.0.0.1:PORT:5000
        #   -v STORAGE:/var/lib/registry --restart unless-stopped IMAGE
        cl.containers.create(
            images.registry, name=REGISTRY_CONTAINER,
            labels={LABEL: "1", ROLE_LABEL: "registry"},
            network=NETWORK, networking_config={NETWORK: cl.api.create_endpoint_config(ipv4_address=registry_ip)},
            ports={f"{REGISTRY_PORT}/tcp": ("127.0.0.1", port)},
            volumes=[f"{storage}:/var/lib/registry"],
            restart_policy={"Name": "unless-stopped"},
        ).start()
    except LD.ERRORS as exc:
        msg = tail(LD.explain(exc), 3)
        remove_containers([REGISTRY_CONTAINER], check=False)
        hint = ""
        if "address already in use" in msg or "port is already allocated" in msg:
            hint = f" -- port {port} on 127.0.0.1 is taken: set BOOTSTRAP_SANDBOX_REGISTRY_PORT"
        raise SandboxError(f"cannot start the sandbox registry: {msg}{hint}") from None
    _wait_registry(port, log)
    log(f"registry {REGISTRY_CONTAINER} at {registry_ip}:{REGISTRY_PORT} (this machine: 127.0.0.1:{port})")


def _wait_registry(port: int, log: Log, deadline_s: float = 60) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        if _http_status(f"http://127.0.0.1:{port}/v2/", timeout=2) == 200:
            return
        if time.monotonic() > deadline:
            logs = container_logs(REGISTRY_CONTAINER, 20)
            raise SandboxError(
                f"the sandbox registry did not answer on 127.0.0.1:{port} within {deadline_s:.0f}s: "
                f"{tail(logs, 5)}"
            )
        time.sleep(0.3)


MANIFEST_ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
))


def _registry_request(port: int, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/{path}", method=method, headers={"Accept": MANIFEST_ACCEPT}
    )
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers or {}), b""
    except (urllib.error.URLError, OSError):
        return 0, {}, b""


def registry_has(port: int, repo: str, tag: str) -> bool:
    return _registry_request(port, f"{repo}/manifests/{tag}", method="HEAD")[0] == 200


def _registry_drop_other_tags(port: int, repo: str, keep_tag: str, log: Log) -> None:
    """Delete the repository's other tags (older recipes, GBs each) and garbage-collect."""
    status, _, body = _registry_request(port, f"{repo}/tags/list")
    if status != 200:
        return
    tags = json.loads(body or b"{}").get("tags") or []
    keep = _registry_request(port, f"{repo}/manifests/{keep_tag}", method="HEAD")[1]
    keep_digest = {k.lower(): v for k, v in keep.items()}.get("docker-content-digest")
    deleted = []
    for tag in tags:
        if tag == keep_tag:
            continue
        _, headers, _ = _registry_request(port, f"{repo}/manifests/{tag}", method="HEAD")
        dig = {k.lower(): v for k, v in headers.items()}.get("docker-content-digest")
        if dig and dig != keep_digest:
            if _registry_request(port, f"{repo}/manifests/{dig}", method="DELETE")[0] in (200, 202):
                deleted.append(tag)
    if deleted:
        cl = client(600)
        try:  # docker exec R docker-registry garbage-collect CONFIG (best effort, as before)
            ex = cl.api.exec_create(REGISTRY_CONTAINER, ["docker-registry", "garbage-collect",
                                                         "/etc/docker/registry/config.yml"])
            cl.api.exec_start(ex["Id"])
        except LD.ERRORS:
            pass
        log(f"registry: removed superseded {repo} tag(s) {', '.join(deleted)}")


def _push_image(images: SandboxImages, workdir: Path, registry_ip: str, port: int, log: Log,
                source: str | None = None, repo: str = REMOTE_REPO, tag: str | None = None) -> str:
    """Push the vLLM image (or `source`, a variant of it or another image, into `repo` as `tag`)
    into the registry unless there, and tag the nodes' reference here."""
    tag = tag or images.vllm_tag
    source = source or images.vllm
    nodes_ref = f"{registry_ip}:{REGISTRY_PORT}/{repo}:{tag}"
    tag_image(source, nodes_ref)
    if registry_has(port, repo, tag):
        log(f"registry already has {repo}:{tag}")
        _registry_drop_other_tags(port, repo, tag, log)
        return nodes_ref
    local_ref = f"localhost:{port}/{repo}:{tag}"
    tag_image(source, local_ref)
    logfile = workdir / "logs" / "push.log"
    with timed(log, f"pushing {local_ref} (log: {logfile})"):
        push_logged(local_ref, logfile, what=f"docker push {local_ref}", timeout=3600)
    _registry_drop_other_tags(port, repo, tag, log)
    return nodes_ref


def mirror_tag() -> str:
    """The mirror image's tag in the sandbox registry: its recipe's hash."""
    return mirror_stage().recipe


def push_ray_less(workdir: Path, log: Log = nolog) -> str:
    """The Ray-less variant of the vLLM image (built if needed) in the running sandbox's registry;
    returns the reference the nodes pull."""
    from .images import ensure_ray_less_image

    workdir = Path(workdir).expanduser()
    info = sandbox_info(workdir)
    if info is None:
        raise SandboxError("no sandbox is running: `bootstrap sandbox up` first")
    images = ensure_images(workdir, log)
    source = ensure_ray_less_image(workdir, log)
    return _push_image(images, workdir, info.registry.split(":")[0], registry_host_port(), log,
                       source=source, repo=RAY_LESS_REMOTE_REPO)


# --- nodes -----------------------------------------------------------------------------------------


def _host_key(workdir: Path, name: str) -> Path:
    return workdir / "hostkeys" / name / "ssh_host_ed25519_key"


def _prepare_node_files(workdir: Path, name: str, client_pub: str, registry: str, number: int,
                        gpu: GpuShape) -> tuple[Path, str]:
    """Write nodes/<name>/sandbox (mounted at /sandbox), with node `number`'s GPU shape; return (dir,
    host public key line)."""
    hostkey = _host_key(workdir, name)
    host_pub = ensure_keypair(hostkey, f"root@{name}")
    src = workdir / "nodes" / name / "sandbox"
    src.mkdir(parents=True, exist_ok=True)
    (src / "authorized_keys").write_text(client_pub + "\n")
    shutil.copyfile(hostkey, src / "ssh_host_ed25519_key")
    os.chmod(src / "ssh_host_ed25519_key", 0o600)
    (src / "ssh_host_ed25519_key.pub").write_text(host_pub + "\n")
    daemon = {
        "insecure-registries": [registry],
        "log-driver": "json-file",
        "log-opts": {"max-size": "20m", "max-file": "2"},
        **GPU.daemon_runtimes(gpu),
    }
    (src / "daemon.json").write_text(json.dumps(daemon, indent=2) + "\n")
    GPU.write_node(src, number, gpu)
    return src, host_pub


def _start_node(node: SandboxNode, workdir: Path, image: str, kind: str) -> None:
    """docker run -d --name C --hostname N --label ... --network NET --ip IP --init --tmpfs /run -v SRC:/sandbox:ro
    [full: FULL_NODE_OPTIONS -v DATA:/var/lib/docker | sshd: -e SANDBOX_NO_DOCKERD=1] IMAGE"""
    src = workdir / "nodes" / node.name / "sandbox"
    cl = client(180)
    opts: dict = {
        "name": node.container, "hostname": node.name,
        "labels": {LABEL: "1", ROLE_LABEL: "node", KIND_LABEL: kind},
        "network": NETWORK, "networking_config": {NETWORK: cl.api.create_endpoint_config(ipv4_address=node.ip)},
        "init": True,
        # /run in memory, as on a systemd host (bootstrap keeps the secrets there and refuses a /run on disk)
        "tmpfs": {"/run": "mode=755"},
    }
    volumes = [f"{src}:/sandbox:ro"]
    if kind == "full":
        data = workdir / "nodes" / node.name / "docker"
        data.mkdir(parents=True, exist_ok=True)
        opts.update(FULL_NODE_OPTIONS)
        volumes += [*FULL_NODE_VOLUMES, f"{data}:/var/lib/docker"]
    else:
        opts["environment"] = {"SANDBOX_NO_DOCKERD": "1"}
    with sdk(f"starting {node.container}"):
        cl.containers.create(image, volumes=volumes, **opts).start()


def _ssh_client(key: Path, known_hosts: Path, ip: str, timeout: float):
    import paramiko

    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        ip, port=22, username="root", key_filename=str(key), look_for_keys=False,
        allow_agent=False, timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
    )
    return client


def ssh_run(key: Path, known_hosts: Path, ip: str, command: str, timeout: float = 30) -> tuple[int, str]:
    """Run one command on a node over SSH (host key verified); returns (exit status, output)."""
    client = _ssh_client(key, known_hosts, ip, timeout=min(timeout, 10))
    try:
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out + err
    finally:
        client.close()


def _wait_node(node: SandboxNode, kind: str, key: Path, known_hosts: Path, deadline: float) -> float:
    """Poll until the node answers over SSH (and its dockerd does); return seconds waited."""
    start = time.monotonic()
    probe = "docker info --format '{{.ServerVersion}}'" if kind == "full" else "true"
    last = "no answer yet"
    while True:
        state = _inspect("container", node.container)
        if state is None or not (state.get("State") or {}).get("Running"):
            logs = container_logs(node.container, 20)
            raise SandboxError(
                f"{node.name}: container {node.container} is not running: "
                f"{tail(logs, 8)}"
            )
        try:
            rc, out = ssh_run(key, known_hosts, node.ip, probe, timeout=10)
            if rc == 0:
                return time.monotonic() - start
            last = f"`{probe}` exit {rc}: {tail(out, 2)}"
        except Exception as exc:  # not up yet: refused, banner timeout, auth before keys installed
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() > deadline:
            raise SandboxError(
                f"{node.name} ({node.ip}) not ready in time: {last} "
                f"(see `docker logs {node.container}`)"
            )
        time.sleep(0.5)


def _interface_of(key: Path, known_hosts: Path, ip: str) -> str:
    rc, out = ssh_run(key, known_hosts, ip, "ip -o -4 addr show")
    if rc != 0:
        raise SandboxError(f"{ip}: `ip -o -4 addr show` failed: {tail(out, 3)}")
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet" and parts[3].split("/")[0] == ip:
            return parts[1].split("@")[0]
    raise SandboxError(f"{ip}: no interface carries {ip}: {tail(out, 5)}")


def _remove_node_dirs(workdir: Path, log: Log) -> None:
    nodes_dir = workdir / "nodes"
    if not nodes_dir.exists():
        return
    with timed(log, f"removing node data under {nodes_dir}"):
        dirs = [d for d in nodes_dir.iterdir() if d.is_dir()]
        with cf.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda d: shutil.rmtree(d, ignore_errors=True), dirs))
        shutil.rmtree(nodes_dir, ignore_errors=True)
    if nodes_dir.exists():
        raise SandboxError(f"could not remove {nodes_dir}: remove it by hand")


# --- state and inventory ---------------------------------------------------------------------------


def _state_path(workdir: Path) -> Path:
    return workdir / "state.json"


def _write_state(info: SandboxInfo, extra: dict) -> None:
    data = asdict(info)
    data = json.loads(json.dumps(data, default=str))
    data.update(extra, version=STATE_VERSION)
    path = _state_path(info.workdir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _read_state(workdir: Path) -> tuple[SandboxInfo, dict] | None:
    path = _state_path(workdir)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SandboxError(f"{path}: unreadable sandbox state ({exc}): run sandbox down") from None
    if data.get("version") != STATE_VERSION:
        return None
    info = SandboxInfo(
        workdir=Path(data["workdir"]), network=data["network"], subnet=data["subnet"],
        registry=data["registry"], image=data["image"],
        nodes=tuple(SandboxNode(**n) for n in data["nodes"]),
        inventory=Path(data["inventory"]), key=Path(data["key"]),
        known_hosts=Path(data["known_hosts"]), kind=data.get("kind", "full"),
        gpu=GpuShape.from_dict(data.get("gpu")),
        links=LK.LinkShape.from_dict(data.get("links")),
    )
    return info, data


def _write_inventory(info: SandboxInfo, iface: str) -> None:
    doc = {
        "cluster": {
            "name": "sandbox",
            "image": info.image,
            "accelerator": "none",
            # Inside a node, `--ipc host` would share the node container's 64 MiB /dev/shm, and
            # vLLM's CPU workers need more: give each cluster container its own.
            "ipc_host": False,
            "shm_size": "1g",
            # The nodes are containers on one machine and share its cores, which vLLM-CPU cannot know:
            # its automatic binding pins each node's worker to the first core it sees, so every node's
            # worker (its start's imports included) ran on one core while the other idled. Unbound,
            # with the one OpenMP thread per worker that binding gave: no busy-waiting threads beyond
            # the cores (nobind alone gave each worker 2 and slowed decoding; perf/README.md).
            # `fork`: the engine core and workers inherit the API server's imports instead of importing
            # torch and vLLM again (the sandbox image lets vLLM-CPU take it; sandbox/images.py).
            "env": {"GLOO_SOCKET_IFNAME": iface, "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
                    "VLLM_WORKER_MULTIPROC_METHOD": "fork"},
            # `bootstrap monitor`: the sandbox image carries Debian's Prometheus and node exporter
            "monitor": {"image": info.image, "node_exporter_image": info.image},
            # The sandbox registry runs on the same machine as the nodes: pulling costs no network
            # there, and a peer copy (uncompressed docker save | docker load on the same 2 cores)
            # is slower than N pulls (bench/cold_up.py). On a real cluster leave it on.
            "peer_copy": False,
            # with peer_copy: the registry mirror on the head of a cold cluster (Debian's nginx here)
            "image_mirror": f"{info.registry}/{MIRROR_REMOTE_REPO}:{mirror_tag()}",
            "ssh": {
                "user": "root",
                "key": str(info.key),
                "known_hosts": str(info.known_hosts),
                "connect_timeout": 5,
            },
        },
        "hosts": [{"name": n.name, "address": n.ip} for n in info.nodes],
    }
    header = (
        f"# Written by `bootstrap sandbox up` ({len(info.nodes)} {info.kind} nodes on {info.subnet}).\n"
        f"# Nodes pull the image from the sandbox registry {info.registry}; the first host is the head.\n"
    )
    text = header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    tmp = info.inventory.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, info.inventory)
    gpu_inv = info.gpu_inventory
    if gpu_inv is None:
        gpu_inventory_path(info.workdir).unlink(missing_ok=True)
        return
    # The same nodes as a GPU cluster (vLLM's CPU build still computes on the CPU): `--gpus all`,
    # the GPU count checked against nvidia-smi, Ray told the count; with --ib the HCAs, IPC_LOCK,
    # memlock and NCCL's socket interface.
    c = doc["cluster"]
    c.update(accelerator="gpu", gpus_per_node=info.gpu.gpus, infiniband=info.gpu.ib is not None)
    c["env"] = {**c["env"], "NCCL_SOCKET_IFNAME": iface}
    gpu_header = header.replace("nodes on", "GPU-shaped nodes on", 1) + (
        f"# GPU-shaped ({info.gpu.describe()}): see bootstrap/sandbox/gpu.py for what is real.\n")
    tmp = gpu_inv.with_suffix(".tmp")
    tmp.write_text(gpu_header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    os.replace(tmp, gpu_inv)


def gpu_inventory_path(workdir: Path) -> Path:
    """The GPU-shaped sandbox's second inventory: the same nodes as a GPU cluster."""
    return Path(workdir) / "inventory-gpu.yaml"


# --- public ----------------------------------------------------------------------------------------


def sandbox_info(workdir: Path) -> SandboxInfo | None:
    """What sandbox_up started in workdir, if all of it (registry and nodes) is running; else None."""
    workdir = Path(workdir).expanduser()
    state = _read_state(workdir)
    if state is None:
        return None
    info, _ = state
    try:
        running = set(labelled("container", LABEL_KV, running_only=True))
    except SandboxError:  # no Docker: nothing is up
        return None
    wanted = {REGISTRY_CONTAINER, *(n.container for n in info.nodes)}
    return info if wanted <= running else None


def use_image(workdir: Path, *, ray: bool, log: Log = nolog) -> SandboxInfo:
    """Point the running sandbox's inventory at its vLLM image (ray) or the Ray-less variant of it
    (pushed into the registry first). The nodes stay as they are; returns what is running."""
    workdir = Path(workdir).expanduser()
    info = sandbox_info(workdir)
    state = _read_state(workdir)
    if info is None or state is None:
        raise SandboxError("no sandbox is running: `bootstrap sandbox up` first")
    if ray:
        want = f"{info.registry}/{REMOTE_REPO}:{planned_images(workdir).vllm_tag}"
    else:
        want = push_ray_less(workdir, log)
    if want == info.image:
        return info
    with file_lock(workdir / ".sandbox.lock"):
        info = replace(info, image=want)
        _, extra = state
        _write_inventory(info, extra["interface"])
        keep = {k: v for k, v in extra.items() if k not in asdict(info) and k != "version"}
        _write_state(info, keep)
    log(f"inventory {info.inventory}: image {want}" + ("" if ray else " (no Ray in it; no runtime key)"))
    return info


def _shape_one(container: str, ip: str, bits: int | None, node_image: str) -> str:
    """docker run --rm --network container:C --cap-drop ALL --cap-add NET_ADMIN --entrypoint sh NODE_IMAGE
    -c SCRIPT: tc inside ``container``'s network namespace (links.shape_script); its qdisc line."""
    cl = client(120)
    with sdk(f"shaping the link of {container}"):
        out = cl.containers.run(node_image, ["-c", LK.shape_script(ip, bits)], entrypoint="sh", remove=True,
                                network_mode=f"container:{container}", cap_drop=["ALL"], cap_add=["NET_ADMIN"],
                                labels={LABEL: "1", ROLE_LABEL: "tc"}, stdout=True, stderr=True)
    line = out.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if not LK.shaped_line_ok(line[0], bits):
        raise SandboxError(f"shaping the link of {container}: tc shows {line[0]!r}, "
                           f"wanted {LK.human_rate(bits) if bits else 'no tbf'}")
    return line[0]


def set_links(workdir: Path, shape: LK.LinkShape, log: Log = nolog) -> SandboxInfo:
    """Give the running sandbox's registry and nodes these send rates (or take a former shape off:
    a sandbox that never had one is not touched), and record it in the state. Returns what runs."""
    workdir = Path(workdir).expanduser()
    state = _read_state(workdir)
    info = sandbox_info(workdir)
    if info is None or state is None:
        raise SandboxError("no sandbox is running: `bootstrap sandbox up` first")
    _, extra = state
    if not shape.shaped and not info.links.shaped:
        return info
    registry_ip = info.registry.split(":")[0]
    targets = [(REGISTRY_CONTAINER, registry_ip, shape.registry_bits)]
    targets += [(n.container, n.ip, shape.node_bits) for n in info.nodes]
    with file_lock(workdir / ".sandbox.lock"), timed(log, f"{shape.describe()} ({len(targets)} interface(s))"):
        with cf.ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
            lines = list(pool.map(lambda t: _shape_one(*t, extra["node_image"]), targets))
        info = replace(info, links=shape)
        keep = {k: v for k, v in extra.items() if k not in asdict(info) and k != "version"}
        _write_state(info, keep)
    for (container, _, _), line in zip(targets, lines):
        log(f"{container} {line}")
    return info


def sandbox_down(workdir: Path, log: Log = nolog) -> None:
    """Remove every container and network labelled bootstrap.sandbox=1 and the nodes' data.

    Idempotent. Keeps the images, the keys, the registry's storage and the build caches.
    """
    workdir = Path(workdir).expanduser()
    require_docker()
    with file_lock(workdir / ".sandbox.lock"):
        containers = _labelled("container")
        if containers:
            with timed(log, f"removing {len(containers)} container(s)"):
                remove_containers(containers, timeout=600)
        networks = _labelled("network")
        for net in networks:
            with sdk(f"docker network rm {net}"):
                client().api.remove_network(net)
            log(f"network {net} removed")
        _remove_node_dirs(workdir, log)
        for path in (_state_path(workdir), workdir / "inventory.yaml"):
            path.unlink(missing_ok=True)
        left = _labelled("container") + _labelled("network")
        if left:
            raise SandboxError(f"sandbox down: still present: {', '.join(left)}")
        log("sandbox is down")


def sandbox_up(nodes: int, workdir: Path, log: Log = nolog, *, kind: str = "full",
               gpu: GpuShape = GPU.NO_GPU) -> SandboxInfo:
    """Start (or reuse) a sandbox of `nodes` nodes; returns what is running.

    full: every node runs sshd and its own dockerd (insecure-registries lists the sandbox registry).
    sshd: sshd only, for fan-out tests with many hosts. `gpu` gives every node GPUs and HCAs as SSH
    and Docker see them (bootstrap.sandbox.gpu; kind full only).
    """
    workdir = Path(workdir).expanduser()
    if kind not in KINDS:
        raise SandboxError(f"unknown sandbox kind {kind!r}: use one of {', '.join(KINDS)}")
    if gpu.shaped and kind != "full":
        raise SandboxError("a GPU-shaped sandbox needs kind full: its GPUs are seen through each node's dockerd")
    subnet = subnet_from_env()
    gateway, registry_ip, ips = plan_addresses(subnet, nodes)
    port = registry_host_port()
    require_docker()
    workdir.mkdir(parents=True, exist_ok=True)

    planned = planned_images(workdir)
    current = sandbox_info(workdir)
    #: nodes of the running sandbox that stay as they are (a sandbox grows without a restart)
    keep: tuple[SandboxNode, ...] = ()
    if current is not None:
        _, data = _read_state(workdir) or (None, {})
        same = (
            current.kind == kind and current.subnet == subnet and current.gpu == gpu
            and data.get("node_image") == planned.node and data.get("vllm_image") == planned.vllm
            and data.get("registry_port") == port and image_exists(current.image)
        )
        if same and len(current.nodes) == nodes:
            log(f"sandbox already up: {nodes} {kind} node(s) on {subnet} ({gpu.describe()})")
            return current
        if same and len(current.nodes) < nodes:
            keep = current.nodes

    images = ensure_images(workdir, log)
    with file_lock(workdir / ".sandbox.lock"):
        start = time.monotonic()
        if keep:
            log(f"growing the sandbox from {len(keep)} to {nodes} node(s); the running nodes stay as they are")
            image_ref = current.image
        else:
            old = _labelled("container", f"{ROLE_LABEL}=node")
            if old:
                with timed(log, f"removing {len(old)} old node container(s)"):
                    remove_containers(old, timeout=600)
            _state_path(workdir).unlink(missing_ok=True)
            _remove_node_dirs(workdir, log)

            _ensure_network(subnet, gateway, log)
            _ensure_registry(images, workdir, registry_ip, port, log)
            image_ref = _push_image(images, workdir, registry_ip, port, log)
            _push_image(images, workdir, registry_ip, port, log, source=images.mirror, repo=MIRROR_REMOTE_REPO,
                        tag=mirror_tag())

        key = workdir / "id_ed25519"
        client_pub = ensure_keypair(key, "bootstrap-sandbox")
        registry = f"{registry_ip}:{REGISTRY_PORT}"
        sandbox_nodes = tuple(
            SandboxNode(name=node_name(i + 1), ip=ip, container=f"{NODE_CONTAINER_PREFIX}{i + 1}")
            for i, ip in enumerate(ips)
        )
        known = []
        for i, n in enumerate(sandbox_nodes):
            if n in keep:  # a running node keeps its files (a test may have changed its GPU shape)
                host_pub = ensure_keypair(_host_key(workdir, n.name), f"root@{n.name}")
            else:
                _, host_pub = _prepare_node_files(workdir, n.name, client_pub, registry, i + 1, gpu)
            known.append(f"{n.ip} {' '.join(host_pub.split()[:2])}")
        known_hosts = workdir / "known_hosts"
        known_hosts.write_text("\n".join(known) + "\n")

        fresh = [n for n in sandbox_nodes if n not in keep]
        workers = min(8, len(fresh))
        with timed(log, f"starting {len(fresh)} {kind} node(s)"):
            with cf.ThreadPoolExecutor(max_workers=workers) as pool:
                futs = [pool.submit(_start_node, n, workdir, images.node, kind) for n in fresh]
                for f in futs:
                    f.result()
        deadline = time.monotonic() + 120 + 2 * nodes
        with timed(log, f"waiting for sshd{' and dockerd' if kind == 'full' else ''} on {len(fresh)} node(s)"):
            with cf.ThreadPoolExecutor(max_workers=min(16, len(fresh))) as pool:
                futs = {
                    n.name: pool.submit(_wait_node, n, kind, key, known_hosts, deadline)
                    for n in fresh
                }
                errors = []
                for f in futs.values():
                    try:
                        f.result()
                    except SandboxError as exc:
                        errors.append(str(exc))
                if errors:
                    more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
                    raise SandboxError("; ".join(errors[:3]) + more)
        iface = _interface_of(key, known_hosts, sandbox_nodes[0].ip)

        info = SandboxInfo(
            workdir=workdir, network=NETWORK, subnet=subnet, registry=registry, image=image_ref,
            nodes=sandbox_nodes, inventory=workdir / "inventory.yaml", key=key,
            known_hosts=known_hosts, kind=kind, gpu=gpu,
            # grown: the running nodes keep their shaped links (the caller shapes the new ones)
            links=current.links if keep else LK.NO_LINKS,
        )
        _write_inventory(info, iface)
        _write_state(info, {
            "node_image": images.node, "vllm_image": images.vllm, "registry_image": images.registry,
            "registry_port": port, "interface": iface, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        })
        log(f"sandbox up: {nodes} {kind} node(s) ({gpu.describe()}) in {time.monotonic() - start:.1f}s; "
            f"inventory {info.inventory}")
        return info
