"""perf/bringup.py's arithmetic: floor, convergence, docker log times, targets."""
from datetime import datetime, timezone

from perf import bringup as B


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


def test_verdict():
    fast = B.Row(1, [B.Sample(10.0, 9.0, 0.3, {})], [2.0])
    wide = B.Row(8, [B.Sample(12.0, 10.5, 0.4, {})], [3.0], reruns=[2.0])
    assert B.verdict([fast, wide]) == []
    slow = B.Row(8, [B.Sample(14.0, 11.0, 1.2, {})], [3.0], reruns=[3.0])
    assert B.verdict([fast, slow]) == ["up(8)/up(1) = 1.40 > 1.3", "N=8: overhead 3.00s >= 2s",
                                       "N=8: convergence 1.20s >= 1s",
                                       "re-run up(8) = 3.00s = 21% of the first up (14.00s) > 20%"]
