"""How long a vLLM worker takes to see a message its engine wrote: vLLM's shared-memory broadcast
queue alone, without bootstrap, serve or a model.

A minimal reproduction for the token stalls on the sandbox (docs/development.md, "The one-second
stall"): one writer (the engine core's role) enqueues a timestamp into vLLM's own
`MessageQueue` at random gaps; one reader process (a worker's role) dequeues it, records how long
after the write it got it, and "computes" for a few milliseconds. Between reads the reader spins
for `busy_loop_s` (vLLM's SpinCondition), then waits on a ZMQ notification with a poll timeout of
SHM_READER_RECHECK_INTERVAL_MS (5000 ms in vLLM 0.32): a read that takes about that long was woken
by the timeout, not by the writer's notification. Optional busy processes share the CPUs, as the
other nodes' processes do on the sandbox.

Runs INSIDE the vLLM image (it imports vllm):

    docker run --rm --cpus 2 -v "$PWD/perf:/perf:ro" --entrypoint python3 IMAGE \\
        /perf/shm_wake.py --busy 0,0.1,1 --messages 300 --hogs 2

Prints one line per busy_loop_s: read latency p50/p99/max, reads slower than 50 ms and than 1 s,
and those within 0.5 s of a multiple of the poll timeout. A reproduction, not a benchmark: it states
no target. `--default-hwm` and `--no-conflate` change one ZMQ option of vLLM's each (a diagnosis);
perf/README.md, "The lost notification", has the runs.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import time


def _hog(stop) -> None:
    while not stop.is_set():
        pass


def _without(option: str):
    """vLLM's `zmq` module with one socket option turned into a harmless one (LINGER), so that
    shm_broadcast's own setsockopt of it does nothing: a diagnosis only."""
    import zmq

    class _Zmq:
        def __getattr__(self, name):
            return zmq.LINGER if name == option else getattr(zmq, name)
    return _Zmq()


def _reader(handle, n: int, busy: float, compute_s: float, out, conflate: bool = True,
            recheck_ms: int | None = None) -> None:
    from vllm.distributed.device_communicators import shm_broadcast as SB
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    if recheck_ms is not None:  # the idle reader's poll timeout (read at each wait)
        SB.SHM_READER_RECHECK_INTERVAL_MS = recheck_ms

    if not conflate:  # the reader's notification socket without ZMQ_CONFLATE (a diagnosis only)
        SB.zmq = _without("CONFLATE")

    mq = MessageQueue.create_from_handle(handle, 0)
    mq._spin_condition.busy_loop_s = busy
    mq.wait_until_ready()
    lat = []
    for _ in range(n):
        sent = mq.dequeue()
        lat.append(time.monotonic() - sent)
        end = time.monotonic() + compute_s
        while time.monotonic() < end:  # a step's work
            pass
    out.put(lat)


def run(busy: float, n: int, max_gap: float, compute_s: float, hogs: int, seed: int, burst: int = 1,
        burst_gap_s: float = 0.0, hwm1: bool = True, conflate: bool = True,
        recheck_ms: int | None = None) -> list[float]:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    burners = [ctx.Process(target=_hog, args=(stop,), daemon=True) for _ in range(hogs)]
    for p in burners:
        p.start()
    if not hwm1:  # the writer's notification socket with ZMQ's default high-water mark (1000): it must be
        from vllm.distributed.device_communicators import shm_broadcast as SB  # set before the bind
        SB.zmq = _without("SNDHWM")
    mq = MessageQueue(1, 1)
    out = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(mq.export_handle(), n, busy, compute_s, out, conflate,
                                                     recheck_ms))
    reader.start()
    mq.wait_until_ready()
    rnd = random.Random(seed)
    for i in range(n):
        if i % burst == 0:  # a burst: `burst` messages back to back (vLLM writes execute_model, then
            time.sleep(rnd.uniform(0, max_gap))  # sample_tokens, within a millisecond)
        elif burst_gap_s:
            end = time.monotonic() + burst_gap_s
            while time.monotonic() < end:
                pass
        mq.enqueue(time.monotonic())
    lat = out.get(timeout=n * 6 + 60)
    reader.join(timeout=30)
    stop.set()
    for p in burners:
        p.join(timeout=5)
    return lat


def summary(busy: float, lat: list[float], recheck_s: float) -> str:
    s = sorted(lat)

    def pct(q: float) -> float:
        return s[min(len(s) - 1, int(q * len(s)))] * 1000

    late = [x for x in s if x > 0.05]
    slow = [x for x in s if x > 1.0]
    near = [x for x in slow if abs(x / recheck_s - round(x / recheck_s)) * recheck_s < 0.5]
    return (f"busy_loop_s {busy:<5g} reads {len(s)}: p50 {pct(0.5):8.2f} ms  p99 {pct(0.99):8.1f} ms  "
            f"max {s[-1] * 1000:8.1f} ms  > 50 ms: {len(late):3d}  > 1 s: {len(slow):3d}  of those at a "
            f"multiple of the {recheck_s:g}-s poll timeout (+-0.5 s): {len(near)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", default="0,0.1,1", help="busy_loop_s values, comma-separated")
    ap.add_argument("--messages", type=int, default=300)
    ap.add_argument("--max-gap", type=float, default=0.3, help="seconds between writes: uniform in [0, this]")
    ap.add_argument("--compute-ms", type=float, default=5.0, help="the reader's work per message")
    ap.add_argument("--hogs", type=int, default=0, help="busy processes sharing the CPUs")
    ap.add_argument("--burst", type=int, default=1, help="messages written back to back after each gap")
    ap.add_argument("--burst-gap-ms", type=float, default=0.0, help="between the messages of a burst")
    ap.add_argument("--default-hwm", action="store_true",
                    help="the writer's notification socket with ZMQ's default send high-water mark (vLLM 0.32 sets 1)")
    ap.add_argument("--no-conflate", action="store_true",
                    help="the reader's notification socket without ZMQ_CONFLATE (vLLM 0.32 sets it)")
    ap.add_argument("--recheck-ms", type=int, default=None,
                    help="the idle reader's poll timeout (vLLM 0.32: SHM_READER_RECHECK_INTERVAL_MS, 5000)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    from vllm.distributed.device_communicators import shm_broadcast as SB

    recheck_s = (a.recheck_ms if a.recheck_ms is not None else SB.SHM_READER_RECHECK_INTERVAL_MS) / 1000
    import vllm
    print(f"vLLM {vllm.__version__}: the idle reader's poll timeout {recheck_s * 1000:g} ms, "
          f"{a.messages} messages, gaps uniform 0-{a.max_gap:g} s, {a.compute_ms:g} ms work per read, "
          f"{a.hogs} busy process(es), {a.burst} message(s) per burst {a.burst_gap_ms:g} ms apart, notification "
          f"high-water mark {'1000 (ZMQ default)' if a.default_hwm else '1 (as vLLM sets it)'}, "
          f"{'no ZMQ_CONFLATE' if a.no_conflate else 'ZMQ_CONFLATE as vLLM sets it'}", flush=True)
    for busy in (float(x) for x in a.busy.split(",")):
        lat = run(busy, a.messages, a.max_gap, a.compute_ms / 1000, a.hogs, a.seed, a.burst, a.burst_gap_ms / 1000,
                  not a.default_hwm,
                  not a.no_conflate, a.recheck_ms)
        print(summary(busy, lat, recheck_s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
