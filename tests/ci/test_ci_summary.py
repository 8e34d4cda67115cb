""".ci/summary.py: the closing report CI prints, and the two failures it adds to pytest's."""
import subprocess
import sys

from tests.support.sandbox import ROOT

SUMMARY = ROOT / ".ci" / "summary.py"


def junit(tmp_path, cases):
    """cases: (name, seconds, kind, message) with kind one of pass, skip, fail."""
    body = []
    for name, secs, kind, msg in cases:
        inner = {"pass": "", "skip": f'<skipped type="pytest.skip" message="{msg}"/>',
                 "fail": f'<failure message="{msg}">boom</failure>'}[kind]
        body.append(f'<testcase classname="tests.m" name="{name}" time="{secs}">{inner}</testcase>')
    path = tmp_path / "junit.xml"
    path.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest">' + "".join(body)
                    + "</testsuite></testsuites>")
    return path


def summary(path, elapsed, budget=3600):
    return subprocess.run([sys.executable, str(SUMMARY), str(path), str(elapsed), str(budget)],
                          capture_output=True, text=True)


def test_prints_the_slowest_first_and_the_counts_last(tmp_path):
    cases = [(f"t{i}", i, "pass", "") for i in range(30)] + [("tf", 0.5, "fail", "x")]
    r = summary(junit(tmp_path, cases), 1234)
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    start = lines.index("== the 25 slowest tests (setup + call + teardown) ==")
    slow = lines[start + 1:start + 26]
    assert [ln.split("::")[1] for ln in slow] == [f"t{i}" for i in range(29, 4, -1)]
    assert "20.6 min (1234 s) for the whole of .ci/run" in r.stdout
    assert lines[-1] == "30 passed, 1 failed"


def test_over_budget_fails_with_one_line(tmp_path):
    r = summary(junit(tmp_path, [("a", 1, "pass", "")]), 3700, 3600)
    assert r.returncode == 1
    err = [ln for ln in r.stdout.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "61.7 min" in err[0] and "60.0 min" in err[0], err


def test_a_skip_ci_could_run_fails_and_the_root_skip_does_not(tmp_path):
    ok = summary(junit(tmp_path, [("a", 1, "pass", ""), ("b", 0, "skip", "root reads anything")]), 10)
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == "1 passed, 0 failed, 1 skipped", ok.stdout
    bad = summary(junit(tmp_path, [("a", 1, "pass", ""), ("c", 0, "skip", "no Docker engine")]), 10)
    assert bad.returncode == 1
    assert "error: tests.m::c was skipped (no Docker engine)" in bad.stdout, bad.stdout


def test_an_unreadable_report_fails(tmp_path):
    (tmp_path / "junit.xml").write_text("<not xml")
    r = summary(tmp_path / "junit.xml", 10)
    assert r.returncode == 1 and "cannot read pytest's report" in r.stdout
