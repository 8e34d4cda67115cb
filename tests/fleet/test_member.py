"""checks/member.py, the serve containers' supervisor, run for real on loopback: a stand-in
command instead of vLLM (a process that writes a file and sleeps), real sockets, real signals."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

MEMBER = Path(__file__).resolve().parents[2] / "checks" / "member.py"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(rank, nodes, port, marker, grace="5"):
    # the "vLLM" of this member: records that it started, then waits to be stopped
    cmd = [sys.executable, "-c", f"import time,pathlib; pathlib.Path({str(marker)!r}).write_text('up'); "
                                 "time.sleep(600)"]
    env = {**os.environ, "BOOTSTRAP_STOP_GRACE": grace}
    return subprocess.Popen([sys.executable, str(MEMBER), str(rank), str(nodes), "127.0.0.1", str(port), "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(path, timeout=20):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def group(tmp_path):
    port = free_port()
    procs = []

    def make(rank, nodes):
        p = start(rank, nodes, port, tmp_path / f"vllm{rank}")
        procs.append(p)
        return p
    yield make, tmp_path
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    # a member killed with SIGKILL leaves its stand-in vLLM (its own session, as in a container where
    # the member is PID 1 and takes it along) running: end every process of this test's files
    subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)


def test_the_head_starts_vllm_only_when_every_member_is_there(group):
    make, tmp = group
    head = make(0, 3)
    one = make(1, 3)
    time.sleep(1.5)
    assert not (tmp / "vllm0").exists() and not (tmp / "vllm1").exists()
    make(2, 3)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1") and wait_for(tmp / "vllm2")
    assert head.poll() is None and one.poll() is None


def test_a_member_that_dies_takes_its_group_down_non_zero(group):
    make, tmp = group
    head, one = make(0, 2), make(1, 2)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1")
    one.send_signal(signal.SIGKILL)  # the host or container of a member is gone
    assert head.wait(timeout=20) == 1
    assert "a member of the group went away: the group restarts" in head.stderr.read()


def test_members_fall_when_the_head_goes_and_vllm_is_not_left_running(group):
    make, tmp = group
    head, one = make(0, 2), make(1, 2)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1")
    head.send_signal(signal.SIGKILL)
    assert one.wait(timeout=20) == 1
    out = subprocess.run(["pgrep", "-f", str(tmp / "vllm1")], capture_output=True, text=True)
    assert out.stdout.strip() == "", "the member's vLLM outlived it"


def test_sigterm_is_a_clean_stop(group):
    make, tmp = group
    head, one = make(0, 2), make(1, 2)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1")
    head.send_signal(signal.SIGTERM)  # docker stop
    assert head.wait(timeout=20) == 0
    assert one.wait(timeout=20) == 1  # its peer went away on purpose, but the member cannot know: it restarts


def test_a_single_node_replica_exits_with_vllm(tmp_path):
    marker = tmp_path / "m"
    p = subprocess.Popen([sys.executable, str(MEMBER), "0", "1", "127.0.0.1", "1", "--", sys.executable, "-c",
                          f"import pathlib; pathlib.Path({str(marker)!r}).write_text('x'); raise SystemExit(3)"],
                         stderr=subprocess.PIPE, text=True)
    assert p.wait(timeout=20) == 1
    assert marker.exists() and "vLLM exited with status 3" in p.stderr.read()


def _member_module(monkeypatch, tmp_path, arg_utils: str | None):
    """checks/member.py imported with a stand-in vllm package on the path: only its argument
    parser's source matters (the member reads it, it does not import vllm)."""
    import importlib.util

    if arg_utils is not None:
        (tmp_path / "vllm" / "engine").mkdir(parents=True)
        (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('the member must not import vllm')\n")
        (tmp_path / "vllm" / "engine" / "arg_utils.py").write_text(arg_utils)
        monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("member_under_test", MEMBER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SERVE = ["vllm", "serve", "/m", "--nnodes", "2", "--node-rank", "0", "--host", "10.0.0.1"]


def test_the_api_server_finishes_in_flight_requests_on_stop_when_vllm_can(monkeypatch, tmp_path, capsys):
    m = _member_module(monkeypatch, tmp_path, 'parser.add_argument(\n    "--shutdown-timeout",\n    type=int)\n')
    assert m.with_drain_on_stop(SERVE, 30) == [*SERVE, "--shutdown-timeout", "25"]
    assert "--shutdown-timeout 25" in capsys.readouterr().err
    # a headless member has no API server; a flag the user set is theirs; other commands are left alone
    assert m.with_drain_on_stop([*SERVE, "--headless"], 30) == [*SERVE, "--headless"]
    assert m.with_drain_on_stop([*SERVE, "--shutdown-timeout", "3"], 30) == [*SERVE, "--shutdown-timeout", "3"]
    assert m.with_drain_on_stop([*SERVE, "--shutdown-timeout=3"], 30) == [*SERVE, "--shutdown-timeout=3"]
    assert m.with_drain_on_stop(["python3", "-c", "pass"], 30) == ["python3", "-c", "pass"]
    assert m.with_drain_on_stop(SERVE, 4) == [*SERVE, "--shutdown-timeout", "1"]


def test_an_older_vllm_without_the_flag_gets_the_command_unchanged(monkeypatch, tmp_path, capsys):
    m = _member_module(monkeypatch, tmp_path, 'parser.add_argument("--disable-log-stats")\n')
    assert m.with_drain_on_stop(SERVE, 30) == SERVE
    assert "no --shutdown-timeout" in capsys.readouterr().err
