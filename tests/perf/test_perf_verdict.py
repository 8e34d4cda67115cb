"""perf/verdict.py: a target is met or missed only when measured; otherwise "not measured" and why."""
import pytest

from perf import verdict as V


def test_met_missed_and_not_measured_lines():
    met = V.Check("exec(64)/pssh(64)", "<=", 1.0, 0.5)
    missed = V.Check("exec(64)/exec(1)", "<=", 3.0, 4.12)
    unmeasured = V.not_measured("exec(Nmax)/exec(1)", "<=", 3.0, "one N only: --nodes 64")
    assert (met.passed, missed.passed, unmeasured.passed) == (True, False, None)
    assert met.line() == "target met: exec(64)/pssh(64) <= 1 (measured 0.50)"
    assert missed.line() == "target missed: exec(64)/exec(1) <= 3 (measured 4.12)"
    assert unmeasured.line() == "target not measured: exec(Nmax)/exec(1) <= 3 (one N only: --nodes 64)"
    assert missed.shortfall == "exec(64)/exec(1) = 4.12 > 3"
    assert V.lines([met, missed, unmeasured]) == [
        met.line(), missed.line(), unmeasured.line(), "verdict: 1 met, 1 missed, 1 not measured (of 3 targets)"]


def test_units_strict_limits_and_percentages():
    assert V.Check("overhead at N=8", "<", 2.0, 2.0, unit="s").line() == \
        "target missed: overhead at N=8 < 2s (measured 2.00s)"
    rerun = V.Check("re-run up(8) / first up", "<=", 0.2, 0.21, spec=".0%")
    assert rerun.line() == "target missed: re-run up(8) / first up <= 20% (measured 21%)"
    assert rerun.shortfall == "re-run up(8) / first up = 21% > 20%"


def test_an_unmeasured_target_never_counts_as_met_nor_fails_the_run():
    only = [V.not_measured("up(Nmax)/up(1)", "<=", 1.3, "no N=1 in --nodes 2,4")]
    out = V.lines(only)
    assert not any(line.startswith("target met") or "targets met" in line for line in out)
    assert out[-1] == "verdict: 0 met, 0 missed, 1 not measured (of 1 target)"
    assert V.exit_status(only) == 0
    # a value that is not a number (0/0 of an empty run) is not a measurement either
    nan = V.Check("exec(8)/pssh(8)", "<=", 1.0, float("nan"), why="pssh timed 0 s")
    assert nan.passed is None and nan.line() == "target not measured: exec(8)/pssh(8) <= 1 (pssh timed 0 s)"


def test_exit_status_and_failed_runs():
    met = V.Check("a", "<=", 1.0, 0.5)
    assert V.exit_status([met]) == 0
    assert V.exit_status([met, V.Check("b", "<=", 1.0, 1.5)]) == 1
    assert V.exit_status([met], ["N=8 up #1 exited 3"]) == 1
    assert V.lines([met], ["N=8 up #1 exited 3"])[0] == "run failed: N=8 up #1 exited 3"


def test_a_check_says_why_it_was_not_measured_and_uses_known_operators():
    with pytest.raises(ValueError, match="reason"):
        V.Check("a", "<=", 1.0)
    with pytest.raises(ValueError, match="not one of"):
        V.Check("a", "=<", 1.0, 0.5)


def test_a_ratio_to_one_needs_n_1_and_a_larger_n():
    assert V.no_ratio_to_one([64]) == "one N only: --nodes 64"
    assert V.no_ratio_to_one([2, 4]) == "no N=1 in --nodes 2,4"
    assert V.no_ratio_to_one([1, 16, 64]) is None
