"""Docker and the platform detection of vLLM and torch: a container started without its GPUs; a
container of ours restarted without its secrets (after a reboot emptied the host's /run); keepalived's
container (a fleet's floating address) without its tools, or giving the address up."""
from __future__ import annotations

from bootstrap.signatures.engine import Signature
from bootstrap.signatures.engine import pattern as _p

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
        id="cuda-fabric-manager",
        severity="error",
        # CUDA's cudaErrorSystemNotReady as torch, vLLM and CUDA's samples print it: on an NVSwitch host
        # (HGX/DGX A100, H100, H200, B200) nvidia-smi lists every GPU while CUDA cannot initialise
        patterns=(
            _p(r"Error 802: system not yet initialized", needle="Error 802"),
            _p(r"cuda runtime error \(802\)", needle="runtime error (802)"),
            _p(r"cudaErrorSystemNotReady"),
        ),
        title="CUDA cannot initialise (error 802, system not yet initialized): on an NVSwitch host the NVIDIA "
              "Fabric Manager is not running, or is not the driver's version",
        fix="Install nvidia-fabricmanager of the driver's exact version (driver 580.x: nvidia-fabricmanager-580) "
            "and run `systemctl enable --now nvidia-fabricmanager`; `nvidia-smi -q | grep -A2 Fabric` then says "
            "Completed. Then `bootstrap up` and `bootstrap check-nccl`.",
        sources=("https://github.com/pytorch/pytorch/issues/35710",
                 "https://github.com/aws-samples/aws-deep-learning-ami-ubuntu-dcv-desktop/issues/33",
                 "https://github.com/huggingface/huggingface_hub/issues/4134"),
    ),
    Signature(
        id="secret-gone",
        severity="error",
        # cluster/guard/secretstore.py's entrypoint, when a secret's file is not on the host's tmpfs
        patterns=(_p(r"bootstrap: the secret \S+ is not on this host", needle="bootstrap: the secret"),),
        title="A container of ours was (re)started without a secret it needs: the host's /run, where "
              "bootstrap keeps the secrets in memory, was emptied (a reboot) or the files were removed",
        fix="Run `bootstrap up` with the secrets set in your environment (it puts them back and restarts the "
            "containers), then `bootstrap serve` for a fleet; see docs/security.md, secrets.",
        sources=("bootstrap/cluster/guard/secretstore.py (this project: the line its entrypoint prints)",),
    ),
    Signature(
        id="vip-image-lacks-keepalived",
        severity="error",
        # checks/vip_entry.sh, when the image of keepalived's container lacks a tool it runs
        patterns=(_p(r"bootstrap: (keepalived|iptables|curl) is not in this image", needle="is not in this image"),),
        title="keepalived's container cannot run: its image lacks keepalived, iptables or curl, so this host "
              "never holds the floating address",
        fix="Install them in the image (Debian: apt-get install keepalived iptables curl) or set "
            "cluster.router.vip.image to one that has them, then `bootstrap serve`; see "
            "docs/high-availability.md.",
        sources=("checks/vip_entry.sh (this project: the line it prints)",),
    ),
    Signature(
        id="vip-router-unready",
        severity="warning",
        # keepalived's own words when the check of its router fails (recorded on the sandbox: the
        # router paused, then the replicas' host killed)
        patterns=(_p(r"VRRP_Script\(router_health\) failed", needle="VRRP_Script(router_health) failed"),),
        title="keepalived gave the floating address up on this host (FAULT): its router did not answer "
              "/readiness (not running, stuck, or no healthy replica in its view)",
        fix="`bootstrap status` shows each router and which host holds the address now; `bootstrap logs "
            "--serve HOST` shows the router's and keepalived's output. The address comes back to this host "
            "only when the one holding it fails (no preemption).",
        sources=("https://github.com/acassen/keepalived/blob/master/doc/man/man5/keepalived.conf.5 "
                 "(vrrp_script, track_script)",),
    ),
)
