"""`torch` as a CUDA build of it answers checks/cuda_probe.py, for the GPU-shaped sandbox's CUDA-shaped image.

The sandbox's vLLM image is a CPU build: its torch has no CUDA, so nothing in it can say whether CUDA would
initialise on a node's (fake) GPUs. The CUDA-shaped variant of the image (recipes.cuda_shaped_stage) puts
this module first on PYTHONPATH as `torch`: it reads the GPUs the fake toolkit hook placed in the container
(/usr/local/bin/nvidia-smi.json, the node's state) and answers as torch 2.9 built for CUDA 13.0 answers on
such a node. A node whose state holds `cuda_error` (gpu.set_gpus: 802 where the Fabric Manager is not
running, 803, 804) lists its GPUs in nvidia-smi while CUDA sees none, with the message torch gives for
that error (`torch.cuda.init()`); a container given no GPUs finds no driver. Nothing else of torch is here.
"""
import json
import os

__version__ = "2.9.0+cu130"

#: Where the fake hook puts the container's GPUs (fake_gpu_hook.IN_CONTAINER; the fake nvidia-smi's override too).
STATE = os.environ.get("SANDBOX_NVIDIA_SMI_STATE", "/usr/local/bin/nvidia-smi.json")
#: cudaGetErrorString() of the errors a node can be given.
MESSAGES = {802: "system not yet initialized",
            803: "system has unsupported display driver / cuda driver combination",
            804: "forward compatibility was attempted on non supported HW"}


class version:  # noqa: N801 - torch.version
    cuda = "13.0"


def _state():
    try:
        with open(STATE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class cuda:  # noqa: N801 - torch.cuda
    @staticmethod
    def device_count():
        s = _state()
        return 0 if not s or s.get("cuda_error") else len(s.get("gpus") or [])

    @staticmethod
    def init():
        s = _state()
        if s is None:
            raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU "
                               "and installed a driver from http://www.nvidia.com/Download/index.aspx")
        err = s.get("cuda_error")
        if err:
            raise RuntimeError("Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
                               "calling NumCudaDevices() that might have already set an error? "
                               f"Error {err}: {MESSAGES.get(err, 'unknown error')}")
