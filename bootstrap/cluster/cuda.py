"""Does CUDA initialise on a GPU node, pure: checks/cuda_probe.py's line read, and what a short answer means.

`up` runs the probe in a throw-away container of the cluster image, given the GPUs the way the node's
Docker gives them, before any container of the cluster starts (cluster/run.py); check-nccl runs it in the
node containers before its all-reduce (nccl/run.py). nvidia-smi can list every GPU while CUDA cannot use
one: error 802 on an NVSwitch host whose Fabric Manager is not running, 803 after a driver upgrade
without a reboot, 804 where the image's CUDA is newer than the driver and its compat libraries do not
serve the GPU (samples: tests/data/logs/cuda-fabric-manager__1.log, tests/data/gpu).
"""
from __future__ import annotations

from typing import Mapping

from bootstrap.remote.session import last_json

#: CUDA's own error numbers in what initialising it said, and what each means on a GPU host.
ERRORS = (
    (("Error 802", "(802)", "cudaErrorSystemNotReady"),
     ": CUDA error 802 (system not yet initialized), an NVSwitch host whose NVIDIA Fabric Manager is not running "
     "or not the driver's version",
     "install nvidia-fabricmanager of the driver's exact version and `systemctl enable --now nvidia-fabricmanager` "
     "(`nvidia-smi -q | grep -A2 Fabric` then says Completed), then run check-nccl again"),
    (("Error 803", "(803)"),
     ": CUDA error 803 (unsupported display driver / cuda driver combination): the driver's libraries and its "
     "kernel module differ",
     "reboot the host after a driver upgrade (or reload nvidia modules) so the kernel module matches the driver"),
    (("Error 804", "(804)"),
     ": CUDA error 804 (forward compatibility on unsupported hardware): the image's CUDA is newer than the driver "
     "and its compat libraries do not serve this GPU",
     "upgrade the host's driver to one that runs the image's CUDA, or use an image built for the driver's CUDA"),
)
GENERIC_FIX = ("use a CUDA build of the image (vllm/vllm-openai), a driver at least as new as the image's CUDA, "
               "and --gpus all (check `docker run --rm --gpus all IMAGE nvidia-smi`); "
               "`check-nccl --backend gloo` measures the network over CPU meanwhile")


def parse_probe(out: str) -> dict | None:
    """checks/cuda_probe.py's JSON line (the last one of the output), or None."""
    doc = last_json(out)
    return doc if doc is not None and "devices" in doc else None


def cause(why: str) -> tuple[str, str]:
    """(what to add to the finding, its fix) from what initialising CUDA said."""
    for needles, what, fix in ERRORS:
        if any(n in why for n in needles):
            return what, fix
    return "", GENERIC_FIX


def cpu_build(doc: Mapping) -> bool:
    """The image's torch has no CUDA (a CPU build), or no torch at all: CUDA's state cannot be read with it."""
    return doc.get("torch") is None or doc.get("cuda") is None


def short(doc: Mapping, gpus: int) -> tuple[str, str, str] | None:
    """(what, evidence, fix) where CUDA sees fewer than `gpus` GPUs; None when it sees them all."""
    n = int(doc.get("devices") or 0)
    if n >= gpus:
        return None
    why = str(doc.get("error") or "")
    ev = f"torch {doc.get('torch')} (CUDA {doc.get('cuda') or 'none: a CPU build'}) sees {n} GPU(s)"
    ev += f": {why}" if why else ""
    what, fix = cause(why)
    return f"CUDA in the container sees {n} of the {gpus} GPU(s) nvidia-smi lists, so NCCL cannot run{what}", ev, fix
