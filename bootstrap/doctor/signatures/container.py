"""Docker and the platform detection of vLLM and torch: a container started without its GPUs."""
from __future__ import annotations

from bootstrap.doctor.signatures.engine import Signature
from bootstrap.doctor.signatures.engine import pattern as _p

SIGNATURES: tuple[Signature, ...] = (
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
            # torch's own words when CUDA cannot use what it was given (recorded on an H200 with the
            # GPU hidden: tests/data/gpu/h200-cuda-probe.txt) or has no driver at all
            _p(r"No CUDA GPUs are available"),
            _p(r"Found no NVIDIA driver on your system"),
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
)
