"""A real multi-host testbed on one machine: Docker-in-Docker nodes reachable over SSH.

`sandbox_up(n)` starts, on a user-defined bridge network with a fixed subnet, a local registry
holding a vLLM CPU image and `n` nodes, each with its own IP, sshd (key auth, host keys known in
advance) and, for kind "full", its own dockerd. It writes a native inventory for them, so the core
tool runs against real SSH and real Docker daemons. Everything is built locally (debootstrap, wheels
downloaded on this machine): no registry outside is needed.

Pure library: nothing here prints; progress lines go to the `log` callable; failures raise
`SandboxError` (a `BootstrapError`) with what failed and why.

Environment:
    BOOTSTRAP_SANDBOX_DIR            work directory (default ~/.cache/bootstrap-sandbox)
    BOOTSTRAP_SANDBOX_SUBNET         the network's subnet (default 172.31.240.0/24)
    BOOTSTRAP_SANDBOX_REGISTRY_PORT  the registry's port on 127.0.0.1 (default 5000)
    BOOTSTRAP_SANDBOX_MIRROR         Debian mirror for debootstrap (default http://deb.debian.org/debian)
"""
from __future__ import annotations

import os
from pathlib import Path

from ._util import LABEL, LABEL_KV, Log, SandboxError, nolog
from .cluster import sandbox_down as _down
from .cluster import sandbox_info as _info
from .cluster import sandbox_up as _up
from .cluster import set_links as _set_links
from .cluster import use_image as _use_image
from .gpu import NO_GPU, GpuShape
from .images import ensure_images as _ensure_images
from .layout import DEFAULT_SUBNET, NETWORK, REGISTRY_CONTAINER, SandboxInfo, SandboxNode, mixed_refusal, plan_addresses
from .links import NO_LINKS, LinkShape, parse_rate
from .nodes import ssh_run
from .recipes import TINY_MODEL_DIR, SandboxImages

DEFAULT_WORKDIR = Path(os.environ.get("BOOTSTRAP_SANDBOX_DIR", "~/.cache/bootstrap-sandbox")).expanduser()

__all__ = [
    "DEFAULT_SUBNET",
    "DEFAULT_WORKDIR",
    "GpuShape",
    "LABEL",
    "LABEL_KV",
    "NO_LINKS",
    "LinkShape",
    "NETWORK",
    "REGISTRY_CONTAINER",
    "TINY_MODEL_DIR",
    "SandboxError",
    "SandboxImages",
    "SandboxInfo",
    "SandboxNode",
    "ensure_images",
    "mixed_refusal",
    "parse_rate",
    "plan_addresses",
    "sandbox_down",
    "sandbox_info",
    "sandbox_up",
    "ssh_run",
    "use_image",
]


def ensure_images(workdir: Path | str = DEFAULT_WORKDIR, log: Log = nolog) -> SandboxImages:
    """Build (or reuse, by recipe hash) the base, node, registry and vLLM CPU images."""
    return _ensure_images(Path(workdir).expanduser(), log)


def sandbox_up(
    nodes: int = 3, workdir: Path | str = DEFAULT_WORKDIR, log: Log = nolog, *, kind: str = "full",
    ray: bool = True, gpu: GpuShape = NO_GPU, links: LinkShape = NO_LINKS, mixed: bool = False,
) -> SandboxInfo:
    """Start `nodes` nodes ("full": sshd + dockerd; "sshd": sshd only), the registry and the network.

    Builds missing images first. If the same count and kind are already up, returns at once;
    otherwise the nodes are recreated (fresh /var/lib/docker each). Writes workdir/inventory.yaml,
    naming the vLLM image with Ray, or (ray False, kind full) its Ray-less variant, as stock
    vllm/vllm-openai images are: the inventory sets no runtime, so `up` picks it from the image.
    `gpu` makes every node GPU-shaped (bootstrap.sandbox.gpu): GPUs for nvidia-smi and `docker run
    --gpus`, InfiniBand/RoCE ports; a running sandbox of another shape is recreated. `links` caps
    what the registry and each node send (bootstrap.sandbox.links, Linux tc); without it a shape set
    before is taken off. `mixed`: node3 is another kind of host (Debian 13, Docker 26.1 with the
    containerd image store, GPUs through CDI: layout.MIXED_HOST); a running sandbox that differs is recreated.
    """
    workdir = Path(workdir).expanduser()
    info = _up(nodes, workdir, log, kind=kind, gpu=gpu, mixed=mixed)
    info = _set_links(workdir, links, log)
    return _use_image(workdir, ray=ray, log=log) if kind == "full" else info


def use_image(*, ray: bool, workdir: Path | str = DEFAULT_WORKDIR, log: Log = nolog) -> SandboxInfo:
    """Point the running sandbox's inventory at the vLLM image with Ray or at its Ray-less variant."""
    return _use_image(Path(workdir).expanduser(), ray=ray, log=log)


def sandbox_down(workdir: Path | str = DEFAULT_WORKDIR, log: Log = nolog) -> None:
    """Remove the sandbox's containers, network and node data dirs (idempotent).

    Keeps images, keys, the registry storage and build caches, so the next `sandbox_up` is fast.
    """
    _down(Path(workdir).expanduser(), log)


def sandbox_info(workdir: Path | str = DEFAULT_WORKDIR) -> SandboxInfo | None:
    """The running sandbox started from workdir, or None when it is not (completely) up."""
    return _info(Path(workdir).expanduser())
