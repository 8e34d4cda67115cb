""".ci/summary.py: the closing report CI prints, and the two failures it adds to pytest's."""
import subprocess
import sys

from tests.support.sandbox import ROOT

SUMMARY = ROOT / ".ci" / "summary.py"


def junit(tmp_path, cases, module="tests.m"):
    """cases: (name, seconds, kind, message) with kind one of pass, skip, fail; a name may carry its own
    module as `MODULE::NAME`."""
    body = []
    for name, secs, kind, msg in cases:
        classname, _, name = name.rpartition("::") if "::" in name else (module, "", name)
        inner = {"pass": "", "skip": f'<skipped type="pytest.skip" message="{msg}"/>',
                 "fail": f'<failure message="{msg}">boom</failure>'}[kind]
        body.append(f'<testcase classname="{classname}" name="{name}" time="{secs}">{inner}</testcase>')
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


def test_each_modules_sum_and_the_sandbox_modules_together(tmp_path):
    cases = [("tests.sandbox.test_sandbox_a::x", 100, "pass", ""), ("tests.sandbox.test_sandbox_a::y", 20, "pass", ""),
             ("tests.sandbox.test_sandbox_b::z", 60, "pass", ""), ("tests.sandbox.test_links::w", 500, "pass", ""),
             ("tests.unit::u", 70, "pass", "")]
    r = summary(junit(tmp_path, cases), 900)
    lines = r.stdout.splitlines()
    start = lines.index("== the 12 slowest modules (their tests' sum) ==")
    assert [ln.split() for ln in lines[start + 1:start + 5]] == [
        ["500.0s", "tests.sandbox.test_links"], ["120.0s", "tests.sandbox.test_sandbox_a"],
        ["70.0s", "tests.unit"], ["60.0s", "tests.sandbox.test_sandbox_b"]]
    assert "== the sandbox modules together (one worker, in order): 3.0 min (180 s) ==" in lines, r.stdout


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
