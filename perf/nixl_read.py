"""NIXL alone, no vLLM: how long one READ of a few KV-sized blocks takes between two hosts.

The target registers a buffer (`--mib`, like an engine's KV cache) and stays idle, looking at its
notifications once a second (as a prefill engine between requests); the initiator READs 4 blocks
of 128 KiB `-n` times and prints each READ's time. The agent settings are vLLM 0.32 NixlConnector's
(UCX with 4 threads, telemetry on). Run it in the serving image on two nodes, target first:

    python -m perf.nixl_read target 10.0.0.1 5700 --seconds 90
    python -m perf.nixl_read initiator 10.0.0.1 5700 -n 10

docs/replicas.md has what it measured on the sandbox (1.5-102 ms), against a decode step of 32 s.
"""
from __future__ import annotations

import argparse
import pickle
import socket
import sys
import time

BLOCK_FLOATS = 32768  # 128 KiB of float32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("target", "initiator"))
    ap.add_argument("ip", help="the target's IP (the target listens there)")
    ap.add_argument("port", type=int, help="a free TCP port on the target for the metadata exchange")
    ap.add_argument("--mib", type=int, default=1024, help="the registered buffer (MiB, default 1024)")
    ap.add_argument("--threads", type=int, default=4, help="UCX threads (vLLM's default 4)")
    ap.add_argument("--seconds", type=float, default=90.0, help="how long the target stays up")
    ap.add_argument("-n", type=int, default=10, help="READs by the initiator")
    ap.add_argument("--pthr-delay-us", type=int, default=None,
                    help="microseconds between the progress thread's passes (NIXL's Python API: 0)")
    a = ap.parse_args(argv)
    import torch  # the serving image has both
    from nixl._api import nixl_agent, nixl_agent_config

    if a.pthr_delay_us is not None:
        from perf.nixl_idle import pace

        pace(a.pthr_delay_us)

    agent = nixl_agent(a.mode, nixl_agent_config(num_threads=a.threads, capture_telemetry=True))
    rows = max(4, a.mib * 1024 * 1024 // (BLOCK_FLOATS * 4))
    buf = (torch.ones if a.mode == "target" else torch.zeros)((rows, BLOCK_FLOATS), dtype=torch.float32)
    agent.register_memory(buf)
    blocks = [buf[i * (rows // 4), :] for i in range(4)]
    descs = agent.get_xfer_descs(blocks)
    if a.mode == "target":
        with socket.create_server((a.ip, a.port)) as srv:
            srv.settimeout(a.seconds)
            conn, _ = srv.accept()
            with conn:
                conn.sendall(pickle.dumps((agent.get_agent_metadata(), agent.get_serialized_descs(descs))))
        seen, end = 0, time.monotonic() + a.seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            seen += sum(len(v) for v in agent.get_new_notifs().values())
        print(f"target: {seen} notification(s)")
        return 0
    with socket.create_connection((a.ip, a.port), timeout=30) as c:
        data = b"".join(iter(lambda: c.recv(1 << 20), b""))
    md, remote = pickle.loads(data)  # the target is ours: this exchange never leaves the two nodes
    name = agent.add_remote_agent(md)
    rdescs = agent.deserialize_descs(remote)
    for i in range(a.n):
        h = agent.initialize_xfer("READ", descs, rdescs, name, b"done")
        t0 = time.perf_counter()
        agent.transfer(h)
        while (state := agent.check_xfer_state(h)) == "PROC":
            time.sleep(0.001)
        ok = all(bool(torch.all(b == 1)) for b in blocks)
        print(f"read {i}: {state} {(time.perf_counter() - t0) * 1000:.1f} ms, data {'ok' if ok else 'WRONG'}")
        agent.release_xfer_handle(h)
        for b in blocks:
            b.zero_()
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
