"""Docker and the platform detection of vLLM and torch: a container started without its GPUs; a
container of ours restarted without its secrets (after a reboot emptied the host's /run)."""
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
    Signature(
        id="secret-gone",
        severity="error",
        # cluster/secretstore.py's entrypoint, when a secret's file is not on the host's tmpfs
        patterns=(_p(r"bootstrap: the secret \S+ is not on this host", needle="bootstrap: the secret"),),
        title="A container of ours was (re)started without a secret it needs: the host's /run, where "
              "bootstrap keeps the secrets in memory, was emptied (a reboot) or the files were removed",
        fix="Run `bootstrap up` with the secrets set in your environment (it puts them back and restarts the "
            "containers), then `bootstrap serve` for a fleet; see docs/security.md, secrets.",
        sources=("bootstrap/cluster/secretstore.py (this project: the line its entrypoint prints)",),
    ),
)
