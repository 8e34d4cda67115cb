"""What a node runs out of or is refused: GPU memory (CUDA), a port, disk, the model download
(huggingface_hub).
"""
from __future__ import annotations

import re

from bootstrap.signatures.engine import Signature
from bootstrap.signatures.engine import pattern as _p

SIGNATURES: tuple[Signature, ...] = (
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
)
