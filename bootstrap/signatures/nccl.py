"""NCCL and Gloo (torch.distributed's GPU and CPU groups), and vLLM copying their per-node variables to
the Ray workers: interfaces, InfiniBand, shared memory.
"""
from __future__ import annotations

import re

from bootstrap.signatures.engine import Signature
from bootstrap.signatures.engine import pattern as _p

#: Variables whose value differs per node and must not be copied from the head to Ray workers.
PER_NODE_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "GLOO_SOCKET_IFNAME",
                "TP_SOCKET_IFNAME", "UCX_NET_DEVICES")


def _per_node_vars_in(line: str) -> list[str]:
    return [v for v in PER_NODE_ENV if re.search(rf"\b{v}\b", line)]


def _env_overwritten_fix(line: str) -> str:
    names = _per_node_vars_in(line) or ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"]
    listed = ", ".join(f'"{n}"' for n in names)
    return (f"Write [{listed}] to ~/.config/vllm/ray_non_carry_over_env_vars.json (the directory is "
            "$VLLM_CONFIG_ROOT) in the head container, where `vllm serve` runs, before starting it; "
            "vLLM then leaves each worker's own value in place.")

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        id="gloo-loopback",
        severity="error",
        patterns=(
            _p(r"Using the loopback address", "warning"),
            _p(r"Gloo connectFullMesh failed"),
            _p(r"\[enforce fail at [^\]]*gloo/transport/tcp/pair\.cc",
               needle="gloo/transport/tcp/pair.cc"),
        ),
        title="Gloo (torch.distributed's CPU group) bound to loopback or an unreachable interface, so "
              "ranks on different nodes cannot connect",
        fix="Set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME) on every node, in the "
            "container's environment, to the data-plane interface holding its VLLM_HOST_IP (e.g. "
            "GLOO_SOCKET_IFNAME=ens5); the hostname must not resolve to 127.0.x.x.",
        suppressed_by=("socket-ifname-missing",),
        sources=("https://github.com/vllm-project/vllm/issues/7074",
                 "https://github.com/wtdcode/vllm-backport/issues/14",
                 "https://github.com/gpustack/gpustack/issues/2125"),
    ),
    Signature(
        id="socket-ifname-missing",
        severity="error",
        patterns=(
            _p(r"Bootstrap ?: no socket interface found", needle="no socket interface found"),
            _p(r"NET/Socket ?: No usable listening interface found",
               needle="No usable listening interface found"),
            _p(r"Unable to find address for: ?\S+", needle="Unable to find address for"),
            _p(r"is neither AF_INET\(2\) nor AF_INET6\(10\)", needle="nor AF_INET6(10)"),
        ),
        title="NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names an interface that does not exist in the "
              "container, so NCCL or Gloo found no interface to use",
        fix="Set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME per host to an interface that exists and holds "
            "the node's IP (`ip -o -4 addr` on the host; with --network host the container sees the same "
            "names); GLOO_SOCKET_IFNAME takes plain names, not NCCL's ^/= syntax.",
        sources=("https://github.com/EasonXiao-888/MambaTree/issues/14",
                 "https://github.com/NVIDIA/nccl/issues/1837",
                 "https://github.com/aws-samples/aws-do-eks/pull/51",
                 "NVIDIA/nccl src/bootstrap.cc (bootstrapNetInit)"),
    ),
    Signature(
        id="nccl-ib-no-device",
        severity="error",
        patterns=(_p(r"NET/IB ?: No device found", needle="No device found"),
                  _p(r"Failed to open libibverbs")),
        title="InfiniBand is configured, but NCCL finds no IB device inside the container",
        fix="Pass the RDMA devices in: --device /dev/infiniband --cap-add IPC_LOCK --ulimit memlock=-1 "
            "(or --privileged), and check `ibv_devinfo` inside the container; 'Failed to open "
            "libibverbs' means the image lacks rdma-core (libibverbs1).",
        requires="infiniband",
        sources=("https://github.com/vllm-project/vllm/issues/10626",
                 "https://github.com/NVIDIA/nccl/issues/1267"),
    ),
    Signature(
        id="nccl-socket-with-ib",
        severity="warning",
        patterns=(
            _p(r"via NET/Socket"),
            _p(r"Using network Socket"),
            _p(r"NET/Socket ?: Using \[", needle="NET/Socket"),
            _p(r"NCCL_IB_DISABLE set by environment to 1"),
        ),
        title="InfiniBand is configured, but NCCL sends between nodes over TCP sockets (NET/Socket)",
        fix="Give the container the IB devices (--device /dev/infiniband --cap-add IPC_LOCK --ulimit "
            "memlock=-1), unset NCCL_IB_DISABLE, and make NCCL_IB_HCA name devices `ibv_devices` lists; "
            "NCCL_DEBUG=INFO must then show `via NET/IB`.",
        requires="infiniband",
        suppressed_by=("nccl-ib-no-device",),
        sources=("https://github.com/NVIDIA/nccl/issues/1232",
                 "https://github.com/vllm-project/vllm/issues/17568",
                 "https://github.com/vllm-project/vllm/pull/42075"),
    ),
    Signature(
        id="nccl-shm",
        severity="error",
        patterns=(_p(r"shared memory segment /dev/shm/"), _p(r"ncclShmOpen"),
                  _p(r"Insufficient space in /dev/shm", needle="Insufficient space in /dev/shm")),
        title="NCCL or vLLM could not get enough shared memory in /dev/shm (the container's "
              "/dev/shm is too small or private)",
        fix="Start the container with --ipc host, or with a larger --shm-size (e.g. --shm-size 16g; "
            "Docker's default is 64 MiB).",
        sources=("https://github.com/MiniMax-AI/MiniMax-01/issues/42",
                 "https://github.com/vllm-project/vllm/issues/18831"),
    ),
    Signature(
        id="nccl-unhandled-system-error",
        severity="error",
        patterns=(_p(r"unhandled system error"), _p(r"ncclSystemError"),
                  _p(r"NCCL_ERROR_SYSTEM_ERROR")),
        title="NCCL hit a failing system call (usually shared memory, locked memory or an RDMA limit in "
              "the container)",
        fix="Run the container with --ipc host (or a larger --shm-size), --ulimit memlock=-1 and "
            "--cap-add IPC_LOCK; rerun with NCCL_DEBUG=INFO to see the failing call in the `NCCL WARN` "
            "line before the error.",
        suppressed_by=("nccl-shm", "socket-ifname-missing"),
        sources=("https://github.com/NVIDIA/nccl/issues/1466",
                 "https://github.com/NVIDIA/Megatron-LM/issues/71",
                 "https://github.com/NVIDIA/nccl/issues/473"),
    ),
    Signature(
        id="nccl-env-overwritten",
        severity="warning",
        patterns=(
            _p(r"Overwriting environment variable (?:" + "|".join(PER_NODE_ENV) + r") from", "error",
               needle="Overwriting environment variable"),
            _p(r"Copying the following environment variables.*'(?:" + "|".join(PER_NODE_ENV) + r")'",
               needle="Copying the following environment variables"),
        ),
        title="vLLM copies the head's per-node network variables (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...) "
              "to the Ray workers, overwriting each worker's own value",
        fix="List the per-node names in ~/.config/vllm/ray_non_carry_over_env_vars.json in the head "
            "container.",
        fix_for=_env_overwritten_fix,
        sources=("vllm-project/vllm vllm/ray/ray_env.py (get_env_vars_to_copy)",
                 "vllm-project/vllm vllm/utils (update_environment_variables)"),
    ),
)
