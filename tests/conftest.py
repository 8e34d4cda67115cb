import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# pytest-xdist's workers (scripts/test.sh runs two) start with COLUMNS=80 and LINES=24 in their
# environment; every command a test starts would inherit them, and `bootstrap top` in the tmux pane
# of the fleet test then drew its tables 80 columns wide in a 200-column terminal (CI run, 2026-11-28).
# A plain pytest run has neither, so the tests see what a user's shell gives.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)

# Under pytest-xdist (scripts/test.sh) the sandbox tests, one group on one worker, are CI's critical path
# (about 50 of its minutes), while the unit tests beside them finish in about 11 with the rest to spare;
# on a 2-core machine they compete for the cores the sandbox's engines use. A unit test therefore runs
# at a lower CPU priority (nice +10, inherited by the commands it starts), a sandbox test at the one the
# run started with. Root only: another user could not lower it again.
_BASE_NICE = os.getpriority(os.PRIO_PROCESS, 0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if not os.environ.get("PYTEST_XDIST_WORKER") or os.geteuid() != 0:
        return
    want = _BASE_NICE if item.get_closest_marker("sandbox") else min(19, _BASE_NICE + 10)
    if os.getpriority(os.PRIO_PROCESS, 0) != want:
        os.setpriority(os.PRIO_PROCESS, 0, want)


# Every CLI run writes a run log (bootstrap/cli/runlog.py); the suite's thousands of runs would each
# leave one in the user's ~/.cache. tests/cli/test_runlog.py sets its own folder.
os.environ.setdefault("BOOTSTRAP_RUNS", "off")


def docker_ok() -> bool:
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True).returncode == 0


def require_docker():
    if docker_ok():
        return
    if os.environ.get("BOOTSTRAP_REQUIRE_SANDBOX") == "1":
        pytest.fail("the sandbox tests need a running Docker engine (scripts/dev-setup.sh starts one)")
    pytest.skip("no Docker engine (set BOOTSTRAP_REQUIRE_SANDBOX=1 to make this a failure)")


@pytest.fixture(scope="session")
def _sandbox_session():
    """Removes the sandbox at the end of the session (whatever shape the tests left it in)."""
    require_docker()
    yield
    if os.environ.get("BOOTSTRAP_KEEP_SANDBOX") != "1":
        from bootstrap import sandbox as S

        S.sandbox_down(log=lambda m: print(f"sandbox: {m}", flush=True))


@pytest.fixture(scope="module")
def sandbox3(_sandbox_session):
    """A 3-node sandbox for this module: a no-op when it is already up with 3 nodes, recreated when
    another module (test_sandbox_infra) changed or removed it."""
    from bootstrap import sandbox as S
    from tests.support.sandbox import shared_sandbox

    return S.sandbox_up(3, log=lambda m: print(f"sandbox: {m}", flush=True), **shared_sandbox())
