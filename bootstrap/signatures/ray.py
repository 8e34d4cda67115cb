"""Ray's messages, and vLLM's about its Ray executor: a node or its GPUs missing from the Ray cluster,
VLLM_HOST_IP and Ray disagreeing on a node's IP, the GCS out of reach, an image without Ray.
"""
from __future__ import annotations

from bootstrap.signatures.engine import Signature
from bootstrap.signatures.engine import pattern as _p

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
)
