#!/usr/bin/env python3
"""`nvidia-container-runtime-hook` for the GPU-shaped sandbox: what the NVIDIA Container Toolkit's
prestart hook does for `docker run --gpus`, minus the GPU.

Docker 20.10 looks this executable up by name on dockerd's PATH when dockerd starts; with it there,
`docker run --gpus all` (or `--gpus '"device=0,1"'`) sets NVIDIA_VISIBLE_DEVICES in the container's
environment and runs `nvidia-container-runtime-hook prestart` with the container's state (JSON) on
stdin. Like the real hook, this one reads the bundle's config.json for the root filesystem and
NVIDIA_VISIBLE_DEVICES, and makes the selected GPUs visible in the container: it places the
sandbox's nvidia-smi there (/usr/local/bin/nvidia-smi) with a state holding those GPUs only,
renumbered from 0 as a container sees them. A container started without `--gpus` is not touched:
it has no nvidia-smi. With /sandbox/gpu/hook-error present on the node, the hook fails with that
file's text, the way a broken driver installation makes every `--gpus` container fail to start.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

#: the node's GPU state and the files to place (overridable for tests)
GPU_DIR = Path(os.environ.get("SANDBOX_GPU_DIR", "/sandbox/gpu"))
SMI = Path(os.environ.get("SANDBOX_NVIDIA_SMI", "/usr/local/bin/nvidia-smi"))
IN_CONTAINER = "usr/local/bin"


def select(gpus: list[dict], visible: str) -> list[dict]:
    """The GPUs NVIDIA_VISIBLE_DEVICES names ("all", "none", indexes or UUIDs, comma-separated)."""
    if visible == "all":
        return list(gpus)
    if visible == "none":
        return []
    chosen = []
    for want in (w.strip() for w in visible.split(",") if w.strip()):
        match = [g for g in gpus if str(g["index"]) == want or g["uuid"] == want]
        if not match:
            raise LookupError(f"unknown device id: {want}")
        chosen.append(match[0])
    return chosen


def prestart(state: dict) -> str | None:
    """Place nvidia-smi in the container when it asks for GPUs; returns what was done (or None)."""
    bundle = Path(state.get("bundle") or state.get("bundlePath") or ".")
    config = json.loads((bundle / "config.json").read_text())
    root = Path(config["root"]["path"])
    root = root if root.is_absolute() else bundle / root
    env = dict(e.split("=", 1) for e in config.get("process", {}).get("env", []) if "=" in e)
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if visible in ("", "void"):
        return None
    node = json.loads((GPU_DIR / "state.json").read_text())
    chosen = [{**g, "index": i} for i, g in enumerate(select(node.get("gpus", []), visible))]
    dest = root / IN_CONTAINER
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SMI, dest / "nvidia-smi")
    os.chmod(dest / "nvidia-smi", 0o755)
    (dest / "nvidia-smi.json").write_text(json.dumps({**node, "gpus": chosen}, indent=1) + "\n")
    return f"{len(chosen)} GPU(s) visible in {root}"


def main(argv: list[str], stdin) -> int:
    if argv[1:2] != ["prestart"]:
        return 0  # poststart, poststop: nothing to undo
    broken = GPU_DIR / "hook-error"
    if broken.is_file():
        sys.stderr.write(broken.read_text())
        return 1
    try:
        prestart(json.load(stdin))
    except LookupError as exc:
        sys.stderr.write(f"nvidia-container-cli: device error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv, sys.stdin))
