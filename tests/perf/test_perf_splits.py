"""perf/splits.py's verdict: each configuration's ITL p50 against the first one's, load by load."""
from perf import splits as S
from perf import verdict as V


def row(label, *itls, error=""):
    return S.Row(label, 3, loads=[S.Load(itl_p50=x, ok=24) for x in itls], error=error)


def test_first_and_later_loads_are_each_judged_against_the_same_load_of_the_first_row():
    # 2026-11-27 (perf/README.md): PP=2 10.4 / 12.0 ms, PP=3 12.2 / 16.3 ms; stock image PP=3 first load 1035 ms
    rows = [row("TP=1 PP=2", 10.4, 12.0), row("TP=1 PP=3", 12.2, 16.3), row("TP=1 PP=3 --x", 1035.0, 26.0)]
    lines = V.lines(S.checks(rows, 2, 2.0))
    assert lines == [
        "target met: ITL p50 TP=1 PP=3 / TP=1 PP=2, load 1 of 2 <= 2 (measured 1.17)",
        "target met: ITL p50 TP=1 PP=3 / TP=1 PP=2, load 2 of 2 <= 2 (measured 1.36)",
        "target missed: ITL p50 TP=1 PP=3 / TP=1 PP=2, load 1 of 2 <= 2 (measured 99.52)",
        "target missed: ITL p50 TP=1 PP=3 / TP=1 PP=2, load 2 of 2 <= 2 (measured 2.17)",
        "verdict: 2 met, 2 missed, 0 not measured (of 4 targets)"]


def test_a_row_that_failed_is_not_measured_and_says_why():
    rows = [row("TP=1 PP=2", 10.0, 10.0), row("TP=1 PP=3", error="serve exited 4")]
    found = S.checks(rows, 2, 2.0)
    assert [c.passed for c in found] == [None, None]
    assert found[0].line().endswith("(no load 1 for TP=1 PP=3 (serve exited 4))")
    assert S.checks(rows[:1], 2, 2.0) == []
