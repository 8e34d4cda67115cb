"""CI's closing report, read from pytest's JUnit XML: the 25 slowest tests (setup + call + teardown),
the slowest modules and the sandbox modules' sum (the run's critical path), the whole run's time, and
two ways to fail that pytest's exit status does not cover.

- The run took longer than the budget (60 minutes of CI's 90): the margin is watched on every landing.
- A test was skipped for a reason CI can meet: a skip is allowed only for what this machine can
  never provide (ALLOWED_SKIPS), never for something .ci/run installs (Docker, sshd, torch, pssh).

Usage: python3 .ci/summary.py JUNIT_XML ELAPSED_SECONDS [BUDGET_SECONDS]
Exit 0 when within budget with no forbidden skip, 1 otherwise (one `error:` line per cause).
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

#: Skip reasons CI cannot meet: CI runs as root, and root reads a file whatever its mode.
ALLOWED_SKIPS = ("root reads anything",)
SLOWEST = 25
#: how many modules the per-module totals list (the sandbox modules run one after another on one worker:
#: their sum is the run's critical path)
MODULES = 12


def read(path: str) -> tuple[list[tuple[float, str]], list[tuple[str, str]], int]:
    """(seconds, test id) for every test case, (test id, reason) for every skipped one, and how
    many failed or errored."""
    root = ET.parse(path).getroot()
    times, skipped, failed = [], [], 0
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        times.append((float(case.get("time") or 0.0), name))
        for s in case.findall("skipped"):
            skipped.append((name, s.get("message") or (s.text or "").strip()))
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
    return times, skipped, failed


def minutes(s: float) -> str:
    return f"{s / 60:.1f} min ({s:.0f} s)"


def main(argv: list[str]) -> int:
    path, elapsed = argv[1], float(argv[2])
    budget = float(argv[3]) if len(argv) > 3 else 3600.0
    try:
        times, skipped, failed = read(path)
    except (OSError, ET.ParseError) as exc:
        print(f"error: cannot read pytest's report {path}: {exc}")
        return 1
    print(f"\n== the {SLOWEST} slowest tests (setup + call + teardown) ==")
    for secs, name in sorted(times, reverse=True)[:SLOWEST]:
        print(f"{secs:9.1f}s  {name}")
    per_module: dict[str, float] = {}
    for secs, name in times:
        module = name.split("::")[0]
        per_module[module] = per_module.get(module, 0.0) + secs
    print(f"== the {MODULES} slowest modules (their tests' sum) ==")
    for module, secs in sorted(per_module.items(), key=lambda kv: -kv[1])[:MODULES]:
        print(f"{secs:9.1f}s  {module}")
    sandbox = sum(s for m, s in per_module.items() if ".sandbox.test_sandbox_" in f".{m}")
    print(f"== the sandbox modules together (one worker, in order): {minutes(sandbox)} ==")
    in_tests = sum(t for t, _ in times)
    print(f"== total: {minutes(elapsed)} for the whole of .ci/run; {len(times)} tests took {minutes(in_tests)}; "
          f"budget {minutes(budget)} ==")
    rc = 0
    if elapsed > budget:
        print(f"error: CI took {minutes(elapsed)}, over its budget of {minutes(budget)} (CI's hard limit is "
              "90 min): make the slowest tests above cheaper before adding more")
        rc = 1
    bad = [(n, why) for n, why in skipped if not any(a in why for a in ALLOWED_SKIPS)]
    for name, why in bad:
        print(f"error: {name} was skipped ({why}); CI can run it, so a skip here is a failure")
    if bad:
        rc = 1
    # pytest's own closing line is above; this one closes the run with the same counts
    passed = len(times) - failed - len(skipped)
    print(f"{passed} passed, {failed} failed" + (f", {len(skipped)} skipped" if skipped else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
