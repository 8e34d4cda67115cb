"""Diagnosis: known failure signatures in node logs, and consistency checks across nodes.

Pure: text and values in, findings out; nothing here touches a host. Three entry points:

* `scan_log(host, text, infiniband=...)` matches a log against `SIGNATURES`, a table of messages that
  vLLM, Ray, NCCL, Gloo, Docker and huggingface_hub print for the failures multi-node clusters hit.
  Feed it what a node produced: `docker logs <node container>` (the `ray start --block` output, and on
  the head the `vllm serve` output, which carries worker lines prefixed `(RayWorkerWrapper pid=…,
  ip=…)`), a `docker pull`/`docker run` error, or a run with `NCCL_DEBUG=INFO`.
* `root_cause(text)` picks vLLM's own root-cause line out of a failed `vllm serve` log: the last specific
  exception (or pydantic validation error), past wrappers such as "Engine core initialization failed".
* `check_cluster(reports)` compares per-host values (`HostReport`) gathered by the caller: GPU counts,
  drivers, clocks, free disk, VLLM_HOST_IP against Ray's node IP, *_SOCKET_IFNAME against the host's
  interfaces.

Every finding names a cause and a concrete fix. Evidence is one trimmed line with tokens masked.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from bootstrap.cluster.facts import parse_ip_addrs

SEVERITIES = ("error", "warning", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}
#: Longest evidence string; longer lines are cut to a window around the match.
MAX_EVIDENCE = 300
GIB = 1024 ** 3

#: Variables whose value differs per node and must not be copied from the head to Ray workers.
PER_NODE_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "GLOO_SOCKET_IFNAME",
                "TP_SOCKET_IFNAME", "UCX_NET_DEVICES")
#: The *_SOCKET_IFNAME variables `check_cluster` validates against a host's interfaces.
SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


@dataclass(frozen=True)
class Finding:
    id: str
    #: "error" | "warning" | "info"
    severity: str
    #: The host it was seen on; None: cluster-wide.
    host: str | None
    #: One line: the cause.
    title: str
    #: The log line or the values seen: one line, at most MAX_EVIDENCE characters, tokens masked.
    evidence: str
    #: What to do: flags, variables, commands.
    fix: str


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern
    #: Overrides the signature's severity for lines this pattern matches (None: the signature's).
    severity: str | None = None
    #: Lower-case text every match contains: lines without it are never handed to the regex.
    needle: str = ""


@dataclass(frozen=True)
class Signature:
    id: str
    severity: str
    patterns: tuple[Pattern, ...]
    title: str
    fix: str
    #: A context flag `scan_log` must have set for this signature to apply ("infiniband").
    requires: str | None = None
    #: Lines matching this are never evidence for this signature.
    ignore: re.Pattern | None = None
    #: Ids of causes that explain this symptom: when one is found on the same host, this one is dropped.
    suppressed_by: tuple[str, ...] = ()
    #: Where the message text was taken from (issues, source files).
    sources: tuple[str, ...] = ()
    #: Builds the fix from the evidence line, when the fix depends on what the line names.
    fix_for: Callable[[str], str] | None = field(default=None, compare=False, repr=False)


def _p(regex: str, severity: str | None = None, *, needle: str | None = None) -> Pattern:
    if needle is None:
        if set(regex) & set("\\.^$*+?{}[]|()"):
            raise ValueError(f"pattern {regex!r} needs a literal needle")
        needle = regex
    return Pattern(re.compile(regex, re.IGNORECASE | re.MULTILINE), severity, needle.lower())


def _per_node_vars_in(line: str) -> list[str]:
    return [v for v in PER_NODE_ENV if re.search(rf"\b{v}\b", line)]


def _env_overwritten_fix(line: str) -> str:
    names = _per_node_vars_in(line) or ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"]
    listed = ", ".join(f'"{n}"' for n in names)
    return (f"Write [{listed}] to ~/.config/vllm/ray_non_carry_over_env_vars.json (the directory is "
            "$VLLM_CONFIG_ROOT) in the head container, where `vllm serve` runs, before starting it; "
            "vLLM then leaves each worker's own value in place.")


_TP_PLAN = ("put the other GPUs into pipeline stages: `bootstrap serve MODEL --tp T --pp P` with T x P = all "
            "GPUs (`bootstrap serve --dry-run` shows the plan), e.g. 3 nodes x 1 GPU: --tp 1 --pp 3.")
_TP_HEADS_FIX = ("Choose a --tp that divides the model's num_attention_heads and that divides, or is a multiple of, "
                 "its num_key_value_heads (both in the model's config.json), and " + _TP_PLAN)
_HEADS_VS_TP = re.compile(r"attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)")


def _tp_heads_fix(line: str) -> str:
    m = _HEADS_VS_TP.search(line)
    if not m:
        return _TP_HEADS_FIX
    heads, tp = int(m[1]), int(m[2])
    ok = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
    return (f"The model has {heads} attention heads, so --tp {tp} cannot split them; --tp must be one of {ok} "
            "(and divide, or be a multiple of, num_key_value_heads in config.json): " + _TP_PLAN)


_MAX_LEN_FIX = ("Pass a length within the model's limit after `--`: `bootstrap serve MODEL -- --max-model-len N` (N "
                "at most the derived max_model_len the error names), or leave --max-model-len out to use the "
                "model's own; a longer context needs RoPE scaling (--hf-overrides with rope_scaling) plus "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the containers' environment.")
_DERIVED_LEN = re.compile(r"derived max_model_len \((?:(\w+)=)?(\d+)(?:\.\d+)?(?: or model_max_length=(\d+))?")


def _max_len_fix(line: str) -> str:
    m = _DERIVED_LEN.search(line)
    if not m:
        return _MAX_LEN_FIX
    key, limit = m[1], int(m[2])
    if m[3] and int(m[3]) > limit:  # vLLM accepts up to model_max_length when the config sets it
        key, limit = "model_max_length", int(m[3])
    named = f" ({key}={limit})" if key and key != "None" else ""
    return (f"The model's config.json allows {limit} tokens{named}: pass `bootstrap serve MODEL -- "
            f"--max-model-len {limit}` (or less), or leave --max-model-len out to use the model's own; a longer "
            "context needs RoPE scaling (--hf-overrides with rope_scaling) plus VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
            "in the containers' environment.")


_IP = r"\d{1,3}(?:\.\d{1,3}){3}"

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        id="ray-ip-mismatch",
        severity="error",
        patterns=(_p(rf"No available node types can fulfill resource request.*'node:{_IP}'",
                     needle="No available node types can fulfill resource request"),),
        title="vLLM asked Ray for a GPU on node:<IP> (the IP vLLM picked for itself), and no Ray node "
              "with a free GPU has that IP: vLLM and Ray disagree on the node's IP (several NICs)",
        fix="Set VLLM_HOST_IP on every node to the IP Ray registered for that node (`ray status` / "
            "`ray list nodes` in the head container) and start Ray with --node-ip-address=<the same IP>; "
            "`vllm serve` must run on a node whose GPUs Ray sees.",
        sources=("https://github.com/vllm-project/vllm/issues/14186",
                 "https://github.com/vllm-project/vllm/issues/13388"),
    ),
    Signature(
        id="ray-driver-no-gpu",
        severity="error",
        patterns=(_p(r"Current node has no GPU available"),),
        title="`vllm serve` runs on a node where Ray has no free GPU (started without GPUs, another IP, "
              "or GPUs still held by a placement group of an earlier run)",
        fix="Run `vllm serve` in the head container of a GPU node whose `ray start` saw its GPUs (no "
            "--num-gpus=0), with VLLM_HOST_IP equal to its Ray node IP; after a killed run, restart the "
            "node containers (or `ray stop` everywhere) to release its placement group.",
        sources=("https://github.com/EleutherAI/lm-evaluation-harness/issues/2410",
                 "https://github.com/vllm-project/vllm/issues/13093"),
    ),
    Signature(
        id="placement-group-wait",
        severity="error",
        patterns=(
            _p(r"Waiting for creating a placement group of specs", "warning"),
            _p(r"Cannot provide a placement group of"),
            _p(r"number of required GPUs exceeds the total number of available GPUs"),
            _p(r"No available node types can fulfill resource request"),
            _p(r"resource request cannot be scheduled right now: \{[^}]*'GPU'", "warning",
               needle="resource request cannot be scheduled right now"),
            _p(r"Tensor parallel size \(\d+\) cannot be larger than the number of available GPUs",
               needle="cannot be larger than the number of available GPUs"),
        ),
        title="vLLM cannot get all the GPUs it needs from Ray: a worker node, or its GPUs, is missing "
              "from the Ray cluster",
        fix="Run `ray status` in the head container: it must list every node and tensor_parallel_size x "
            "pipeline_parallel_size GPUs. Restart the missing worker's container (started with --gpus all "
            "and `ray start --address=<head IP>:<GCS port>`), and pass --distributed-executor-backend ray "
            "to `vllm serve`.",
        suppressed_by=("ray-ip-mismatch", "ray-driver-no-gpu", "ray-gcs-unreachable", "gpu-not-visible"),
        sources=("https://github.com/gpustack/gpustack/issues/5509",
                 "https://github.com/vllm-project/aibrix/issues/927",
                 "vllm-project/vllm vllm/executor/ray_utils.py (_wait_until_pg_ready)"),
    ),
    Signature(
        id="ray-gcs-unreachable",
        severity="error",
        patterns=(
            _p(r"Failed to connect to GCS at address"),
            _p(r"Timed out while waiting for GCS to become available"),
            _p(r"Couldn't reconnect to GCS server"),
        ),
        title="This node cannot reach the Ray head's GCS (wrong head address, head not running, or the "
              "GCS port blocked)",
        fix="Check the head container is up (its `docker logs` shows 'Ray runtime started'), that workers "
            "run `ray start --address=<head data-plane IP>:6379`, and that the port answers from the "
            "worker (`nc -zv <head IP> 6379`); open the GCS, node-manager and object-manager ports in the "
            "firewall; every node must run the same Ray version.",
        sources=("https://github.com/ModalMinds/MM-EUREKA/issues/54",
                 "https://github.com/Jiayi-Pan/TinyZero/issues/75"),
    ),
    Signature(
        id="ray-missing",
        severity="error",
        patterns=(
            _p(r"\bray: command not found", needle="ray: command not found"),
            _p(r"(?:^|[\s:])ray: not found", needle="ray: not found"),
            _p(r'exec: "ray": executable file not found', needle='"ray": executable file not found'),
            _p(r"No module named '?ray'?(?:$|[^.\w])", needle="No module named"),
            _p(r"Ray is not installed"),
            _p(r"Failed to import Ray\b", needle="Failed to import Ray"),
        ),
        title="The image has no Ray, so `ray start` cannot run (recent vllm/vllm-openai images no longer "
              "ship Ray)",
        fix="Set cluster.runtime: none (or remove the key: the runtime then follows the image) and "
            "`bootstrap up` again: the nodes run vLLM's native multi-node mode, no Ray needed. Or keep Ray "
            "with an image that has it (one built FROM the image with `RUN pip install 'ray[default]'`).",
        sources=("https://github.com/vllm-project/vllm/issues/4836",
                 "https://github.com/ai-dynamo/dynamo/issues/14020",
                 "https://github.com/vllm-project/production-stack/issues/995",
                 "https://github.com/kubernetes-sigs/lws/issues/835"),
    ),
    Signature(
        id="cpu-ray-unsupported",
        severity="error",
        patterns=(_p(r"current platform cpu does not support ray"),),
        title="vLLM's CPU backend cannot use Ray as its distributed executor",
        fix="On CPU-only nodes use vLLM's native multi-node backend (--distributed-executor-backend mp "
            "with --nnodes/--node-rank/--master-addr, --headless on workers) instead of a Ray cluster, or "
            "run the cluster on GPU nodes (accelerator: gpu).",
        sources=("https://github.com/vllm-project/vllm/issues/21602",),
    ),
    Signature(
        id="gpu-not-visible",
        severity="error",
        patterns=(
            _p(r'could not select device driver ".*" with capabilities: \[\[gpu\]\]',
               needle="could not select device driver"),
            _p(r"Failed to infer device type"),
            _p(r"No platform detected, vLLM is running on UnspecifiedPlatform",
               needle="No platform detected"),
            _p(r"NVIDIA Driver was not detected"),
        ),
        title="The container sees no GPU (Docker has no NVIDIA runtime, or the container was started "
              "without GPUs)",
        fix="Install nvidia-container-toolkit on the host and run `nvidia-ctk runtime configure "
            "--runtime=docker && systemctl restart docker`; start the container with --gpus all and check "
            "`docker run --rm --gpus all <image> nvidia-smi`.",
        sources=("https://github.com/vllm-project/vllm/issues/12847",
                 "https://github.com/vllm-project/vllm/issues/13946",
                 "https://github.com/OpenBMB/XAgent/issues/273"),
    ),
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
    Signature(
        id="cuda-oom",
        severity="error",
        patterns=(_p(r"CUDA out of memory"), _p(r"CUDA error: out of memory"),
                  _p(r"\bOutOfMemoryError\b", needle="OutOfMemoryError")),
        title="A GPU ran out of memory while loading the model or allocating its KV cache",
        fix="Spread the model over more GPUs (raise --tensor-parallel-size or --pipeline-parallel-size), "
            "lower --gpu-memory-utilization or --max-model-len, or use a quantized checkpoint; check with "
            "nvidia-smi that no other process holds GPU memory.",
        sources=("https://github.com/vllm-project/vllm/issues/2140",
                 "https://github.com/vllm-project/vllm/issues/636"),
    ),
    Signature(
        id="port-in-use",
        severity="error",
        patterns=(_p(r"address already in use"), _p(r"EADDRINUSE")),
        title="A port the node needs (Ray GCS 6379, dashboard 8265, vLLM API 8000, or torch.distributed's "
              "port) is already taken on the host",
        fix="Find the holder with `ss -ltnp | grep <port>` on the host (often a leftover container, "
            "`ray start` or `vllm serve`) and stop it (`docker rm -f <container>`, `ray stop`), or move the "
            "port in the inventory (ports.ray_gcs, ports.vllm); with --network host the container shares "
            "the host's ports.",
        sources=("https://github.com/vllm-project/vllm/issues/11617",
                 "https://github.com/ray-project/ray/issues/14098"),
    ),
    Signature(
        id="hf-auth",
        severity="error",
        patterns=(
            _p(r"GatedRepoError"),
            _p(r"Cannot access gated repo"),
            _p(r"trying to access a gated repo"),
            _p(r"(?:401|403) Client Error.*huggingface\.co", needle="Client Error"),
            _p(r"Repository Not Found for url: https://huggingface\.co",
               needle="Repository Not Found for url"),
        ),
        title="Hugging Face refused the model download: the repo is gated or private and no valid token "
              "reached the container",
        fix="Export HF_TOKEN (for an account that accepted the model's license on its huggingface.co "
            "page) before running bootstrap so every container gets it, or pre-download the model into "
            "the hf_cache directory on every node.",
        sources=("https://github.com/sgl-project/sglang/pull/14644",
                 "https://github.com/hyperonym/basaran/issues/289"),
    ),
    Signature(
        id="disk-full",
        severity="error",
        patterns=(_p(r"no space left on device"), _p(r"Errno 28\b", needle="Errno 28"),
                  _p(r"StorageFull")),
        ignore=re.compile(r"/dev/shm", re.IGNORECASE),
        title="A filesystem on the host is full (Docker's data root while pulling the image, or the "
              "Hugging Face cache while downloading weights)",
        fix="Check `df -h /var/lib/docker <hf_cache dir>` on the host; free space with `docker image prune "
            "-a`, or move Docker's data-root / the inventory's hf_cache to a larger disk (the image needs "
            "about 1.2x its size plus 10 GiB).",
        sources=("https://github.com/NVIDIA-NeMo/Speech/issues/1029",
                 "https://github.com/moby/moby/issues/32811"),
    ),
    Signature(
        id="tp-heads-indivisible",
        severity="error",
        patterns=(
            _p(r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size \(\d+\)",
               needle="must be divisible by tensor parallel size"),
            # the KV-head checks of the model files (llama.py, qwen2.py, ...), a bare AssertionError under them
            _p(r"\bassert (?:self\.)?total_num_kv_heads % tp_size == 0", needle="total_num_kv_heads % tp_size"),
            _p(r"\bassert tp_size % (?:self\.)?total_num_kv_heads == 0",
               needle="total_num_kv_heads == 0"),
            # QKVParallelLinear splitting (or replicating) the KV heads, whose divide() asserts "X is not
            # divisible by Y" (vllm/model_executor/layers/linear.py)
            _p(r"num_kv_head_replicas = divide\(tp_size, self\.total_num_kv_heads\)",
               needle="num_kv_head_replicas = divide("),
            _p(r"num_kv_heads = divide\(self\.total_num_kv_heads, tp_size\)", needle="num_kv_heads = divide("),
        ),
        title="The tensor-parallel size (--tp) does not divide the model's attention heads (or its KV heads): "
              "tensor parallelism gives every GPU an equal share of the heads",
        fix=_TP_HEADS_FIX,
        fix_for=_tp_heads_fix,
        sources=("https://github.com/vllm-project/vllm/issues/52435",
                 "https://github.com/vllm-project/vllm/issues/2652",
                 "https://github.com/vllm-project/vllm/issues/16021",
                 "https://github.com/vllm-project/vllm/issues/1581",
                 "vllm-project/vllm vllm/config/model.py (ModelConfig.verify_with_parallel_config)",
                 "vllm-project/vllm vllm/model_executor/models/llama.py (LlamaAttention)",
                 "vllm-project/vllm vllm/model_executor/layers/linear.py (QKVParallelLinear)"),
    ),
    Signature(
        id="pp-invalid",
        severity="error",
        patterns=(
            _p(r"Pipeline parallelism is not supported for this model"),
            _p(r"Pipeline parallelism is only supported for the following"),
            _p(r"Total number of hidden layers \(\d+\) must be divisible by pipeline parallel size \(\d+\)",
               needle="must be divisible by pipeline parallel size"),
            # VLLM_PP_LAYER_PARTITION that does not fit the stages or the layers (vllm/distributed/utils.py)
            _p(r"len\(partitions\)=\d+ does not match pp_size=\d+", needle="does not match pp_size="),
            _p(r"sum\(partitions\)=\d+ does not match num_hidden_layers=\d+",
               needle="does not match num_hidden_layers="),
        ),
        title="vLLM cannot split this model into --pp pipeline stages: the model does not support pipeline "
              "parallelism, or the layer split does not fit the stages",
        fix="Serve it without pipeline stages: `bootstrap serve MODEL --tp <all GPUs> --pp 1` (tensor parallel "
            "across the nodes; `bootstrap serve --dry-run` shows the plan), or use a vLLM version in which the "
            "model implements SupportsPP. For a layer-count error pick a --pp that divides num_hidden_layers "
            "(config.json), and unset VLLM_PP_LAYER_PARTITION or give it one layer count per stage summing to "
            "num_hidden_layers.",
        sources=("https://github.com/vllm-project/vllm/issues/16231",
                 "https://github.com/vllm-project/vllm/issues/9015",
                 "vllm-project/vllm vllm/config/model.py (ModelConfig.verify_with_parallel_config)",
                 "vllm-project/vllm vllm/distributed/utils.py (get_pp_indices)"),
    ),
    Signature(
        id="max-model-len-too-long",
        severity="error",
        patterns=(_p(r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
                     needle="is greater than the derived max_model_len"),),
        title="--max-model-len asks for a longer context than the model's config.json declares "
              "(max_position_embeddings or model_max_length), so vLLM refuses to start",
        fix=_MAX_LEN_FIX,
        fix_for=_max_len_fix,
        sources=("https://github.com/vllm-project/vllm/issues/3676",
                 "https://github.com/xorbitsai/inference/issues/1715",
                 "vllm-project/vllm vllm/config/model.py (_get_and_verify_max_len)"),
    ),
)

_BY_ID = {s.id: s for s in SIGNATURES}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SECRETS = (
    (re.compile(r"hf_[A-Za-z0-9]{20,}"), "hf_***"),
    (re.compile(r"((?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN|HUGGINGFACE_TOKEN|HF_API_TOKEN)\s*[=:]\s*)"
                r"(?!\*\*\*)[\"']?[^\s\"',]+[\"']?"), r"\1***"),
)


def signature(id: str) -> Signature:
    return _BY_ID[id]


def mask_secrets(text: str) -> str:
    for regex, repl in _SECRETS:
        text = regex.sub(repl, text)
    return text


def _one_line(text: str, at: int = 0) -> str:
    """Mask, collapse whitespace, and cut to MAX_EVIDENCE characters keeping offset `at` in view.

    Masking comes first, so a cut can never leave part of a token readable.
    """
    head = len(" ".join(mask_secrets(text[:at]).split()))
    flat = " ".join(mask_secrets(text).split())
    if len(flat) <= MAX_EVIDENCE:
        return flat
    start = max(0, min(head - 80, len(flat) - (MAX_EVIDENCE - 2)))
    cut = flat[start:start + MAX_EVIDENCE - 2]
    return ("…" if start else "") + cut + ("…" if start + len(cut) < len(flat) else "")


def _finding(sig: Signature, host: str | None, severity: str, line: str, at: int) -> Finding:
    evidence = _one_line(line, at)
    fix = sig.fix_for(line) if sig.fix_for else sig.fix
    return Finding(sig.id, severity, host, sig.title, evidence, fix)


def _first_match(sig: Signature, pat: Pattern, text: str, low: str) -> tuple[int, int, int] | None:
    """(line start, match offset in the line, line end) of the first line where `pat` matches.

    Finds candidate lines by the pattern's needle in the lower-cased text (a plain substring search),
    and runs the regex on those lines only: logs are large and most lines match nothing.
    """
    pos = low.find(pat.needle)
    while pos >= 0:
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        m = pat.regex.search(text, start, end)
        if m and (sig.ignore is None or not sig.ignore.search(text, start, end)):
            return start, m.start() - start, end
        pos = low.find(pat.needle, end)
    return None


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def _lower(text: str) -> str:
    """Lower-cased text with the same offsets (str.lower can lengthen some non-ASCII characters)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def scan_log(host: str | None, text: str, *, infiniband: bool = False) -> list[Finding]:
    """Findings for the known signatures in `text`, one per signature, ordered by severity.

    The evidence is the first line that matched; the severity is the highest any matching line
    carries (a Gloo loopback warning followed by connectFullMesh failing is an error). `infiniband`
    says InfiniBand is configured for the cluster, which turns NCCL's socket fallback into a finding.
    A symptom is dropped when a signature naming its cause is found too (`Signature.suppressed_by`).
    """
    flags = {"infiniband": infiniband}
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    low = _lower(text)
    hits: dict[str, tuple[str, tuple[int, int, int]]] = {}  # id -> (severity, first line)
    for sig in SIGNATURES:
        if sig.requires is not None and not flags.get(sig.requires):
            continue
        for pat in sig.patterns:
            where = _first_match(sig, pat, text, low)
            if where is None:
                continue
            sev = pat.severity or sig.severity
            if sig.id not in hits:
                hits[sig.id] = (sev, where)
            else:
                worst, first = hits[sig.id]
                hits[sig.id] = (sev if _RANK[sev] < _RANK[worst] else worst, min(first, where))
    out = []
    for id, (sev, (start, at, end)) in hits.items():
        sig = _BY_ID[id]
        if not any(cause in hits for cause in sig.suppressed_by):
            out.append(_finding(sig, host, sev, text[start:end], at))
    return sort_findings(out)


def scan_logs(logs: Mapping[str | None, str], *, infiniband: bool = False) -> list[Finding]:
    """`scan_log` over several hosts' logs ({host: text}), merged and ordered."""
    out: list[Finding] = []
    for host, text in logs.items():
        out.extend(scan_log(host, text, infiniband=infiniband))
    return sort_findings(out)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Errors first, then by host (cluster-wide findings before per-host ones), then by id."""
    return sorted(findings, key=lambda f: (_RANK.get(f.severity, len(SEVERITIES)),
                                           f.host is not None, f.host or "", f.id))


# -- root cause ------------------------------------------------------------------------------

#: What vLLM, Ray, torch.distributed and log collectors put before a line's own text, one at a time (they
#: nest: "(EngineCore_DP0 pid=9) (RayWorkerWrapper pid=5, ip=10.0.0.2) ERROR 11-21 02:34:44 [core.py:1] ").
#: Exactly one space after each is dropped, so a traceback line keeps its own indentation.
_LINE_PREFIX = re.compile(
    r"\([^()\n]*\bpid=\d+[^()\n]*\) ?"  # (APIServer pid=1), (Worker_TP0 pid=6), (RayWorkerWrapper pid=5, ip=..)
    r"|\[rank\d+\]: ?"  # torch.distributed
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? (?:\[[^\]\n]*\]|\S+\]) ?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)? (?:(?:stdout|stderr) [FP] )?"  # docker, CRI
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[,.]\d+)? \| \w+ \| \w+ \| ?")  # "2024-01-22 14:32:27 | ERROR | stderr | "
#: The last line of a traceback: `ValueError: ...`, `torch.distributed.DistBackendError: ...`,
#: `ray.exceptions.RayTaskError(KeyError): ...`, or a bare `AssertionError`.
_EXC_LINE = re.compile(r"(?P<name>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)"
                       r"|Exception))(?:\([\w.]+\))?(?::(?P<msg>.*))?")
#: A pydantic error under `ValidationError: 1 validation error for VllmConfig` (vLLM's configs are pydantic
#: dataclasses): `  Value error, <the message> [type=value_error, input_value=ArgsKwargs(...), ...]`.
_PYDANTIC_DETAIL = re.compile(r"\s+(?P<msg>\S.*?)\s*\[type=[\w.]+[,\]].*"
                              r"|\s*(?P<bare>(?:Value error|Assertion failed), \S.*)")
_PYDANTIC_LOC = re.compile(r"[A-Za-z_][\w.\[\]]*")
#: Substrings a line needs before the regexes above are tried (logs are large, most lines are neither).
_EXC_HINT = re.compile(r"Error|Exception|Exit|Interrupt|Failure|Fault|\[type=|Value error|Assertion failed")
#: Exceptions that only point elsewhere ("See root cause above") or come from shutting down.
_WRAPPER = re.compile(r"root cause|see (?:the )?stack trace|^\d+ validation errors? for \w+$|^ray::"
                      r"|likely shutting down", re.IGNORECASE)
_WRAPPER_NAMES = ("SystemExit", "KeyboardInterrupt", "CancelledError")


def _strip_prefixes(line: str) -> str:
    while m := _LINE_PREFIX.match(line):
        line = line[m.end():]
    return line


def _cut(text: str) -> str:
    flat = " ".join(mask_secrets(text).split())
    return flat if len(flat) <= MAX_EVIDENCE else flat[:MAX_EVIDENCE - 1] + "…"


def _exception_at(lines: list[str], i: int) -> tuple[str, bool] | None:
    """(message, is a wrapper) when line i ends a traceback or is a pydantic error; None otherwise."""
    line = _strip_prefixes(lines[i])
    prev = _strip_prefixes(lines[i - 1]) if i else ""
    if m := _PYDANTIC_DETAIL.fullmatch(line.rstrip()):
        msg = (m["msg"] or m["bare"]).split(" [type=")[0].strip()
        loc = prev.strip() if _PYDANTIC_LOC.fullmatch(prev) and not _EXC_LINE.fullmatch(prev) else ""
        return (f"{loc}: {msg}" if loc else msg), False
    m = _EXC_LINE.fullmatch(line.rstrip())
    if not m:
        return None
    name, msg = m["name"], (m["msg"] or "").strip()
    wrapper = name.rsplit(".", 1)[-1] in _WRAPPER_NAMES or bool(_WRAPPER.search(msg))
    if msg:
        return line.strip(), wrapper
    j = i - 1
    while j >= 0 and _strip_prefixes(lines[j]).strip() and not _strip_prefixes(lines[j]).strip("^~ "):
        j -= 1  # Python 3.11+ marks the failing expression with ^^^ under the code line
    code = _strip_prefixes(lines[j]) if j >= 0 else ""
    if not code[:1].isspace() or not code.strip():  # a bare name counts only under a traceback's code line
        return None
    return f"{name} at `{code.strip()}`", wrapper


def root_cause(log_text: str) -> str | None:
    """vLLM's own root-cause line in a log, or None when the log holds no exception.

    The log may interleave processes and nodes, with vLLM's, Ray's and torch's line prefixes and ANSI
    colours. The answer is the last exception that is not a mere wrapper: vLLM's front end ends the log
    with `RuntimeError: Engine core initialization failed. See root cause above.` and the like, so the
    specific error before it is the cause. A pydantic validation error gives its detail line (`Value
    error, ...` without the `[type=...]` tail), a bare `AssertionError` the code line it failed on. One
    line, tokens masked, at most MAX_EVIDENCE characters.
    """
    text = _ANSI.sub("", log_text).replace("\r\n", "\n").replace("\r", "\n")
    lines = text.split("\n")
    wrapper: str | None = None
    for i in range(len(lines) - 1, -1, -1):
        if not _EXC_HINT.search(lines[i]):
            continue
        found = _exception_at(lines, i)
        if found is None:
            continue
        msg, is_wrapper = found
        if not is_wrapper:
            return _cut(msg)
        wrapper = wrapper or msg
    if wrapper:
        return _cut(wrapper)
    # No exception: the command line itself was refused (argparse's `vllm: error: ...`).
    usage = [ln for ln in lines if _USAGE_ERROR.match(ln.strip())]
    return _cut(usage[-1].strip()) if usage else None


_USAGE_ERROR = re.compile(r"^vllm(?: serve)?: error: \S")


def root_cause_of(tails: Mapping[str, str]) -> str | None:
    """vLLM's root-cause line (root_cause) in several nodes' logs, host -> text, the head's first:
    the first found, with the node named when it came from another node than the first."""
    for host, text in tails.items():
        found = root_cause(text)
        if found:
            return found if host == next(iter(tails)) else f"{host}: {found}"
    return None


# -- cluster checks --------------------------------------------------------------------------


@dataclass(frozen=True)
class Interface:
    name: str
    #: Addresses without prefix length, IPv4 and IPv6 ("10.0.0.5", "fe80::1").
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostReport:
    """What the caller gathered on one host. None / empty: not known, the check is skipped."""

    host: str
    gpu_count: int | None = None
    gpu_names: tuple[str, ...] = ()
    driver_version: str | None = None
    #: The host's clock (Unix epoch seconds), sampled by the caller at (nearly) the same moment on every
    #: host; correct for SSH latency before passing it.
    clock_epoch: float | None = None
    #: Free bytes on the filesystem holding Docker's data root.
    disk_free_bytes: int | None = None
    #: The data-plane IP from the inventory.
    ip: str | None = None
    #: VLLM_HOST_IP as the node container has it.
    vllm_host_ip: str | None = None
    #: The IP Ray registered for this node (`ray list nodes` / `ray status`).
    ray_node_ip: str | None = None
    #: The host's interfaces (see `parse_ip_addr`); with --network host the container sees the same.
    interfaces: tuple[Interface, ...] = ()
    #: *_SOCKET_IFNAME variables as the node container gets them, e.g. (("NCCL_SOCKET_IFNAME", "eth1"),).
    socket_env: tuple[tuple[str, str], ...] = ()

    @property
    def node_ip(self) -> str | None:
        return self.ip or self.ray_node_ip or self.vllm_host_ip


def parse_ip_addr(text: str) -> tuple[Interface, ...]:
    """Interfaces and their addresses from `ip -o addr show` output (read by facts.parse_ip_addrs)."""
    addrs: dict[str, list[str]] = {}
    for name, addr in parse_ip_addrs(text):
        if name:
            addrs.setdefault(name, []).append(addr)
    return tuple(Interface(n, tuple(a)) for n, a in addrs.items())


def _select_interfaces(var: str, value: str, ifaces: Sequence[Interface]) -> list[Interface] | None:
    """The interfaces `value` selects; None when the value is not valid syntax for `var`.

    NCCL_SOCKET_IFNAME: comma-separated prefixes; a leading ^ excludes them, a leading = matches names
    exactly. GLOO_SOCKET_IFNAME: comma-separated exact names. TP_SOCKET_IFNAME: one exact name.
    """
    spec = value.strip()
    usable = [i for i in ifaces if i.addresses]
    if var == "NCCL_SOCKET_IFNAME":
        exclude = spec.startswith("^")
        spec = spec[1:] if exclude else spec
        exact = spec.startswith("=")
        spec = spec[1:] if exact else spec
        names = [n.strip() for n in spec.split(",") if n.strip()]

        def hit(i: Interface) -> bool:
            return any(i.name == n if exact else i.name.startswith(n) for n in names)

        return [i for i in usable if hit(i) != exclude]
    if spec[:1] in ("^", "="):
        return None
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if var == "TP_SOCKET_IFNAME":
        names = names[:1]
    return [i for i in usable if i.name in names]


def _describe(ifaces: Sequence[Interface]) -> str:
    def v4(i: Interface) -> str:
        four = [a for a in i.addresses if ":" not in a]
        return f"{i.name} ({', '.join(four)})" if four else i.name
    return ", ".join(v4(i) for i in ifaces) or "none"


def _check_ifnames(r: HostReport) -> list[Finding]:
    if not r.interfaces:
        return []
    out: list[Finding] = []
    ip = r.node_ip
    holder = next((i for i in r.interfaces if ip and ip in i.addresses), None)
    env = dict(r.socket_env)
    for var in SOCKET_IFNAME_VARS:
        value = env.get(var)
        if not value:
            continue
        propose = (f"Set {var}={holder.name} for {r.host} (the interface holding {ip}) in the "
                   "inventory's per-host env." if holder else
                   f"Set {var} for {r.host} to an interface listed by `ip -o -4 addr` on the host.")
        chosen = _select_interfaces(var, value, r.interfaces)
        if chosen is None:
            out.append(Finding(
                "socket-ifname-missing", "error", r.host,
                f"{var} uses NCCL's ^/= syntax, which Gloo and TensorPipe do not understand",
                _one_line(f"{var}={value}; interfaces: {_describe(r.interfaces)}"),
                propose + f" {var} takes plain interface names."))
        elif not chosen:
            out.append(Finding(
                "socket-ifname-missing", "error", r.host,
                f"{var} names an interface that does not exist on {r.host}",
                _one_line(f"{var}={value} matches no interface; interfaces: {_describe(r.interfaces)}"),
                propose))
        elif ip and not any(ip in i.addresses for i in chosen):
            out.append(Finding(
                "socket-ifname-wrong-ip", "warning", r.host,
                f"{var} selects an interface that does not hold the node's IP {ip}, so peers may not "
                "reach it",
                _one_line(f"{var}={value} selects {_describe(chosen)}, not the interface holding {ip}"),
                propose))
    return out


def _odd_ones(values: Mapping[str, object]) -> tuple[object | None, list[str]]:
    """(the majority value, hosts that differ from it); (None, all hosts) when there is no majority."""
    counts = Counter(values.values()).most_common()
    if len(counts) <= 1:
        return (counts[0][0] if counts else None), []
    if counts[0][1] == counts[1][1]:
        return None, list(values)
    return counts[0][0], [h for h, v in values.items() if v != counts[0][0]]


def _differs(id: str, severity: str, title: str, fix: str, values: Mapping[str, object],
             show: Callable[[object], str]) -> list[Finding]:
    majority, odd = _odd_ones(values)
    if not odd:
        return []
    everyone = "; ".join(f"{h}: {show(v)}" for h, v in values.items())
    if majority is None:
        return [Finding(id, severity, None, title, _one_line(everyone), fix)]
    return [Finding(id, severity, h, title,
                    _one_line(f"{h}: {show(values[h])}; the other nodes: {show(majority)}"), fix)
            for h in odd]


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_cluster(reports: Sequence[HostReport], *, image_size_bytes: int | None = None,
                  max_skew_s: float = 1.0) -> list[Finding]:
    """Cross-node and per-node consistency findings, ordered by severity then host.

    Clock offsets are measured against the first report that has a clock (put the head first).
    Disk needs image_size_bytes x 1.2 + 10 GiB free, or 20 GiB when the image size is not known.
    """
    out: list[Finding] = []

    counts = {r.host: r.gpu_count for r in reports if r.gpu_count is not None}
    for host, n in counts.items():
        if n == 0:
            out.append(Finding(
                "gpu-not-visible", "error", host, f"{host} reports no GPU",
                _one_line(f"{host}: 0 GPUs (nvidia-smi)"),
                "Check the NVIDIA driver (`nvidia-smi` on the host) and that the node belongs in a GPU "
                "cluster; remove it from the inventory or set accelerator: none for CPU-only clusters."))
    out += _differs(
        "gpu-count-mismatch", "warning",
        "Nodes have different GPU counts; vLLM spreads tensor/pipeline ranks evenly, so the extra GPUs "
        "sit idle or the layout does not fit",
        "Give every node the same number of GPUs (CUDA_VISIBLE_DEVICES / `--gpus '\"device=0,1\"'`), and "
        "set the inventory's per-host gpus to match; tensor_parallel_size is usually the per-node count.",
        {h: n for h, n in counts.items() if n}, lambda n: f"{n} GPUs")
    out += _differs(
        "gpu-model-mismatch", "warning",
        "Nodes have different GPU models; the slowest GPU sets the pace and memory limits",
        "Use nodes with the same GPU model, or accept that throughput follows the slowest node.",
        {r.host: tuple(sorted(set(r.gpu_names))) for r in reports if r.gpu_names},
        lambda names: " + ".join(names))
    out += _differs(
        "driver-mismatch", "warning",
        "Nodes run different NVIDIA driver versions",
        "Install the same NVIDIA driver version on every node (`nvidia-smi` shows it) so the image's "
        "CUDA and NCCL behave the same everywhere.",
        {r.host: r.driver_version for r in reports if r.driver_version}, lambda v: f"driver {v}")

    clocked = [r for r in reports if r.clock_epoch is not None]
    if clocked:
        ref = clocked[0]
        for r in clocked[1:]:
            offset = r.clock_epoch - ref.clock_epoch
            if abs(offset) > max_skew_s:
                out.append(Finding(
                    "clock-skew", "warning", r.host,
                    f"{r.host}'s clock is {abs(offset):.2f} s {'ahead of' if offset > 0 else 'behind'} "
                    f"{ref.host}'s",
                    _one_line(f"{r.host} is {offset:+.2f} s from {ref.host} (allowed ±{max_skew_s:g} s)"),
                    "Enable time sync on every node (`timedatectl set-ntp true`, or chrony: `chronyc "
                    "tracking`); skewed clocks break log correlation, timeouts and TLS/token checks."))

    need = image_size_bytes * 1.2 + 10 * GIB if image_size_bytes else 20 * GIB
    basis = (f"image {_gib(image_size_bytes)} x 1.2 + 10 GiB" if image_size_bytes
             else "20 GiB, image size unknown")
    for r in reports:
        if r.disk_free_bytes is not None and r.disk_free_bytes < need:
            out.append(Finding(
                "disk-low", "error", r.host,
                f"{r.host} has too little free disk for the image",
                _one_line(f"{r.host}: {_gib(r.disk_free_bytes)} free, needs {_gib(need)} ({basis})"),
                "Free space under Docker's data root (`docker image prune -a`, `docker system df`) or "
                "move data-root in /etc/docker/daemon.json to a larger disk."))

    for r in reports:
        if r.vllm_host_ip and r.ray_node_ip and r.vllm_host_ip != r.ray_node_ip:
            out.append(Finding(
                "ray-ip-mismatch", "error", r.host,
                "VLLM_HOST_IP differs from the IP Ray registered for this node, so vLLM's placement "
                "group can never be satisfied",
                _one_line(f"{r.host}: VLLM_HOST_IP={r.vllm_host_ip}, Ray node IP={r.ray_node_ip}"),
                f"Use one IP for both on {r.host}: `ray start --node-ip-address={r.ray_node_ip}` and "
                f"VLLM_HOST_IP={r.ray_node_ip} (or both set to the inventory's data-plane IP)."))

    for r in reports:
        out += _check_ifnames(r)
    return sort_findings(out)
