"""The distributed sanity check (checks/nccl_check.py) and its parsers (bootstrap/nccl.py).

The check runs for real: torch's torchrun launcher, gloo on this machine's loopback, one or two
"nodes" (torchrun invocations) on 127.0.0.1. Those tests need torch (CI installs torch==2.13.0)
and are skipped, with that reason, when it is not importable. The NCCL log parsers are tested on
real NCCL_DEBUG=INFO excerpts from public issue threads (tests/data/nccl/*.log, each naming its
source on its first line) and on recorded runs of the check (tests/data/nccl/*.txt: on this
machine, and on one H100 GPU).
"""
from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bootstrap.nccl import parse as N
from checks import nccl_check as C

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "checks" / "nccl_check.py"
DATA = ROOT / "tests" / "data" / "nccl"

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(
    not HAVE_TORCH, reason="torch is not importable (CI installs torch==2.13.0, CPU wheel)")

SIZES = [1024, 1048576]
CHECK_ARGS = ["--backend", "gloo", "--sizes", ",".join(map(str, SIZES)), "--iters", "3",
              "--warmup", "1", "--timeout", "30"]
HOST = socket.gethostname()


# ================================================================================================
# Launching torchrun for real, and making sure nothing is left running
# ================================================================================================
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries this test's tag (torchrun starts its workers in
    new sessions, so a process group does not cover them; the environment does)."""
    marker = f"NCCL_CHECK_TEST_TAG={tag}".encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    pids.append(int(d))
        except OSError:
            continue
    return pids


class Launcher:
    def __init__(self, tmp_path: Path):
        self.dir = tmp_path
        self.tag = uuid.uuid4().hex
        self.procs: dict[str, subprocess.Popen] = {}

    def torchrun(self, name: str, *, nnodes: int, nproc: int, node_rank: int, port: int,
                 script: Path = SCRIPT, args=(), rdzv_timeout: int | None = None,
                 env: dict | None = None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
                "--nproc-per-node", str(nproc), "--node-rank", str(node_rank),
                "--master-addr", "127.0.0.1", "--master-port", str(port)]
        if rdzv_timeout is not None:
            argv += ["--rdzv-conf", f"timeout={rdzv_timeout}"]
        argv += [str(script), *args]
        e = dict(os.environ)
        e.pop("VLLM_HOST_IP", None)
        e.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo binds to loopback, no DNS needed
        e["NCCL_CHECK_TEST_TAG"] = self.tag
        e.update(env or {})
        out = open(self.dir / f"{name}.out", "wb")
        err = open(self.dir / f"{name}.err", "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=e,
                             cwd=ROOT, start_new_session=True)
        out.close()
        err.close()
        self.procs[name] = p
        return p

    def wait(self, name: str, timeout: float) -> int | None:
        try:
            return self.procs[name].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stdout(self, name: str) -> str:
        return (self.dir / f"{name}.out").read_text(errors="replace")

    def stderr(self, name: str) -> str:
        return (self.dir / f"{name}.err").read_text(errors="replace")

    def leftovers(self, grace: float = 10.0) -> list[int]:
        """Tagged processes still alive after `grace` seconds."""
        deadline = time.monotonic() + grace
        while True:
            pids = _tagged_pids(self.tag)
            if not pids or time.monotonic() > deadline:
                return pids
            time.sleep(0.2)

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _tagged_pids(self.tag):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if not self.leftovers(grace=10.0):
                break
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@pytest.fixture
def launcher(tmp_path):
    lc = Launcher(tmp_path)
    yield lc
    lc.kill_all()
    assert _tagged_pids(lc.tag) == [], "processes of the check were left running"


def _report(*texts: str) -> N.CheckReport:
    return N.parse_events("\n".join(texts))


def _diag(lc: Launcher, *names: str) -> str:
    return "\n".join(f"--- {n} stdout ---\n{lc.stdout(n)[-3000:]}\n--- {n} stderr ---\n"
                     f"{lc.stderr(n)[-3000:]}" for n in names)


def assert_check_passed(rep: N.CheckReport, *, world: int, nnodes: int, nproc: int,
                        vllm_host_ips: dict[int, str | None]):
    assert rep.ok, rep.failures
    assert rep.result is not None
    assert (rep.result.world_size, rep.result.backend, rep.result.nnodes) == (world, "gloo", nnodes)
    assert rep.result.torch and rep.result.nccl_version is None
    assert sorted(rep.ranks) == list(range(world))
    for r, st in rep.ranks.items():
        # every phase reached, by every rank; on CPU gloo and vllm are skipped with a reason
        assert st.reached == list(N.PHASES), (r, st.phases)
        assert st.phases["gloo"].skipped and st.phases["vllm"].skipped
        assert st.node_rank == r // nproc and st.local_rank == r % nproc
        assert st.host == HOST
        assert st.vllm_host_ip == vllm_host_ips[st.node_rank]
        # the all-reduce of ones was verified (on every rank, then agreed on) to give world
        assert st.phases["allreduce"].extra["value"] == world
        ts = [st.phases[p].t for p in N.PHASES]
        assert ts == sorted(ts) and ts[0] >= 0
    assert rep.hosts() == {n: HOST for n in range(nnodes)}
    assert N.nodes_missing_phase(rep, "done", range(nnodes), ranks_per_node=nproc) == []
    assert N.nodes_failed_phase(rep) == []

    # one row per size, reported by rank 0 only, nccl-tests' definitions
    assert [row.bytes for row in rep.bandwidth] == SIZES
    assert rep.bandwidth_skipped is None and rep.discarded_bandwidth == []
    assert N.bandwidth_note(rep.world_size, rep.bandwidth, rep.bandwidth_skipped) is None
    text = N.format_bandwidth(rep.world_size, "gloo", rep.bandwidth, rep.bandwidth_skipped)
    assert text[0] == f"all-reduce bandwidth (gloo, {world} ranks)" and len(text) == 2 + len(SIZES)
    assert [int(line.split()[0]) for line in text[2:]] == SIZES
    factor = 2 * (world - 1) / world
    for row in rep.bandwidth:
        assert row.count == row.bytes // 4 and row.dtype == "float32"
        assert row.time_us > 0 and row.algbw_GBps > 0
        algbw = row.bytes / (row.time_us * 1e-6) / 1e9  # bytes / time, GB/s
        assert row.algbw_GBps == pytest.approx(algbw, rel=1e-3, abs=2e-6)
        assert row.busbw_GBps == pytest.approx(row.algbw_GBps * factor, rel=1e-4, abs=2e-6)


# ================================================================================================
# The check, for real
# ================================================================================================
@pytest.fixture(scope="module")
def one_node_run(tmp_path_factory):
    """One torchrun, 2 ranks, gloo: run once, shared by the tests that read its output."""
    if not HAVE_TORCH:
        pytest.skip("torch is not importable (CI installs torch==2.13.0, CPU wheel)")
    lc = Launcher(tmp_path_factory.mktemp("one_node"))
    try:
        t0 = time.monotonic()
        lc.torchrun("node0", nnodes=1, nproc=2, node_rank=0, port=free_port(), args=CHECK_ARGS,
                    env={"VLLM_HOST_IP": "127.0.0.1"})
        rc = lc.wait("node0", 180)
        elapsed = time.monotonic() - t0
        left = lc.leftovers()
        yield {"rc": rc, "elapsed": elapsed, "stdout": lc.stdout("node0"),
               "stderr": lc.stderr("node0"), "left": left, "diag": _diag(lc, "node0")}
    finally:
        lc.kill_all()
        assert _tagged_pids(lc.tag) == []


@needs_torch
def test_one_node_two_ranks(one_node_run):
    run = one_node_run
    assert run["rc"] == 0, run["diag"]
    assert run["left"] == [], "torchrun left processes behind after a successful run"
    # the controller gets stdout and stderr (torchrun's banners, warnings) mixed
    rep = _report(run["stdout"], run["stderr"])
    assert_check_passed(rep, world=2, nnodes=1, nproc=2, vllm_host_ips={0: "127.0.0.1"})
    # rank 0's result is the last line it writes, after every rank's "done"
    lines = [ln for ln in run["stdout"].splitlines() if ln.startswith("{")]
    assert '"event":"result"' in lines[-1]
    print(f"one node x 2 ranks: {run['elapsed']:.1f} s; "
          + "; ".join(f"{r.bytes} B busbw {r.busbw_GBps:.4f} GB/s" for r in rep.bandwidth))


@needs_torch
def test_one_rank_reports_nothing_to_measure(launcher):
    """One node, one process (as on a single-GPU machine): every phase passes, and the bandwidth
    phase is skipped, "one rank: nothing to measure", with no bandwidth line: an all-reduce over
    one rank moves nothing, timing it would report memory speed as bandwidth."""
    launcher.torchrun("node0", nnodes=1, nproc=1, node_rank=0, port=free_port(), args=CHECK_ARGS)
    rc = launcher.wait("node0", 120)
    assert rc == 0, _diag(launcher, "node0")
    assert launcher.leftovers() == []
    out = launcher.stdout("node0")
    assert '"event":"bandwidth"' not in out
    rep = _report(out, launcher.stderr("node0"))
    assert rep.ok, rep.failures
    assert rep.result == N.CheckResult(ok=True, world_size=1, backend="gloo", nnodes=1,
                                       torch=rep.result.torch, nccl_version=None)
    (st,) = rep.ranks.values()
    assert st.reached == list(N.PHASES) and st.phases["allreduce"].extra["value"] == 1
    assert st.phases["gloo"].skipped == "the main backend is gloo"
    assert st.phases["vllm"].skipped == "not a GPU run"
    (bw,) = [e for e in rep.events if e.phase == "bandwidth"]
    assert (bw.ok, bw.rank, bw.skipped, bw.error) == (True, 0, "one rank: nothing to measure", None)
    assert bw.skipped == C.ONE_RANK == N.ONE_RANK and bw.extra["world_size"] == 1
    assert rep.bandwidth == [] and rep.discarded_bandwidth == []
    assert rep.bandwidth_skipped == "one rank: nothing to measure"
    assert N.format_bandwidth(rep.world_size, rep.result.backend, rep.bandwidth, rep.bandwidth_skipped) == [
        "all-reduce bandwidth (gloo): one rank: nothing to measure"]


@needs_torch
def test_two_nodes_two_ranks_each(launcher):
    port = free_port()
    args = CHECK_ARGS
    t0 = time.monotonic()
    launcher.torchrun("node0", nnodes=2, nproc=2, node_rank=0, port=port, args=args,
                      env={"VLLM_HOST_IP": "127.0.0.1"})
    launcher.torchrun("node1", nnodes=2, nproc=2, node_rank=1, port=port, args=args,
                      env={"VLLM_HOST_IP": "127.0.0.2"})
    rc0, rc1 = launcher.wait("node0", 240), launcher.wait("node1", 60)
    elapsed = time.monotonic() - t0
    assert (rc0, rc1) == (0, 0), _diag(launcher, "node0", "node1")
    assert launcher.leftovers() == []
    rep = _report(launcher.stdout("node0"), launcher.stderr("node0"),
                  launcher.stdout("node1"), launcher.stderr("node1"))
    # world 4: busbw = algbw * 2 * 3 / 4, a factor that is not 1
    assert_check_passed(rep, world=4, nnodes=2, nproc=2,
                        vllm_host_ips={0: "127.0.0.1", 1: "127.0.0.2"})
    assert rep.ranks_on_node(1) == [2, 3]
    print(f"two nodes x 2 ranks: {elapsed:.1f} s; "
          + "; ".join(f"{r.bytes} B busbw {r.busbw_GBps:.4f} GB/s" for r in rep.bandwidth))


@needs_torch
def test_dead_peer_fails_within_timeout(launcher, tmp_path):
    """Node 1's torchrun comes up but its worker never joins the process group: node 0 must
    report init failed and exit non-zero, within --timeout plus start-up, not hang."""
    never_joins = tmp_path / "never_joins.py"
    never_joins.write_text("import time\ntime.sleep(600)\n")
    port = free_port()
    t0 = time.monotonic()
    launcher.torchrun("node1", nnodes=2, nproc=1, node_rank=1, port=port, script=never_joins,
                      rdzv_timeout=10)
    launcher.torchrun("node0", nnodes=2, nproc=1, node_rank=0, port=port, rdzv_timeout=10,
                      args=["--backend", "gloo", "--timeout", "10"])
    rc = launcher.wait("node0", 90)
    elapsed = time.monotonic() - t0
    assert rc is not None, "node 0 still running after 90 s: the check hangs"
    assert rc != 0
    assert elapsed < 40, f"node 0 took {elapsed:.1f} s to give up"
    rep = _report(launcher.stdout("node0"), launcher.stderr("node0"))
    assert not rep.ok and rep.result is not None and rep.result.ok is False
    assert N.nodes_missing_phase(rep, "start", [0, 1]) == [1]
    assert N.nodes_missing_phase(rep, "init", [0, 1]) == [1]
    assert N.nodes_failed_phase(rep, "init") == [0]
    (fail,) = rep.failures
    assert (fail.phase, fail.rank, fail.node_rank, fail.host) == ("init", 0, 0, HOST)
    assert "timeout" in fail.error.lower()
    assert fail.t is not None and fail.t >= 10
    assert any("ChildFailedError" in e for e in rep.errors)  # torchrun's own report
    print(f"dead peer: node 0 gave up after {elapsed:.1f} s: {fail.error}")


@needs_torch
def test_peer_frozen_mid_sweep_fails_within_timeout(launcher):
    """Rank 1 is frozen (SIGSTOP) in the middle of the bandwidth sweep: rank 0 must report the
    bandwidth phase failed within --timeout (+ margin), not wait for it forever."""
    timeout = 8
    launcher.torchrun("node0", nnodes=1, nproc=2, node_rank=0, port=free_port(), args=[
        "--backend", "gloo", "--sizes", "4194304", "--iters", "1000000", "--warmup", "1",
        "--timeout", str(timeout)])

    def wait_for(pred, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            rep = N.parse_events(launcher.stdout("node0"))
            if pred(rep):
                return rep
            time.sleep(0.1)
        pytest.fail(f"timed out waiting; output so far:\n{_diag(launcher, 'node0')}")

    rep = wait_for(lambda r: 1 in r.ranks and "vllm" in r.ranks[1].phases, 120)
    victim = rep.ranks[1].phases["start"].extra["pid"]
    time.sleep(1.0)  # inside the (endless) timed loop now
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        rep = wait_for(lambda r: r.failures, timeout + C.WATCHDOG_MARGIN_S + 30)
        noticed = time.monotonic() - stopped
    finally:
        os.kill(victim, signal.SIGCONT)
        os.kill(victim, signal.SIGKILL)
    rc = launcher.wait("node0", 60)
    assert rc not in (None, 0)
    (fail,) = rep.failures
    assert (fail.phase, fail.rank) == ("bandwidth", 0)
    assert "timed out" in fail.error.lower()
    assert noticed < timeout + C.WATCHDOG_MARGIN_S + 2, noticed
    rep = N.parse_events(launcher.stdout("node0"))
    assert rep.result is not None and rep.result.ok is False
    print(f"frozen peer: rank 0 failed {noticed:.1f} s after the freeze: {fail.error[:120]}")


@needs_torch
def test_lone_node_fails_instead_of_waiting(launcher):
    """Only node-rank 0 of a 2-node run is started. torchrun's own rendezvous waits for the other
    node before the script even starts, so it is bounded by `--rdzv-conf timeout=` (900 s by
    default), which the controller must pass; the check's --timeout bounds the rest."""
    port = free_port()
    t0 = time.monotonic()
    launcher.torchrun("node0", nnodes=2, nproc=1, node_rank=0, port=port, rdzv_timeout=10,
                      args=["--backend", "gloo", "--timeout", "10"])
    rc = launcher.wait("node0", 90)
    elapsed = time.monotonic() - t0
    assert rc is not None, "still running after 90 s: it hangs"
    assert rc != 0 and elapsed < 40, (rc, elapsed)
    rep = _report(launcher.stdout("node0"), launcher.stderr("node0"))
    assert rep.result is None and not rep.ok
    # node 1 never showed up; node 0's script never started either (torchrun stopped first)
    assert 1 in N.nodes_missing_phase(rep, "init", [0, 1])
    assert N.nodes_missing_phase(rep, "init", [0, 1]) == [0, 1]
    assert any("1/2 clients joined" in e for e in rep.errors), rep.errors
    print(f"lone node: torchrun gave up after {elapsed:.1f} s")


def test_watchdog_reports_and_exits_when_a_step_blocks():
    """The backstop for a step torch does not time out (a CUDA sync on a stuck NCCL kernel): the
    main thread blocks (here: in sleep); the watchdog reports the phase and exits 1."""
    code = ("import time\n"
            "from checks import nccl_check as C\n"
            "c = C.Check(C.parse_args(['--timeout', '1']))\n"
            "c.start_watchdog()\n"
            "c.arm('bandwidth')\n"
            "time.sleep(120)\n")
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", GROUP_RANK="0",
               VLLM_HOST_IP="10.0.0.1")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    assert elapsed < 1 + C.WATCHDOG_MARGIN_S + 5
    rep = N.parse_events(p.stdout)
    (fail,) = rep.failures
    assert (fail.phase, fail.rank, fail.node_rank, fail.vllm_host_ip) == (
        "bandwidth", 0, 0, "10.0.0.1")
    assert fail.error.startswith("watchdog:") and fail.t >= 1 + C.WATCHDOG_MARGIN_S
    assert rep.result is not None and rep.result.ok is False


def test_cli_rejects_bad_sizes():
    p = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "6"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "multiple of 4" in p.stderr


def test_default_size_sweeps():
    assert C.default_sizes(gpu=False) == [1024 * 4 ** k for k in range(8)]  # 1 KiB .. 16 MiB
    gpu = C.default_sizes(gpu=True)
    assert gpu[0] == 8 and gpu[-1] == 256 * 2 ** 20 and gpu[1] == 32
    assert all(b > a for a, b in zip(gpu, gpu[1:]))


# ================================================================================================
# parse_events on the real output, mixed the way the controller receives it
# ================================================================================================
@needs_torch
def test_parse_events_tolerates_interleaving(one_node_run):
    assert one_node_run["rc"] == 0, one_node_run["diag"]
    json_lines = [ln for ln in one_node_run["stdout"].splitlines() if ln.strip()]
    nccl_lines = (DATA / "socket_nccl_tests188.log").read_text().splitlines()
    mixed = []
    for i, ln in enumerate(json_lines):
        mixed.append(nccl_lines[i % len(nccl_lines)])
        # prefixes as added by `torchrun --tee`, ssh fan-out, or Ray's log forwarding
        mixed.append(("[default0]:", "gpu-a | ", "(pid=123) ", "")[i % 4] + ln)
    # and a line torn in two by a crash, which must be ignored, not fail the parse
    mixed.append(json_lines[0][: len(json_lines[0]) // 2])
    mixed += one_node_run["stderr"].splitlines()
    rep = N.parse_events("\n".join(mixed))
    assert_check_passed(rep, world=2, nnodes=1, nproc=2, vllm_host_ips={0: "127.0.0.1"})
    assert rep.other_lines >= len(json_lines)
    assert rep.errors == []  # NCCL INFO lines and torchrun's banner are not errors


def test_parse_recorded_two_node_run():
    """A run recorded on the development machine (default CPU sweep); needs no torch."""
    rep = N.parse_events((DATA / "check_run_2nodes_gloo.txt").read_text())
    assert rep.ok and rep.result == N.CheckResult(ok=True, world_size=2, backend="gloo", nnodes=2,
                                                  torch="2.13.0+cpu", nccl_version=None)
    assert {r: (st.node_rank, st.vllm_host_ip, st.last_phase) for r, st in rep.ranks.items()} == {
        0: (0, "127.0.0.1", "done"), 1: (1, "127.0.0.2", "done")}
    assert [row.bytes for row in rep.bandwidth] == C.default_sizes(gpu=False)
    for row in rep.bandwidth:  # n = 2: busbw = algbw * 2 * 1 / 2
        assert row.busbw_GBps == row.algbw_GBps
        assert row.algbw_GBps == pytest.approx(row.bytes / row.time_us / 1e3, rel=1e-3, abs=2e-6)
    assert N.nodes_missing_phase(rep, "bandwidth", [0, 1]) == []
    assert rep.other_lines == 5 and rep.errors == []


def test_parse_real_h100_single_rank_capture():
    """A real run on one H100 (NCCL 2.28.9, torchrun --nproc-per-node 1) of the check from before
    the one-rank skip: it timed all-reduces on one rank, up to 16952 GB/s "algbw" at 256 MiB.
    The report must say one rank, nothing to measure, and show none of those rows as bandwidth."""
    text = (DATA / "h100_nccl_1rank.txt").read_text()
    assert text.startswith("# recorded: real GPU output (one NVIDIA H100 80GB HBM3")
    rep = N.parse_events(text)
    assert rep.ok and rep.result == N.CheckResult(ok=True, world_size=1, backend="nccl", nnodes=1,
                                                  torch="2.11.0+cu130", nccl_version="2.28.9")
    assert rep.ranks[0].reached == list(N.PHASES) and rep.ranks[0].host == "vm"
    assert rep.ranks[0].phases["vllm"].skipped == "world size 1"
    # the old check said nothing of a skip: the world size of 1 is what tells
    assert rep.ranks[0].phases["bandwidth"].skipped is None
    assert rep.bandwidth == []
    assert rep.bandwidth_skipped == N.ONE_RANK == "one rank: nothing to measure"
    assert len(rep.discarded_bandwidth) == 14
    assert max(r.algbw_GBps for r in rep.discarded_bandwidth) == pytest.approx(16951.98, abs=0.01)
    assert N.bandwidth_note(rep.world_size, rep.bandwidth, rep.bandwidth_skipped) == N.ONE_RANK
    # the rows themselves, if a caller passed them, are not shown either
    assert N.bandwidth_note(1, rep.discarded_bandwidth) == N.ONE_RANK
    rendered = N.format_bandwidth(rep.world_size, rep.result.backend, rep.bandwidth, rep.bandwidth_skipped)
    assert rendered == ["all-reduce bandwidth (nccl): one rank: nothing to measure"]
    assert N.format_bandwidth(1, "nccl", rep.discarded_bandwidth) == rendered
    assert rep.errors == [] and rep.failures == []
    t = N.parse_nccl_transport(text)
    assert (t.nccl_version, t.cuda_version, t.hosts) == ("2.28.9", "13.0", ["vm"])
    assert t.ib_no_device and t.channels == [] and not t.inter_node


def test_recorded_multi_rank_run_shows_bandwidth_rows():
    rep = N.parse_events((DATA / "check_run_2nodes_gloo.txt").read_text())
    assert rep.world_size == 2 and rep.bandwidth_skipped is None and rep.discarded_bandwidth == []
    assert N.bandwidth_note(2, rep.bandwidth) is None
    text = N.format_bandwidth(2, "gloo", rep.bandwidth)
    assert text[:2] == ["all-reduce bandwidth (gloo, 2 ranks)",
                        "    size (B)       count    time (us)   algbw (GB/s)   busbw (GB/s)"]
    assert len(text) == 2 + len(rep.bandwidth) == 2 + len(C.default_sizes(gpu=False))
    last = rep.bandwidth[-1]
    assert text[-1].split() == [str(last.bytes), str(last.count), f"{last.time_us:.1f}",
                                f"{last.algbw_GBps:.4f}", f"{last.busbw_GBps:.4f}"]
    assert not any("nothing to measure" in line for line in text)


@needs_torch
def test_nodes_missing_phase_counts_ranks(one_node_run):
    """A node with one of its two ranks gone (its lines dropped from a real run's output)."""
    lines = one_node_run["stdout"].splitlines()
    rep = N.parse_events("\n".join(ln for ln in lines if '"rank":1,' not in ln))
    assert N.nodes_missing_phase(rep, "done", [0]) == []
    assert N.nodes_missing_phase(rep, "done", [0], ranks_per_node=2) == [0]
    assert N.nodes_missing_phase(rep, "done", [0, 1]) == [1]
    assert rep.ranks[0].last_phase == "done" and 1 not in rep.ranks


# ================================================================================================
# parse_nccl_transport on real NCCL_DEBUG=INFO excerpts
# ================================================================================================
def _log(name: str) -> str:
    text = (DATA / name).read_text()
    assert text.startswith("# source: https://github.com/")
    return text


def test_ib_with_gdrdma():
    t = N.parse_nccl_transport(_log("ib_gdrdma_nccl687.log"))
    assert (t.nccl_version, t.cuda_version) == ("2.11.4", "11.4")
    assert t.network == "IB" and t.networks_announced == ["IB"] and t.net_transports == ["IB"]
    assert t.gdrdma and t.uses_ib and not t.uses_socket and t.inter_node
    assert t.ib_devices == ["mlx5_10:1/IB", "mlx5_11:1/IB", "mlx5_12:1/IB", "mlx5_13:1/IB"]
    assert [str(i) for i in t.ib_oob] == ["ib0:10.1.21.11"]
    assert t.intra_transports == ["P2P"]
    assert t.hosts == ["cosmos-hpc-100a45", "cosmos-hpc-100a55"]
    net = [c for c in t.channels if c.network]
    assert len(net) == 4 and all(c.gdrdma and c.direction == "send" for c in net)
    assert net[0] == N.NcclChannel(channel=0, src=3, dst=6, direction="send",
                                   via="NET/IB/0/GDRDMA", transport="IB", gdrdma=True,
                                   host="cosmos-hpc-100a45")
    assert N.fallback_to_socket(t, infiniband_configured=True) is None


def test_ib_without_gdrdma_old_ring_format():
    t = N.parse_nccl_transport(_log("ib_no_gdrdma_nccl392.log"))
    assert (t.nccl_version, t.cuda_version) == ("2.5.7", "10.0")
    assert t.network == "IB" and t.net_transports == ["IB"] and not t.gdrdma
    assert t.ib_devices == ["mlx5_0:1/RoCE"]
    assert [str(i) for i in t.bootstrap_interfaces] == ["br0:10.137.141.16"]
    # "via direct shared memory" is how NCCL 2.5 named SHM
    assert t.intra_transports == ["P2P", "SHM"]
    recv = [c for c in t.channels if c.network]
    assert [(c.channel, c.src, c.dst, c.direction, c.via) for c in recv] == [
        (0, 15, 0, "receive", "NET/IB/0"), (1, 15, 0, "receive", "NET/IB/0")]
    assert N.fallback_to_socket(t, True) is None


def test_ib_without_gdrdma_despite_socket_bootstrap_lines():
    """NCCL 2.4 prints "NET/Socket : Using" for its bootstrap even when the network is IB."""
    t = N.parse_nccl_transport(_log("ib_no_gdrdma_nv_peer_memory56.log"))
    assert t.nccl_version == "2.4.7"
    assert t.network == "IB" and t.net_transports == ["IB"]
    assert not t.gdrdma and t.gdrdma_disabled
    assert [str(i) for i in t.socket_interfaces] == ["ib0:192.168.11.1", "ib0:192.168.11.2"]
    assert t.ib_devices == ["mlx5_0:1/IB"] and not t.ib_disabled
    assert {c.via for c in t.channels if c.network} == {"NET/IB/0"}
    assert N.fallback_to_socket(t, True) is None
    # without the channel lines (the first trace alone) the answer is IB as well
    head = _log("ib_no_gdrdma_nv_peer_memory56.log").split("# [excerpt 2")[0]
    assert N.parse_nccl_transport(head).network == "IB"


def test_ib_without_gdrdma_modern_channels():
    t = N.parse_nccl_transport(_log("ib_no_gdrdma_nccl1412.log"))
    assert t.nccl_version is None  # not in the excerpt
    assert t.network == "IB" and not t.gdrdma
    assert sorted({c.via for c in t.channels}) == ["NET/IB/3", "P2P/direct pointer/read"]
    assert {c.direction for c in t.channels if c.network} == {"send", "receive"}


def test_socket_only():
    t = N.parse_nccl_transport(_log("socket_nccl_tests188.log"))
    assert t.network == "Socket" and t.networks_announced == ["Socket"]
    assert t.net_transports == ["Socket"] and t.uses_socket and not t.uses_ib and not t.gdrdma
    assert t.ib_disabled and t.ib_devices == []
    assert [(i.name, i.address) for i in t.socket_interfaces] == [
        ("ibs85f0", "192.168.1.14"), ("ib0", "192.168.1.15")]
    assert {c.via for c in t.channels if c.network} == {"NET/Socket/0", "NET/Socket/3"}
    assert N.fallback_to_socket(t, infiniband_configured=False) is None
    warning = N.fallback_to_socket(t, infiniband_configured=True)
    assert warning.startswith("WARNING: InfiniBand is configured")
    assert "NET/Socket" in warning and "ibs85f0:192.168.1.14" in warning
    assert "NCCL_IB_DISABLE=1" in warning


def test_socket_fallback_with_ib_plugin_loaded():
    t = N.parse_nccl_transport(_log("socket_fallback_ib_plugin_nccl952.log"))
    assert t.network == "Socket" and t.net_transports == ["Socket"]
    assert t.plugin == "IBext" and t.hosts == ["<cluster_name>"]
    assert [str(i) for i in t.bootstrap_interfaces] == ["ibp12s0:10.149.0.32"]
    warning = N.fallback_to_socket(t, True)
    assert "fell back to TCP sockets" in warning
    assert "ibp12s0:10.149.0.32" in warning and "IBext" in warning


def test_intra_node_p2p_and_shm_only():
    t = N.parse_nccl_transport(_log("p2p_shm_single_node_nccl1027.log"))
    assert t.network is None and not t.inter_node and t.net_transports == []
    assert t.intra_transports == ["P2P", "SHM"]
    assert {c.via for c in t.channels} == {
        "P2P/direct pointer", "P2P/direct pointer/read", "SHM/direct/direct"}
    assert len(t.channels) == 7  # the "Channel 00/02 :    0   1 ..." ring lines are not channels
    # a single node proves nothing about the network: no warning either way
    assert N.fallback_to_socket(t, True) is None


def test_roce_merged_nics_from_a_vllm_report():
    t = N.parse_nccl_transport(_log("roce_single_node_vllm6201.log"))
    assert (t.nccl_version, t.cuda_version) == ("2.20.5", "11.0")
    assert t.network == "IB" and t.networks_announced == ["IB"] and not t.inter_node
    assert t.ib_devices == ["mlx5_7:1/RoCE", "mlx5_6:1/RoCE"]
    assert [str(i) for i in t.ib_oob] == ["eth0:10.164.53.65"]
    assert N.fallback_to_socket(t, True) is None


def test_all_log_excerpts_name_their_source():
    logs = sorted(DATA.glob("*.log"))
    assert len(logs) >= 4
    for f in logs:
        first = f.read_text().splitlines()[0]
        assert first.startswith("# source: https://github.com/") and "/issues/" in first, f


def test_a_passing_all_reduce_over_sockets_where_the_inventory_expects_rdma_is_a_failed_check():
    """check-nccl's verdict (issue 64): NCCL that fell back to TCP sockets on an `infiniband: true` cluster
    (EFA without NCCL's plugin, HCAs not in the container) fails the check; the same run passes where the
    inventory expects sockets."""
    import dataclasses
    import json

    from bootstrap.nccl.run import _judge
    from bootstrap.remote.fanout import GroupResult
    from tests.support.plan_fixtures import cpu_inventory

    inv = cpu_inventory(2)
    lines = [json.dumps({"event": "phase", "phase": "done", "ok": True, "rank": r, "local_rank": 0,
                         "node_rank": r, "host": h.name, "vllm_host_ip": h.ip, "t": 1.0}) for r, h in
             enumerate(inv.hosts)]
    lines.append(json.dumps({"event": "result", "ok": True, "world_size": 2, "backend": "nccl", "nnodes": 2}))
    socket_log = _log("socket_nccl_tests188.log")
    outputs = {"node1": lines[0] + "\n" + lines[2] + "\n" + socket_log, "node2": lines[1]}
    codes = GroupResult({"node1": 0, "node2": 0})
    run = _judge(inv, list(inv.hosts), outputs, codes, {}, [], 60, 0.0)
    assert run.ok and run.verdict.startswith("PASS"), run.verdict
    ib = dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, infiniband=True))
    run = _judge(ib, list(ib.hosts), outputs, codes, {}, [], 60, 0.0)
    assert not run.ok and run.verdict.startswith("FAIL on the cluster: NCCL went over TCP sockets where the "
                                                 "inventory expects RDMA"), run.verdict
    (f,) = [f for f in run.findings if f.id == "nccl-socket-fallback"]
    assert f.severity == "error" and "NCCL_IB_DISABLE=1" in f.evidence and "aws-ofi-nccl" in f.fix
