"""perf/policy_ab.py's verdicts from an A/B's rows (pure): each target met, missed or not measured."""
from __future__ import annotations

from bootstrap.serve import abtest as AB
from perf import policy_ab as P


def row(policy, hit, failed=0, shed=0) -> AB.Row:
    return AB.Row(policy, 2, 48, 48 - failed, failed, shed, 3.0, 100.0, 300.0, 50.0, 90.0, 3.0, 1000.0, hit, {0: 16})


def result(workload, rows) -> AB.AbResult:
    return AB.AbResult(workload, [r.policy for r in rows], [], rows, "power_of_two")


def test_the_verdicts_compare_what_was_measured_and_say_what_was_not():
    res = {"multi-turn": result("multi-turn", [row("round_robin", 30.0), row("sticky_least_loaded", 70.0),
                                                row("consistent_hash", 65.0)]),
           "random": result("random", [row("round_robin", 1.0), row("cache_aware", 2.5, failed=1)])}
    by = {c.name: c for c in P.checks(res)}
    assert by["multi-turn: failed + shed requests, every policy"].passed is True
    assert by["random: failed + shed requests, every policy"].passed is False  # one request failed
    sticky = by["multi-turn: best sticky policy's prefix hit % - round_robin's"]
    assert sticky.value == 40.0 and sticky.passed is True
    assert by["random (control): highest prefix hit %"].value == 2.5
    only = {c.name: c for c in P.checks({"random": result("random", [row("round_robin", 9.0)])})}
    assert only["random (control): highest prefix hit %"].passed is False
    assert only["multi-turn: best sticky policy's prefix hit % - round_robin's"].passed is None  # not run
