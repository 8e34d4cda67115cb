#!/usr/bin/env python3
"""What an idle NIXL agent costs on a CPU: the process's CPU time over a quiet window, per agent setting.

vLLM's NixlConnector makes one NIXL agent per worker with `nixl_agent_config(num_threads=4,
capture_telemetry=True)` (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py), which
leaves NIXL's progress thread on (its default). This starts, in turn and each in a process of its own,
no agent, an agent with vLLM's settings, and the same agent without the progress thread; each registers a
16 MiB buffer as vLLM registers its KV cache, waits a second, then measures its own user + system CPU time
over --seconds with nothing to transfer. Prints the rows side by side. No vLLM, no bootstrap: run it in the
image that serves (the sandbox's holds NIXL 1.5.1):

  docker run --rm --cpus 2 -v $PWD:/w -w /w --entrypoint python3 IMAGE -m perf.nixl_idle
"""
from __future__ import annotations

import argparse
import ctypes
import json
import resource
import subprocess
import sys
import time

ARMS = {
    "no agent": None,
    "vLLM's agent (progress thread on)": {"num_threads": 4, "capture_telemetry": True},
    "the same, progress thread off": {"num_threads": 4, "capture_telemetry": True, "enable_prog_thread": False},
    "on, 1 ms between passes": {"num_threads": 4, "capture_telemetry": True, "pthr_delay_us": 1000},
    "on, 10 ms between passes": {"num_threads": 4, "capture_telemetry": True, "pthr_delay_us": 10000},
}


def pace(delay_us: int) -> None:
    """Make every NIXL agent made after this call wait `delay_us` between its progress thread's passes.

    NIXL 1.5.1's Python API hard-codes `pthrDelay = 0` (a pass right after the last, a spinning core);
    the C++ agent takes the delay as a setting. This wraps the binding's agent constructor to set it."""
    import nixl._api as api

    real = api.nixlBind

    class Paced:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def nixlAgent(name, cfg):  # noqa: N802 (the binding's name)
            cfg.pthrDelay = delay_us
            return real.nixlAgent(name, cfg)

    api.nixlBind = Paced()


def one(config: dict | None, seconds: float) -> dict:
    """In this process: the agent (if any) with a registered buffer, then CPU time over `seconds` idle."""
    buf = (ctypes.c_char * (16 << 20))()
    if config is not None:
        from nixl._api import nixl_agent, nixl_agent_config

        config = dict(config)
        if "pthr_delay_us" in config:
            pace(config.pop("pthr_delay_us"))

        agent = nixl_agent("idle", nixl_agent_config(**config))
        agent.register_memory([(ctypes.addressof(buf), len(buf), 0, "")], mem_type="DRAM")
    time.sleep(1)
    t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(seconds)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    return {"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime, "wall_s": t1 - t0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: the arm's config as JSON
    args = ap.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(json.loads(args.one), args.seconds)))
        return 0
    print(f"{'agent':36s}  {'CPU % of one core':>17s}  {'user s':>6s}  {'sys s':>6s}")
    for name, config in ARMS.items():
        r = subprocess.run([sys.executable, "-m", "perf.nixl_idle", "--seconds", str(args.seconds),
                            "--one", json.dumps(config)], capture_output=True, text=True, timeout=120)
        line = (r.stdout.strip().splitlines() or [""])[-1]
        try:
            got = json.loads(line)
        except ValueError:
            print(f"{name:36s}  failed: {(r.stderr or r.stdout).strip()[-200:]}")
            continue
        pct = 100 * (got["user_s"] + got["sys_s"]) / got["wall_s"]
        print(f"{name:36s}  {pct:17.1f}  {got['user_s']:6.2f}  {got['sys_s']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
