"""Distributed sanity check: can every GPU (or CPU process) of the cluster all-reduce with every other?

Runs INSIDE every node's container, one process per GPU (one per node on CPU), launched on all
nodes at once by the controller with torchrun's static rendezvous:

    python -m torch.distributed.run --nnodes N --nproc-per-node G --node-rank R \
        --master-addr HEAD_IP --master-port PORT [--rdzv-conf timeout=T] \
        checks/nccl_check.py [--backend auto|nccl|gloo] [--sizes B,B,...] [--iters N]
                             [--warmup N] [--timeout SECONDS] [--no-bandwidth]

Note: torchrun's own rendezvous (before this script starts) waits for every node's torchrun, by
default for 900 s; pass `--rdzv-conf timeout=T` to torchrun to bound that part too.

The steps are those of vLLM's troubleshooting sanity check ("Incorrect hardware/driver"): an
all-reduce on the main backend, one on a separate gloo group, and vLLM's own PyNcclCommunicator
with a CUDA-graph capture and replay; then an all-reduce bandwidth sweep reported like nccl-tests
(algbw = bytes / time, busbw = algbw * 2 * (n - 1) / n, time = the slowest rank's).

Output: one JSON object per line on stdout, each written with a single write() and flushed.
  every rank, per phase (start, init, allreduce, gloo, vllm, bandwidth, done):
    {"event": "phase", "phase": NAME, "ok": bool, "rank": r, "local_rank": l, "node_rank": R,
     "host": hostname, "vllm_host_ip": $VLLM_HOST_IP or null, "t": seconds since start,
     "error": null or "Type: message", ...}   (a skipped phase has ok true and "skipped": reason)
  rank 0, per size: {"event": "bandwidth", "bytes", "count", "dtype": "float32", "time_us",
                     "algbw_GBps", "busbw_GBps"}
                    With one rank (world size 1) there is no sweep and no such line: an all-reduce
                    over one rank moves nothing, its "bandwidth" is memory speed or launch latency.
                    The bandwidth phase line then says {"skipped": "one rank: nothing to measure"}.
  rank 0, last:     {"event": "result", "ok", "world_size", "backend", "nnodes", "torch",
                     "nccl_version": "x.y.z" or null}
Exit status: 0 when every phase passed, 1 otherwise. No blocking step (rendezvous, one
collective, a CUDA sync; the timed loop of a size gets iters x its slowest warm-up op on top)
outlives --timeout by more than 5 s. With gloo, gloo's own timeout (--timeout) raises and is
reported; a watchdog thread reports the phase and exits at --timeout + 5 s if anything still
blocks. With NCCL the process group gets --timeout + 5 s and the watchdog fires at --timeout, so
the failure is reported before torch's NCCL watchdog could abort the process silently.

Stdlib and torch only; vllm is used when importable.
"""
import argparse
import datetime
import json
import os
import socket
import sys
import threading
import time

T0 = time.monotonic()
PHASES = ("start", "init", "allreduce", "gloo", "vllm", "bandwidth", "done")
MIB = 1 << 20
WATCHDOG_MARGIN_S = 5.0
#: The bandwidth phase's skip reason on a single-rank run (bootstrap/nccl.py matches it).
ONE_RANK = "one rank: nothing to measure"


def _elapsed():
    return round(time.monotonic() - T0, 3)


def _emit(obj):
    """One JSON line, one write() (atomic on a pipe below PIPE_BUF), so ranks do not interleave."""
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    try:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), data)
    except (OSError, ValueError):
        pass


def _err(exc):
    text = f"{type(exc).__name__}: {exc}".strip()
    text = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return text[:1500]


def default_sizes(gpu):
    lo, hi = (8, 256 * MIB) if gpu else (1024, 16 * MIB)
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(s)
        s *= 4
    if sizes[-1] != hi:
        sizes.append(hi)
    return sizes


def parse_sizes(text):
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        n = int(part)
        if n < 4 or n % 4:
            raise argparse.ArgumentTypeError(f"size {n}: must be a positive multiple of 4 bytes (float32)")
        sizes.append(n)
    if not sizes:
        raise argparse.ArgumentTypeError("--sizes: no size given")
    return sizes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                   help="auto: nccl when CUDA is available, else gloo")
    p.add_argument("--sizes", type=parse_sizes, default=None,
                   help="comma-separated message sizes in bytes (multiples of 4); default "
                        "8 B .. 256 MiB x4 on GPU, 1 KiB .. 16 MiB x4 on CPU")
    p.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed all-reduces per size")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds any one blocking step may take (process-group timeout)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth sweep")
    a = p.parse_args(argv)
    if a.iters < 1 or a.warmup < 0 or a.timeout <= 0:
        p.error("--iters must be >= 1, --warmup >= 0, --timeout > 0")
    return a


def _env_int(name, default=None):
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


class Check:
    def __init__(self, args):
        self.args = args
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        # torchrun: GROUP_RANK is the node rank, GROUP_WORLD_SIZE the number of nodes.
        self.node_rank = _env_int("GROUP_RANK", _env_int("NODE_RANK", 0))
        self.world_size = _env_int("WORLD_SIZE", 1)
        local_world = _env_int("LOCAL_WORLD_SIZE", 1) or 1
        self.nnodes = _env_int("GROUP_WORLD_SIZE", max(1, self.world_size // local_world))
        self.host = socket.gethostname()
        self.vllm_host_ip = os.environ.get("VLLM_HOST_IP")
        self.phase = "start"
        self.backend = None
        self.torch_version = None
        self.nccl_version = None
        self.gpu = False
        self.device = None
        self._lock = threading.Lock()
        self._deadline = None
        # gloo raises at its timeout with a precise error, so the watchdog waits a margin longer;
        # torch's NCCL watchdog would abort the process without a word, so there the process
        # group gets the margin and this watchdog fires first, at --timeout.
        self._wd_extra = WATCHDOG_MARGIN_S
        self._finished = False

    # -- output -------------------------------------------------------------------------------
    def phase_line(self, phase, ok, error=None, **extra):
        obj = {"event": "phase", "phase": phase, "ok": bool(ok), "rank": self.rank,
               "local_rank": self.local_rank, "node_rank": self.node_rank, "host": self.host,
               "vllm_host_ip": self.vllm_host_ip, "t": _elapsed(), "error": error}
        obj.update(extra)
        _emit(obj)

    def result_line(self, ok):
        if self.rank != 0:
            return
        _emit({"event": "result", "ok": bool(ok), "world_size": self.world_size,
               "backend": self.backend, "nnodes": self.nnodes, "torch": self.torch_version,
               "nccl_version": self.nccl_version})

    # -- watchdog: nothing may block past --timeout + margin -----------------------------------
    def arm(self, phase, seconds=None):
        with self._lock:
            self.phase = phase
            budget = self.args.timeout if seconds is None else seconds
            self._deadline = time.monotonic() + budget + self._wd_extra

    def start_watchdog(self):
        threading.Thread(target=self._watch, name="nccl-check-watchdog", daemon=True).start()

    def _watch(self):
        while True:
            time.sleep(0.2)
            with self._lock:
                if self._finished:
                    return
                late = self._deadline is not None and time.monotonic() > self._deadline
                phase = self.phase
                if late:
                    self._finished = True
            if late:
                self.phase_line(phase, False, error=(
                    f"watchdog: phase {phase!r} blocked for more than --timeout "
                    f"{self.args.timeout:g} s: a peer is dead, unreachable or stuck"))
                self.result_line(False)
                os._exit(1)

    def fail(self, exc):
        with self._lock:
            if self._finished:
                return
            self._finished = True
            phase = self.phase
        self.phase_line(phase, False, error=_err(exc))
        self.result_line(False)

    # -- helpers --------------------------------------------------------------------------------
    def sync(self):
        if self.gpu:
            import torch
            torch.cuda.synchronize(self.device)

    def agree(self, ok, group=None, device=None):
        """All ranks learn which ranks failed a local verification; returns the failed ranks."""
        import torch
        import torch.distributed as dist
        flags = torch.zeros(self.world_size, dtype=torch.int32,
                            device=device if device is not None else self.device)
        if not ok:
            flags[self.rank] = 1
        dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=group)
        return [r for r, f in enumerate(flags.tolist()) if f]

    # -- phases ---------------------------------------------------------------------------------
    def run(self):
        self.start_watchdog()
        self.arm("start", max(self.args.timeout, 120.0))  # importing torch is not a network wait
        self.phase_line("start", True, pid=os.getpid(), world_size=self.world_size,
                        nnodes=self.nnodes)
        import torch
        import torch.distributed as dist
        self.torch_version = torch.__version__

        a = self.args
        self.arm("init")
        cuda = torch.cuda.is_available()
        self.backend = a.backend if a.backend != "auto" else ("nccl" if cuda else "gloo")
        if self.backend == "nccl" and not cuda:
            raise RuntimeError("--backend nccl but CUDA is not available in this container")
        self.gpu = self.backend == "nccl"
        self.nccl_version = _nccl_version(torch) if cuda else None
        if self.gpu:
            self._wd_extra = 0.0
            timeout = datetime.timedelta(seconds=a.timeout + WATCHDOG_MARGIN_S)
        else:
            timeout = datetime.timedelta(seconds=a.timeout)
        self.arm("init")

        # init -----------------------------------------------------------------------------
        if self.gpu:
            if self.local_rank >= torch.cuda.device_count():
                raise RuntimeError(f"LOCAL_RANK {self.local_rank} but only "
                                   f"{torch.cuda.device_count()} CUDA devices are visible")
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            kw = {"device_id": self.device}
        else:
            self.device = torch.device("cpu")
            kw = {}
        try:
            dist.init_process_group(backend=self.backend, timeout=timeout, **kw)
        except TypeError:  # torch without device_id
            dist.init_process_group(backend=self.backend, timeout=timeout)
        if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
            raise RuntimeError(f"process group says rank {dist.get_rank()} of "
                               f"{dist.get_world_size()}, environment says {self.rank} of "
                               f"{self.world_size}")
        self.phase_line("init", True, backend=self.backend, world_size=self.world_size,
                        device=str(self.device))

        # allreduce: ones summed over the world == world_size on every rank -----------------
        self.arm("allreduce")
        data = torch.ones(128, dtype=torch.float32, device=self.device)
        dist.all_reduce(data, op=dist.ReduceOp.SUM)
        self.sync()
        ok = bool(torch.all(data == self.world_size).item())
        bad = self.agree(ok)
        if bad:
            raise RuntimeError(f"all-reduce of ones gave a wrong sum on rank(s) {bad} "
                               f"(expected {self.world_size}; this rank got "
                               f"{data.mean().item():g})")
        self.phase_line("allreduce", True, value=self.world_size)

        # gloo: a separate gloo group on CPU tensors (GPU runs; on CPU the main group is gloo)
        self.arm("gloo")
        gloo_group = None
        if self.gpu:
            gloo_group = dist.new_group(ranks=list(range(self.world_size)), backend="gloo",
                                        timeout=timeout)
            cpu = torch.ones(128, dtype=torch.float32)
            dist.all_reduce(cpu, op=dist.ReduceOp.SUM, group=gloo_group)
            ok = bool(torch.all(cpu == self.world_size).item())
            bad = self.agree(ok, group=gloo_group, device=torch.device("cpu"))
            if bad:
                raise RuntimeError(f"gloo all-reduce of ones gave a wrong sum on rank(s) {bad}")
            self.phase_line("gloo", True)
        else:
            self.phase_line("gloo", True, skipped="the main backend is gloo")

        # vllm: PyNcclCommunicator all-reduce + CUDA graph capture/replay ----------------------
        self.arm("vllm", max(a.timeout, 180.0))  # importing vllm can take a while
        if not self.gpu:
            self.phase_line("vllm", True, skipped="not a GPU run")
        elif self.world_size < 2:
            self.phase_line("vllm", True, skipped="world size 1")
        else:
            try:
                from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
            except Exception as e:  # noqa: BLE001 - any import failure means "not usable"
                self.phase_line("vllm", True, skipped="vllm not importable", detail=_err(e))
            else:
                self.arm("vllm")
                self.vllm_check(torch, PyNcclCommunicator, gloo_group)
                self.phase_line("vllm", True)

        # bandwidth ------------------------------------------------------------------------------
        self.arm("bandwidth")
        if a.no_bandwidth:
            self.phase_line("bandwidth", True, skipped="--no-bandwidth")
        elif self.world_size < 2:
            # nothing crosses a link: a one-rank all-reduce is a no-op whose timing means nothing
            self.phase_line("bandwidth", True, skipped=ONE_RANK, world_size=self.world_size)
        else:
            sizes = a.sizes or default_sizes(self.gpu)
            self.bandwidth(torch, dist, sizes)
            self.phase_line("bandwidth", True, sizes=len(sizes))

        # done -----------------------------------------------------------------------------------
        self.arm("done")
        dist.barrier()
        self.phase_line("done", True)
        dist.barrier()  # every rank's "done" is written before rank 0's final "result"
        self.result_line(True)
        if gloo_group is not None:
            dist.destroy_process_group(gloo_group)
        dist.destroy_process_group()
        with self._lock:
            self._finished = True

    def vllm_check(self, torch, PyNcclCommunicator, gloo_group):
        pynccl = PyNcclCommunicator(group=gloo_group, device=self.local_rank)
        if not getattr(pynccl, "available", True):
            raise RuntimeError("vLLM's PyNcclCommunicator found no usable NCCL library")
        pynccl.disabled = False  # vLLM <= 0.6.4 creates it disabled
        data = torch.ones(128, dtype=torch.float32, device=self.device)
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            data.fill_(1)
            out = pynccl.all_reduce(data, stream=s)
            res = data if out is None else out  # in-place (old vLLM) or out-of-place (new)
            value = res.mean().item()
        if value != self.world_size:
            raise RuntimeError(f"vLLM PyNccl all-reduce: expected {self.world_size}, got {value:g}")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph=g, stream=s):
            out = pynccl.all_reduce(data, stream=torch.cuda.current_stream())
        res = data if out is None else out
        data.fill_(1)
        g.replay()
        torch.cuda.current_stream().synchronize()
        value = res.mean().item()
        if value != self.world_size:
            raise RuntimeError(f"vLLM PyNccl all-reduce in a CUDA graph: expected "
                               f"{self.world_size}, got {value:g}")

    def bandwidth(self, torch, dist, sizes):
        a = self.args
        n = self.world_size
        factor = 2.0 * (n - 1) / n
        for nbytes in sizes:
            count = nbytes // 4
            self.arm("bandwidth")
            buf = torch.zeros(count, dtype=torch.float32, device=self.device)
            slowest_warm = 0.0
            for _ in range(a.warmup):
                t = time.perf_counter()
                dist.all_reduce(buf)
                self.sync()
                slowest_warm = max(slowest_warm, time.perf_counter() - t)
                self.arm("bandwidth")
            dist.barrier()
            # the timed loop may legitimately take iters x one op; budget for it
            self.arm("bandwidth", a.timeout + 4 * a.iters * slowest_warm)
            self.sync()
            t = time.perf_counter()
            for _ in range(a.iters):
                dist.all_reduce(buf)
            self.sync()
            per_iter = (time.perf_counter() - t) / a.iters
            self.arm("bandwidth")
            slowest = torch.tensor([per_iter], dtype=torch.float64, device=self.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            per_iter = float(slowest.item())
            # correctness at this size as well (large messages take other protocols)
            buf.fill_(1)
            dist.all_reduce(buf)
            self.sync()
            bad = self.agree(bool(torch.all(buf == n).item()))
            if bad:
                raise RuntimeError(f"all-reduce of {nbytes} bytes gave a wrong sum on rank(s) {bad}")
            if self.rank == 0:
                algbw = nbytes / per_iter / 1e9
                _emit({"event": "bandwidth", "bytes": nbytes, "count": count, "dtype": "float32",
                       "time_us": round(per_iter * 1e6, 3), "algbw_GBps": round(algbw, 6),
                       "busbw_GBps": round(algbw * factor, 6)})
            del buf


def _nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        return None
    if isinstance(v, (tuple, list)):
        return ".".join(str(x) for x in v[:3])
    if isinstance(v, int):  # old torch: NCCL_VERSION_CODE
        if v >= 10000:
            return f"{v // 10000}.{v // 100 % 100}.{v % 100}"
        return f"{v // 1000}.{v // 100 % 10}.{v % 100}"
    return str(v)


def main(argv=None):
    args = parse_args(argv)
    check = Check(args)
    try:
        check.run()
    except BaseException as e:  # noqa: BLE001 - report every failure as a phase line
        check.fail(e)
        os._exit(1)  # a broken communicator can hang interpreter shutdown; leave now
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
