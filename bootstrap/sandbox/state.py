"""What a running sandbox is, on disk: state.json (read by sandbox_info) and the inventories written for it."""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import yaml

from . import links as LK
from ._util import (
    SandboxError,
)
from .gpu import GpuShape
from .layout import MIRROR_REMOTE_REPO, STATE_VERSION, SandboxInfo, SandboxNode, gpu_inventory_path
from .registry import mirror_tag

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
