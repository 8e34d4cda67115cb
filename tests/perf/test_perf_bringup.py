"""perf/bringup.py's arithmetic: floor, convergence, docker log times, targets."""
from datetime import datetime, timezone
from types import SimpleNamespace

from perf import bringup as B
from perf import verdict as V


def test_docker_time_nanoseconds_utc():
    t = datetime(2026, 11, 21, 4, 5, 24, tzinfo=timezone.utc).timestamp()
    assert abs(B.docker_time("2026-11-21T04:05:24.123456789Z") - (t + 0.123456789)) < 1e-6
    assert B.docker_time("2026-11-21T04:05:24Z") == t
    assert B.docker_time("garbage") is None


def doc(ready_at=120.0):
    return {"ready_at": ready_at, "stages": {"connect": 0.2},
            "hosts": [{"host": "node1", "role": "head", "run_start": 100.0, "run_end": 100.5, "ray_seen": 104.0},
                      {"host": "node2", "role": "worker", "run_start": 105.0, "run_end": 105.4, "ray_seen": 108.0},
                      {"host": "node3", "role": "worker", "run_start": 105.0, "run_end": 106.0, "ray_seen": 109.5}]}


def test_floor_is_head_plus_slowest_worker_and_convergence_from_the_last_ray_start():
    s = B.analyse(doc(ready_at=109.8), 12.0, {"node2": 107.5, "node3": 109.0})
    assert s.floor == 4.0 + 4.5  # head 0.5 + 3.5; node3 1.0 + 3.5
    assert round(s.convergence, 3) == 0.8  # ready 109.8 - node3's "Ray runtime started" 109.0
    # the log line came after the poller saw the node: the poller's time is the join
    assert round(B.analyse(doc(ready_at=109.8), 12.0, {"node2": 107.5, "node3": 109.7}).convergence, 3) == 0.3
    # no log line: the poller's first sight of it stands in
    assert round(B.analyse(doc(ready_at=109.8), 12.0, {}).convergence, 3) == 0.3


def test_with_gcs_open_workers_overlap_the_head_and_the_floor_is_the_longer_path():
    d = doc(ready_at=109.8)
    d["gcs_open"] = 102.0  # head run 100.0-100.5, GCS answered 1.5 s later; head alive at 104.0
    # workers' path: head docker run 0.5 + GCS 1.5 + slowest worker (node3: 1.0 + 3.5) = 6.5 > head's 4.0
    assert B.analyse(d, 12.0, {}).floor == 6.5
    slow_head = doc()
    slow_head["hosts"][0]["ray_seen"] = 110.0  # the head's own join is the longer path: 0.5 + 9.5
    slow_head["gcs_open"] = 101.0
    assert B.analyse(slow_head, 12.0, {}).floor == 10.0


def test_single_node_floor_and_kept_containers():
    one = {"ready_at": 104.2, "hosts": [doc()["hosts"][0]]}
    s = B.analyse(one, 6.0, {})
    assert s.floor == 4.0 and round(s.convergence, 3) == 0.2
    kept = {"ready_at": 1.0, "hosts": [{"host": "node1", "role": "head", "run_start": None, "run_end": None,
                                        "ray_seen": 0.5}]}
    assert B.analyse(kept, 1.0, {}).floor is None


def lines(rows):
    return V.lines(*B.checks(rows))


def test_verdict():
    fast = B.Row(1, [B.Sample(10.0, 9.0, 0.3, {})], [2.0])
    wide = B.Row(8, [B.Sample(12.0, 10.5, 0.4, {})], [3.0], reruns=[2.0])
    found, failures = B.checks([fast, wide])
    assert failures == [] and all(c.passed for c in found) and V.exit_status(found) == 0
    assert lines([fast, wide]) == [
        "target met: up(8)/up(1) <= 1.3 (measured 1.20)",
        "target met: overhead at N=1 < 2s (measured 1.00s)", "target met: overhead at N=8 < 2s (measured 1.50s)",
        "target met: convergence at N=1 < 1s (measured 0.30s)",
        "target met: convergence at N=8 < 1s (measured 0.40s)",
        "target met: re-run up(8) / first up <= 20% (measured 17%)",
        "verdict: 6 met, 0 missed, 0 not measured (of 6 targets)"]
    slow = B.Row(8, [B.Sample(14.0, 11.0, 1.2, {})], [3.0], reruns=[3.0])
    found, _ = B.checks([fast, slow])
    assert [c.shortfall for c in found if c.passed is False] == [
        "up(8)/up(1) = 1.40 > 1.3", "overhead at N=8 = 3.00s >= 2s", "convergence at N=8 = 1.20s >= 1s",
        "re-run up(8) / first up = 21% > 20%"]
    assert V.exit_status(found) == 1


def test_one_n_or_no_n1_measures_no_scaling_ratio():
    """A run at one N (or without N=1) has no up(Nmax)/up(1): not measured, never "targets met"."""
    one = B.Row(1, [B.Sample(6.0, 5.1, 0.2, {})], [4.8], reruns=[0.9])
    assert lines([one])[0] == "target not measured: up(Nmax)/up(1) <= 1.3 (one N only: --nodes 1)"
    two = B.Row(2, [B.Sample(9.0, 8.0, 0.3, {})], [5.0])
    four = B.Row(4, [B.Sample(11.0, 10.0, 0.3, {})], [6.0], reruns=[1.0])
    out = lines([two, four])
    assert out[0] == "target not measured: up(Nmax)/up(1) <= 1.3 (no N=1 in --nodes 2,4)"
    assert out[-1] == "verdict: 5 met, 0 missed, 1 not measured (of 6 targets)"


def test_missing_floor_convergence_or_rerun_is_not_measured():
    no_times = B.Row(1, [B.Sample(6.0, None, None, {})], [4.8])
    failed = B.Row(2, [], [], failures=["N=2 up #1 exited 3: cannot connect"])
    out = lines([no_times, failed])
    assert out[0] == "run failed: N=2 up #1 exited 3: cannot connect"
    assert out[1:] == [
        "target not measured: up(Nmax)/up(1) <= 1.3 (no successful up at N=2)",
        "target not measured: overhead at N=1 < 2s (no floor: per-host times missing from `up --json`)",
        "target not measured: overhead at N=2 < 2s (no successful up)",
        "target not measured: convergence at N=1 < 1s (no ready_at or join times in `up --json`)",
        "target not measured: convergence at N=2 < 1s (no successful up)",
        "target not measured: re-run up(2) / first up <= 20% (no re-run measured at N=2)",
        "verdict: 0 met, 0 missed, 6 not measured (of 6 targets)"]
    assert V.exit_status(*B.checks([no_times, failed])) == 1  # a run failed


def test_main_prints_an_unmeasured_target_as_not_measured(monkeypatch, tmp_path, capsys):
    """The whole report of a one-N run (hosts and runs stubbed with recorded figures): before, it
    printed "targets met: up(Nmax)/up(1) <= 1.3, ..." although no ratio was measured."""
    one = B.Row(1, [B.Sample(5.95, 5.12, 0.3, {"connect": 0.07})], [4.83], reruns=[0.9])
    ok = B.Run(0.1, 0, "{}", "")
    monkeypatch.setattr(B, "first_hosts", lambda inventory, n, work: tmp_path / f"inventory-{n}.yaml")
    monkeypatch.setattr(B, "load_inventory", lambda path: SimpleNamespace(cluster=SimpleNamespace(container_name="c")))
    monkeypatch.setattr(B, "up", lambda inv: ok)
    monkeypatch.setattr(B, "down", lambda inv: ok)
    monkeypatch.setattr(B, "measure", lambda n, inv, container, reps, rerun: one)
    code = B.main(["--inventory", str(tmp_path / "hosts.yaml"), "--nodes", "1", "--reps", "1", "--png", ""])
    out = capsys.readouterr().out
    assert "targets met" not in out and "target met: convergence < 1s at every N" not in out
    assert "target not measured: up(Nmax)/up(1) <= 1.3 (one N only: --nodes 1)" in out
    assert "target met: overhead at N=1 < 2s (measured 0.83s)" in out
    assert out.rstrip().endswith("verdict: 3 met, 0 missed, 1 not measured (of 4 targets)")
    assert code == 0
