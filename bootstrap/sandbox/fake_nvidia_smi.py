#!/usr/bin/env python3
"""`nvidia-smi` for the GPU-shaped sandbox: answers from a JSON state, never from a GPU.

Installed as /usr/local/bin/nvidia-smi on each GPU-shaped node, where it reads the node's state
(/sandbox/gpu/state.json, which a test may rewrite to make one node differ: fewer GPUs, another
driver, a busy GPU), and placed into each container started with `--gpus` by the sandbox's stand-in
for the NVIDIA Container Toolkit's hook (fake_gpu_hook.py), with the GPUs NVIDIA_VISIBLE_DEVICES
selects. It answers `--query-gpu=F,... --format=csv[,noheader][,nounits]`, `-L`, `--version` and the
default table, in the formats of the real H100 recordings (../shared/gpu/, driver 580.159.04); an
unknown option or field is refused with the real tool's words and exit code. Standard library only:
it runs with any python3 (the node's, the vLLM image's).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

#: where the state is looked for, first found wins
STATE_ENV = "SANDBOX_NVIDIA_SMI_STATE"
NODE_STATE = "/sandbox/gpu/state.json"
BESIDE = "nvidia-smi.json"

#: --query-gpu fields: (state key, unit suffix without nounits, format)
FIELDS = {
    "index": ("index", "", "{}"),
    "name": ("name", "", "{}"),
    "uuid": ("uuid", "", "{}"),
    "gpu_uuid": ("uuid", "", "{}"),
    "pci.bus_id": ("bus_id", "", "{}"),
    "driver_version": ("driver", "", "{}"),
    "memory.total": ("memory_total", " MiB", "{}"),
    "memory.used": ("memory_used", " MiB", "{}"),
    "memory.free": ("memory_free", " MiB", "{}"),
    "utilization.gpu": ("utilization", " %", "{}"),
    "temperature.gpu": ("temperature", "", "{}"),
    "power.draw": ("power_draw", " W", "{:.2f}"),
    "power.limit": ("power_limit", " W", "{:.2f}"),
    "count": ("count", "", "{}"),
}


def load_state() -> dict:
    candidates = [os.environ.get(STATE_ENV), str(Path(__file__).resolve().with_name(BESIDE)), NODE_STATE]
    for c in candidates:
        if c and os.path.isfile(c):
            with open(c) as f:
                return json.load(f)
    return {"gpus": [], "error": {"message": "NVIDIA-SMI has failed because it couldn't communicate with the "
                                             "NVIDIA driver. Make sure that the latest NVIDIA driver is "
                                             "installed and running.", "code": 9}}


def gpu_values(state: dict, gpu: dict) -> dict:
    total, used = int(gpu.get("memory_total", 81559)), int(gpu.get("memory_used", 0))
    return {**gpu, "driver": state.get("driver", ""), "memory_total": total, "memory_used": used,
            "memory_free": total - used, "utilization": int(gpu.get("utilization", 0)),
            "temperature": int(gpu.get("temperature", 36)), "power_draw": float(gpu.get("power_draw", 125)),
            "power_limit": float(gpu.get("power_limit", 700)), "count": len(state.get("gpus", []))}


def query(state: dict, fields: list[str], fmt: str) -> tuple[str, int]:
    opts = fmt.split(",")
    if opts[0] != "csv":
        return f'"{fmt}" is not a valid format.\n', 2
    for f in fields:
        if f not in FIELDS:
            return f'Field "{f}" is not a valid field to query.\n\n', 2
    rows = []
    if "noheader" not in opts:
        rows.append(", ".join(f + ("" if "nounits" in opts or not FIELDS[f][1] else f" [{FIELDS[f][1].strip()}]")
                              for f in fields))
    for gpu in state.get("gpus", []):
        v = gpu_values(state, gpu)
        cells = []
        for f in fields:
            key, unit, form = FIELDS[f]
            cells.append(form.format(v[key]) + ("" if "nounits" in opts else unit))
        rows.append(", ".join(cells))
    return "".join(r + "\n" for r in rows), 0


def table(state: dict) -> str:
    line = "+" + "-" * 89 + "+"
    cell = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    head = (f"| NVIDIA-SMI {state.get('driver', ''):<22} Driver Version: {state.get('driver', ''):<14} "
            f"CUDA Version: {state.get('cuda', ''):<9}|")
    out = [time.strftime("%a %b %d %H:%M:%S %Y") + "       ", line, head, cell,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"]
    for gpu in state.get("gpus", []):
        v = gpu_values(state, gpu)
        name = f"{v['name']:<31}"[:31]
        out.append(f"|{v['index']:>4}  {name}On  |{v['bus_id']:>19} Off |{0:>21} |")
        power = f"{int(v['power_draw'])}W / {int(v['power_limit']):>4}W"
        mem = f"{v['memory_used']}MiB / {v['memory_total']:>6}MiB"
        util = f"{v['utilization']}%"
        out.append(f"| N/A   {v['temperature']:>2}C    P0{power:>24} | {mem:>22} | {util:>7}      Default |")
        out.append("|                                         |                        |             Disabled |")
        out.append(cell)
    out += ["", line,
            "| Processes:                                                                              |",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|",
            "|  No running processes found                                                             |",
            line]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> tuple[str, str, int]:
    """(stdout, stderr, exit code) for nvidia-smi's arguments."""
    state = load_state()
    if state.get("error"):
        return state["error"]["message"] + "\n", "", int(state["error"].get("code", 9))
    fields, fmt, rest = None, None, []
    it = iter(argv)
    for a in it:
        if a.startswith("--query-gpu="):
            fields = [f.strip() for f in a.split("=", 1)[1].split(",") if f.strip()]
        elif a == "--query-gpu":
            fields = [f.strip() for f in next(it, "").split(",") if f.strip()]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        elif a == "--format":
            fmt = next(it, "")
        else:
            rest.append(a)
    if fields is not None:
        if rest:
            return "", f"Invalid combination of input arguments: {' '.join(rest)}\n", 2
        out, rc = query(state, fields, fmt or "csv")
        return (out, "", rc) if rc == 0 else ("", out, rc)
    if rest == ["-L"] or rest == ["--list-gpus"]:
        return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in state.get("gpus", [])), "", 0
    if rest == ["--version"]:
        return (f"NVIDIA-SMI version  : {state.get('driver', '')}\nDRIVER version      : {state.get('driver', '')}\n"
                f"CUDA Version        : {state.get('cuda', '')}\n"), "", 0
    if not rest:
        if not state.get("gpus"):
            return "No devices were found\n", "", 6
        return table(state), "", 0
    return "", f"\nERROR: Option {rest[0]} is not recognized. Please run 'nvidia-smi -h'.\n\n", 2


if __name__ == "__main__":
    out, err, rc = main(sys.argv[1:])
    sys.stdout.write(out)
    sys.stderr.write(err)
    sys.exit(rc)
