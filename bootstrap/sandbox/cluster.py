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
import time
from dataclasses import asdict, replace
from pathlib import Path

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
    file_lock,
    image_exists,
    labelled,
    nolog,
    remove_containers,
    require_docker,
    sdk,
    timed,
)
from .gpu import GpuShape
from .images import ensure_images, ensure_new_node_image, new_node_ref, planned_images
from .layout import (
    CUDA_SHAPED_REMOTE_REPO,
    HOST,
    KINDS,
    MIRROR_REMOTE_REPO,
    MIXED_HOST,
    MIXED_NODE,
    NETWORK,
    NODE_CONTAINER_PREFIX,
    RAY_LESS_REMOTE_REPO,
    REGISTRY_CONTAINER,
    REGISTRY_PORT,
    REMOTE_REPO,
    SandboxInfo,
    SandboxNode,
    mixed_refusal,
    node_host,
    node_name,
    plan_addresses,
    registry_host_port,
    subnet_from_env,
)
from .nodes import (
    _host_key,
    _interface_of,
    _prepare_node_files,
    _remove_node_dirs,
    _start_node,
    _wait_node,
    ensure_keypair,
)
from .recipes import SandboxImages
from .registry import _ensure_network, _ensure_registry, _labelled, _push_image, mirror_tag
from .state import _read_state, _state_path, _write_inventory, _write_state


def push_ray_less(workdir: Path, log: Log = nolog) -> str:
    """The Ray-less variant of the vLLM image (built if needed) in the running sandbox's registry;
    returns the reference the nodes pull."""
    from .images import ensure_ray_less_image

    return _push_variant(workdir, ensure_ray_less_image, RAY_LESS_REMOTE_REPO, log)


def push_cuda_shaped(workdir: Path, log: Log = nolog) -> str:
    """The CUDA-shaped variant of the vLLM image (fake_cuda_torch.py as its `torch`: the CUDA faults of a GPU
    node, gpu.set_gpus(cuda_error=...)) in the running sandbox's registry; the reference the nodes pull."""
    from .images import ensure_cuda_shaped_image

    return _push_variant(workdir, ensure_cuda_shaped_image, CUDA_SHAPED_REMOTE_REPO, log)


def _push_variant(workdir: Path, ensure, repo: str, log: Log) -> str:
    workdir = Path(workdir).expanduser()
    info = sandbox_info(workdir)
    if info is None:
        raise SandboxError("no sandbox is running: `bootstrap sandbox up` first")
    images = ensure_images(workdir, log)
    source = ensure(workdir, log)
    return _push_image(images, workdir, info.registry.split(":")[0], registry_host_port(), log,
                       source=source, repo=repo)


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
               gpu: GpuShape = GPU.NO_GPU, mixed: bool = False) -> SandboxInfo:
    """Start (or reuse) a sandbox of `nodes` nodes; returns what is running.

    full: every node runs sshd and its own dockerd (insecure-registries lists the sandbox registry).
    sshd: sshd only, for fan-out tests with many hosts. `gpu` gives every node GPUs and HCAs as SSH
    and Docker see them (bootstrap.sandbox.gpu; kind full only). `mixed`: node3 is another kind of host
    (layout.MIXED_HOST: Debian 13, Docker 26.1 with the containerd image store, GPUs through CDI).
    """
    workdir = Path(workdir).expanduser()
    _check_shape(nodes, kind, gpu, mixed)
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
            current.kind == kind and current.subnet == subnet and current.gpu == gpu and current.mixed == mixed
            and data.get("node_image") == planned.node and data.get("vllm_image") == planned.vllm
            and data.get("mixed_node_image") == (new_node_ref() if mixed else None)
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
            image_ref = _fresh_start(images, workdir, subnet, gateway, registry_ip, port, log)

        key = workdir / "id_ed25519"
        client_pub = ensure_keypair(key, "bootstrap-sandbox")
        registry = f"{registry_ip}:{REGISTRY_PORT}"
        sandbox_nodes = tuple(
            SandboxNode(name=node_name(i + 1), ip=ip, container=f"{NODE_CONTAINER_PREFIX}{i + 1}",
                        host=node_host(i + 1, mixed))
            for i, ip in enumerate(ips)
        )
        known_hosts = _write_known_hosts(workdir, sandbox_nodes, keep, client_pub, registry, gpu)

        fresh = [n for n in sandbox_nodes if n not in keep]
        _start_nodes(fresh, workdir, images, kind, key, known_hosts, nodes, log)
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
            "mixed_node_image": new_node_ref() if mixed else None,
            "registry_port": port, "interface": iface, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        })
        odd = f"; node{MIXED_NODE}: {MIXED_HOST}" if mixed else ""
        log(f"sandbox up: {nodes} {kind} node(s) ({gpu.describe()}{odd}) in {time.monotonic() - start:.1f}s; "
            f"inventory {info.inventory}")
        return info


def _check_shape(nodes: int, kind: str, gpu: GpuShape, mixed: bool) -> None:
    if kind not in KINDS:
        raise SandboxError(f"unknown sandbox kind {kind!r}: use one of {', '.join(KINDS)}")
    if gpu.shaped and kind != "full":
        raise SandboxError("a GPU-shaped sandbox needs kind full: its GPUs are seen through each node's dockerd")
    if mixed and (why := mixed_refusal(nodes, kind)):
        raise SandboxBadInput(why)


def _fresh_start(images: SandboxImages, workdir: Path, subnet: str, gateway: str, registry_ip: str, port: int,
                 log: Log) -> str:
    """Remove the old nodes and their data, make sure of the network and the registry, push the vLLM and the
    mirror images into it; returns the vLLM image's reference as the nodes pull it."""
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
    return image_ref


def _write_known_hosts(workdir: Path, sandbox_nodes: tuple[SandboxNode, ...], keep: tuple[SandboxNode, ...],
                       client_pub: str, registry: str, gpu: GpuShape) -> Path:
    """Every node's files and host key (a running node in `keep` keeps its files); writes known_hosts."""
    known = []
    for i, n in enumerate(sandbox_nodes):
        if n in keep:  # a running node keeps its files (a test may have changed its GPU shape)
            host_pub = ensure_keypair(_host_key(workdir, n.name), f"root@{n.name}")
        else:
            _, host_pub = _prepare_node_files(workdir, n.name, client_pub, registry, i + 1, gpu, n.host)
        known.append(f"{n.ip} {' '.join(host_pub.split()[:2])}")
    known_hosts = workdir / "known_hosts"
    known_hosts.write_text("\n".join(known) + "\n")
    return known_hosts


def _start_nodes(fresh: list[SandboxNode], workdir: Path, images: SandboxImages, kind: str, key: Path,
                 known_hosts: Path, nodes: int, log: Log) -> None:
    """Start the `fresh` nodes and wait until each answers over SSH (and its dockerd does)."""
    workers = min(8, len(fresh))
    node_image = {HOST: images.node}
    if any(n.host == MIXED_HOST for n in fresh):
        node_image[MIXED_HOST] = ensure_new_node_image(workdir, log)
    with timed(log, f"starting {len(fresh)} {kind} node(s)"):
        with cf.ThreadPoolExecutor(max_workers=workers) as pool:
            futs = [pool.submit(_start_node, n, workdir, node_image[n.host], kind) for n in fresh]
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
