"""perf/cold_up.py's verdict: registry bytes and up(Nmax)/up(1) with peers need N=1 and a larger N."""
from pathlib import Path
from types import SimpleNamespace

from perf import bringup as B
from perf import cold_up as C
from perf import verdict as V

# README, 2026-11-24, 4-node sandbox: up s and registry bytes per (N, mode)
RECORDED = {(1, "pull"): (60.7, 1.38e9), (1, "peers"): (58.9, 1.38e9), (2, "pull"): (106.5, 2.76e9),
            (2, "peers"): (175.9, 1.38e9), (4, "pull"): (179.2, 5.52e9), (4, "peers"): (254.8, 1.38e9)}


def res(nodes):
    return {(n, m): {"up": up, "registry": sent, "from": {}} for (n, m), (up, sent) in RECORDED.items() if n in nodes}


def test_both_targets_from_the_recorded_run():
    assert V.lines(C.checks(res([1, 2, 4]), [1, 2, 4], mode="peers")) == [
        "target met: peers: registry bytes at N=4 / at N=1 <= 1.2 (measured 1.00)",
        "target missed: peers: up(4)/up(1) <= 1.3 (measured 4.33)",
        "target not measured: sync-model: slowest node's copy / node link, min over N>=2 >= 0.7 "
        "(node links unshaped (--unshaped): no link rate to compare with)",
        "verdict: 1 met, 1 missed, 1 not measured (of 3 targets)"]


def test_one_n_or_no_n1_measures_neither_target():
    for nodes, why in (([1], "one N only: --nodes 1"), ([2, 4], "no N=1 in --nodes 2,4")):
        found = C.checks(res(nodes), nodes, mode="peers")
        assert [c.passed for c in found] == [None, None, None]
        assert found[1].line() == f"target not measured: peers: up(Nmax)/up(1) <= 1.3 ({why})"
        assert V.exit_status(found) == 0


def test_a_registry_that_sent_nothing_at_n1_is_not_a_measurement():
    r = res([1, 4])
    r[(1, "peers")]["registry"] = 0
    assert C.checks(r, [1, 4], mode="peers")[0].line() == (
        "target not measured: peers: registry bytes at N=4 / at N=1 <= 1.2 "
        "(the registry sent 0 bytes at N=1: its counter did not move)")


def test_main_at_one_n_does_not_print_targets_met(monkeypatch, capsys):
    """Before, `--nodes 1` compared N=1 with itself and printed "targets met: the registry sent one
    image's bytes at every N; peers up(Nmax)/up(1) <= 1.3"."""
    recorded = res([1])
    monkeypatch.setattr(C, "subprocess", SimpleNamespace(run=lambda *a, **kw: SimpleNamespace(returncode=0)))
    monkeypatch.setattr(C, "sandbox_up", lambda n, extra=(): Path("inventory.yaml"))
    monkeypatch.setattr(C, "first_hosts", lambda inventory, n, work: n)
    monkeypatch.setattr(C, "with_mode", lambda n, mode, work: (n, mode))
    monkeypatch.setattr(C, "cold", lambda key: recorded[key])
    monkeypatch.setattr(C, "down", lambda inv: B.Run(0.1, 0, "", ""))
    code = C.main(["--nodes", "1", "--unshaped", "--modes", "pull,peers"])
    out = capsys.readouterr().out
    assert "targets met" not in out
    assert "target not measured: peers: up(Nmax)/up(1) <= 1.3 (one N only: --nodes 1)" in out
    assert out.rstrip().endswith("verdict: 0 met, 0 missed, 3 not measured (of 3 targets)")
    assert code == 0


def sync(per: dict, size: int = 300_000_000) -> dict:
    return {"wall": 9.9, "bytes": size, "per": per}


def test_the_model_copy_is_judged_by_its_slowest_node_against_the_node_link():
    r = res([1, 2, 4])
    syncs = {2: sync({"node2": ("node1", 3.0)}),  # 800 Mbit/s
             4: sync({"node2": ("node1", 3.0), "node3": ("node1", 6.0), "node4": ("node2", 3.0)})}  # 400
    assert C.slowest_mbit(syncs[4]) == 400.0
    assert C.checks(r, [1, 2, 4], syncs, 1_000_000_000, "peers")[2].line() == (
        "target missed: sync-model: slowest node's copy / node link, min over N>=2 >= 0.7 (measured 0.40)")
    syncs[4]["per"]["node3"] = ("node1", 3.2)
    assert C.checks(r, [1, 2, 4], syncs, 1_000_000_000, "peers")[2].passed is True


def test_a_relayed_copy_or_no_copy_is_not_a_measurement_of_the_link():
    r = res([1, 2])
    relayed = {2: sync({"node2": ("this machine", None)})}
    assert "relayed through this machine" in C.checks(r, [1, 2], relayed, 10**9, "peers")[2].line()
    assert "no N >= 2" in C.checks(res([1]), [1], {}, 10**9, "peers")[2].line()


def test_each_receivers_time_is_its_copy_stage_done_event():
    t = C.StageTimes("copy-model")
    t.event("node2", "copy-model", "start")
    t.event("node2", "copy-model", "done", "3.1s")
    t.event("node3", "copy-model", "failed", "cannot reach node1")
    t.event("node1", "seed-model", "done", "300.0 MB to node2 in 3.0s (100.0 MB/s)")
    assert t.seconds == {"node2": 3.1}


def test_the_targets_are_judged_on_the_mirror_when_it_ran_and_the_modes_are_checked(capsys):
    r = res([1, 4])
    r[(1, "mirror")] = {"up": 130.0, "registry": 1.2e9, "from": {}}
    r[(4, "mirror")] = {"up": 169.0, "registry": 1.25e9, "from": {}}
    found = C.checks(r, [1, 4], mode="mirror")
    assert [c.line() for c in found[:2]] == [
        "target met: mirror: registry bytes at N=4 / at N=1 <= 1.2 (measured 1.04)",
        "target met: mirror: up(4)/up(1) <= 1.3 (measured 1.30)"]
    import pytest
    with pytest.raises(SystemExit):
        C.main(["--modes", "pull,mirrors"])
    assert "--modes takes pull, peers, mirror" in capsys.readouterr().err


def test_each_mode_is_an_inventory_change(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("cluster:\n  image: r:5000/a:b\n  image_mirror: r:5000/nginx:1\nhosts: []\n")
    import yaml
    got = {m: yaml.safe_load(C.with_mode(inv, m, tmp_path).read_text())["cluster"] for m in C.MODES}
    assert got["pull"]["peer_copy"] is False
    assert got["peers"]["peer_copy"] is True and got["peers"]["image_mirror"] is False
    assert got["mirror"]["peer_copy"] is True and got["mirror"]["image_mirror"] == "r:5000/nginx:1"
