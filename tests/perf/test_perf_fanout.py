"""perf/fanout.py's verdict: exec(Nmax)/exec(1) and exec/pssh are met or missed only when measured."""
from pathlib import Path

from perf import fanout as F
from perf import verdict as V

OK = {"exec": {0}, "status": {1}, "pssh": {0}}


def row(n, exec_s, pssh_s=None, codes=OK):
    seconds = {"exec": [exec_s], "status": [exec_s * 1.2]}
    if pssh_s is not None:
        seconds["pssh"] = [pssh_s]
    return F.Row(n, seconds, {t: set(c) for t, c in codes.items() if t in seconds})


def lines(rows):
    return V.lines(*F.checks(rows))


def test_both_targets_measured_from_the_recorded_sandbox_run():
    # README: 64 sshd-only nodes, exec 0.467 / 0.571 / 1.922 s, pssh 0.264 / 0.940 / 3.860 s
    rows = [row(1, 0.467, 0.264), row(16, 0.571, 0.940), row(64, 1.922, 3.860)]
    assert lines(rows) == ["target missed: exec(64)/exec(1) <= 3 (measured 4.12)",
                           "target met: exec(64)/pssh(64) <= 1 (measured 0.50)",
                           "verdict: 1 met, 1 missed, 0 not measured (of 2 targets)"]
    assert F.verdict(rows) == ["exec(64)/exec(1) = 4.12 > 3"]


def test_no_scaling_ratio_without_n1_or_with_one_n():
    out = lines([row(16, 0.571, 0.940), row(64, 1.922, 3.860)])
    assert out[0] == "target not measured: exec(Nmax)/exec(1) <= 3 (no N=1 in --nodes 16,64)"
    assert lines([row(64, 1.922, 3.860)])[0] == "target not measured: exec(Nmax)/exec(1) <= 3 (one N only: --nodes 64)"


def test_without_pssh_exec_vs_pssh_is_not_measured_and_the_table_shows_dashes():
    rows = [row(1, 0.467), row(64, 1.2)]
    assert lines(rows)[1] == ("target not measured: exec(64)/pssh(64) <= 1 (parallel-ssh not run: not installed "
                              "(apt-get install pssh) or --pssh '')")
    assert F.verdict(rows) == []
    text = F.table(rows)
    assert "2.57" in text and " - " in text
    assert "pssh" not in F.commands(Path("inv"), Path("hosts"), [], 8, None)


def test_failed_runs_are_failures_and_their_ratios_not_measured():
    bad_pssh = {"exec": {0}, "status": {1}, "pssh": {0, 255}}
    rows = [row(1, 0.467, 0.264), row(64, 1.922, 3.860, codes=bad_pssh)]
    found, failures = F.checks(rows)
    assert failures == ["N=64: a run of pssh failed (exit 0,255)"]
    assert [c.line() for c in found] == ["target missed: exec(64)/exec(1) <= 3 (measured 4.12)",
                                         "target not measured: exec(64)/pssh(64) <= 1 (pssh failed at N=64)"]
    assert V.exit_status(found, failures) == 1
    bad_exec = {"exec": {1}, "status": {1}, "pssh": {0}}
    found, failures = F.checks([row(1, 0.467, 0.264), row(64, 0.3, 3.860, codes=bad_exec)])
    assert failures == ["N=64: a run of exec failed (exit 1)"]
    assert [c.passed for c in found] == [None, None]


def run_main(monkeypatch, rows, *args):
    by_n = {r.n: r for r in rows}
    monkeypatch.setattr(F, "subset", lambda inventory, n, work: (Path(f"inv-{n}"), Path(f"hosts-{n}"), []))
    monkeypatch.setattr(F, "measure", lambda n, cmds, reps: by_n[n])
    return F.main(["--inventory", "hosts.yaml", "--nodes", ",".join(str(r.n) for r in rows), "--png", "", *args])


def test_main_does_not_print_targets_met_for_a_ratio_it_did_not_measure(monkeypatch, capsys):
    """Before, a run at 16 and 64 hosts printed "targets met: exec(Nmax)/exec(1) <= 3, ..." with no N=1."""
    code = run_main(monkeypatch, [row(16, 0.571, 0.940), row(64, 1.922, 3.860)], "--pssh", "/bin/true")
    out = capsys.readouterr().out
    assert "targets met" not in out
    assert "target not measured: exec(Nmax)/exec(1) <= 3 (no N=1 in --nodes 16,64)" in out
    assert "target met: exec(64)/pssh(64) <= 1 (measured 0.50)" in out
    assert code == 0


def test_main_runs_without_pssh_and_says_exec_vs_pssh_was_not_measured(monkeypatch, tmp_path, capsys):
    """Before, a machine without parallel-ssh could not run the benchmark at all (exit 2)."""
    code = run_main(monkeypatch, [row(1, 0.467), row(64, 1.2)], "--pssh", str(tmp_path / "no-pssh"))
    out = capsys.readouterr().out
    assert "target met: exec(64)/exec(1) <= 3 (measured 2.57)" in out
    assert "target not measured: exec(64)/pssh(64) <= 1 (parallel-ssh not run" in out
    assert code == 0
