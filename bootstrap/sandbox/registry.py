"""The sandbox's bridge network and its local registry: start them, push the images the nodes pull."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from bootstrap.remote import localdocker as LD

from ._util import (
    LABEL,
    LABEL_KV,
    ROLE_LABEL,
    Log,
    SandboxError,
    client,
    container_logs,
    inspect,
    labelled,
    push_logged,
    remove_containers,
    sdk,
    tag_image,
    tail,
    timed,
)
from .layout import NETWORK, REGISTRY_CONTAINER, REGISTRY_PORT, REMOTE_REPO
from .recipes import SandboxImages, mirror_stage


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
