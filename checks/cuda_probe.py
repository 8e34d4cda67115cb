"""Can CUDA in this container use the GPUs the host's nvidia-smi lists? Prints one JSON line.

Runs INSIDE a node's container, fed on stdin, before check-nccl's all-reduce on a GPU cluster:

  cuda_probe.py

  {"torch": "2.11.0+cu130" or null, "cuda": torch.version.cuda or null, "devices": N,
   "visible": $NVIDIA_VISIBLE_DEVICES or null, "error": null or "Type: message"}

`devices` is torch.cuda.device_count(); when it is 0, `error` is what initialising CUDA says
(torch.cuda.init(): "Found no NVIDIA driver on your system", "The NVIDIA driver on your system is
too old", ...), or why torch could not be imported. Exit status 0 whenever the line was printed.
Standard library and torch only.
"""
import json
import os


def main():
    doc = {"torch": None, "cuda": None, "devices": 0, "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
           "error": None}
    try:
        import torch
    except Exception as exc:  # an image without torch, or a broken one: the line says which
        doc["error"] = f"{type(exc).__name__}: {exc}"[:500]
        print(json.dumps(doc))
        return 0
    doc["torch"] = torch.__version__
    doc["cuda"] = torch.version.cuda
    try:
        doc["devices"] = int(torch.cuda.device_count())
        if not doc["devices"]:
            torch.cuda.init()  # raises with CUDA's own reason; returns when a device appeared
            doc["devices"] = int(torch.cuda.device_count())
            if not doc["devices"]:
                doc["error"] = "torch.cuda.device_count() is 0"
    except Exception as exc:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        doc["error"] = text[:500]
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
