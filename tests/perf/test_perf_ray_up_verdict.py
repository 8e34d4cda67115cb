"""perf/ray_up.py's verdict: bootstrap / the fastest `ray up` whose runs all finished, else not measured."""
from types import SimpleNamespace

from perf import ray_up as RU
from perf import verdict as V

# README, 2026-11-24, 3-node sandbox: v2 never listed the third node
RECORDED = {"bootstrap": [12.3, 11.5, 10.5], "ray up (v1)": [21.4, 21.8, 20.8], "ray up (v2)": [None, None, None]}


def test_measured_against_the_fastest_working_ray_up():
    found, failures = RU.checks(RECORDED)
    assert failures == []
    assert V.lines(found) == ["target missed: bootstrap / ray up (v1) <= 0.5 (measured 0.54)",
                              "verdict: 0 met, 1 missed, 0 not measured (of 1 target)"]
    faster = dict(RECORDED, bootstrap=[9.0, 10.0, 10.5])
    assert RU.checks(faster)[0][0].line() == "target met: bootstrap / ray up (v1) <= 0.5 (measured 0.47)"


def test_nothing_to_compare_with_or_a_failed_bootstrap_run_is_not_measured_and_fails_the_run():
    found, failures = RU.checks(dict(RECORDED, **{"ray up (v1)": [21.4, None, 20.8]}))
    assert found[0].line() == ("target not measured: bootstrap / fastest working ray up <= 0.5 "
                               "(no `ray up` run listed every node)")
    assert failures == ["no `ray up` run listed every node: nothing to compare with"]
    found, failures = RU.checks(dict(RECORDED, bootstrap=[12.3, None, 10.5]))
    assert found[0].passed is None and failures == ["bootstrap up failed in 1 of 3 run(s)"]
    assert V.exit_status(found, failures) == 1


def test_main_prints_the_unmeasured_target_as_not_measured(monkeypatch, tmp_path, capsys):
    """Before, a run where no `ray up` finished printed a free-form line instead of the target."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text("hosts: [{address: 10.0.0.1}, {address: 10.0.0.2}, {address: 10.0.0.3}]\n")
    ours = iter([5.0, 11.5, 10.5, 12.3])
    monkeypatch.setattr(RU, "sandbox_up", lambda n: inv)
    monkeypatch.setattr(RU, "load_inventory",
                        lambda path: SimpleNamespace(cluster=SimpleNamespace(ports=SimpleNamespace(ray_gcs=6379))))
    monkeypatch.setattr(RU, "launcher_config", lambda inv, work: work / "ray-cluster.yaml")
    monkeypatch.setattr(RU, "clean_nodes", lambda nodes, inv: None)
    monkeypatch.setattr(RU, "bootstrap_once", lambda inv: next(ours))
    monkeypatch.setattr(RU, "ray_up_once", lambda *a, **kw: None)
    code = RU.main(["--reps", "3"])
    out = capsys.readouterr().out
    assert "run failed: no `ray up` run listed every node: nothing to compare with" in out
    assert ("target not measured: bootstrap / fastest working ray up <= 0.5 (no `ray up` run listed every node)"
            in out)
    assert code == 1
