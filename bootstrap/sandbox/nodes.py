"""The sandbox's nodes: their keys and files, start them, wait for sshd (and dockerd), run a command over SSH."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import secrets
import shutil
import time
from pathlib import Path

from . import gpu as GPU
from ._util import (
    LABEL,
    ROLE_LABEL,
    Log,
    SandboxError,
    client,
    container_logs,
    sdk,
    tail,
    timed,
)
from .gpu import GpuShape
from .layout import (
    FULL_NODE_OPTIONS,
    FULL_NODE_VOLUMES,
    HOST,
    KIND_LABEL,
    MIXED_HOST,
    NETWORK,
    SandboxNode,
    sudo_password_path,
)
from .registry import _inspect


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


# --- nodes -----------------------------------------------------------------------------------------


def sudo_password(workdir: Path) -> str:
    """The sandbox's password of the nodes' login that is not root (made once, kept 0600 in the workdir)."""
    path = sudo_password_path(workdir)
    if not path.exists():
        _write_private(path, secrets.token_urlsafe(18).encode())
    return path.read_text().strip()


def _host_key(workdir: Path, name: str) -> Path:
    return workdir / "hostkeys" / name / "ssh_host_ed25519_key"


def _prepare_node_files(workdir: Path, name: str, client_pub: str, registry: str, number: int,
                        gpu: GpuShape, host: str = HOST) -> tuple[Path, str]:
    """Write nodes/<name>/sandbox (mounted at /sandbox), with node `number`'s GPU shape; return (dir,
    host public key line). The MIXED_HOST node's Docker keeps images in containerd's store and takes GPUs
    through CDI."""
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
        **GPU.daemon_runtimes(gpu, cdi=host == MIXED_HOST),
    }
    if host == MIXED_HOST:  # as Docker 29 installs itself; Docker 26 has it behind a feature flag
        daemon.setdefault("features", {})["containerd-snapshotter"] = True
    (src / "daemon.json").write_text(json.dumps(daemon, indent=2) + "\n")
    _write_private(src / "sudo-password", (sudo_password(workdir) + "\n").encode())
    GPU.write_node(src, number, gpu, cdi=host == MIXED_HOST)
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
