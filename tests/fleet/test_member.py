"""checks/member.py, the serve containers' supervisor, run for real on loopback: a stand-in
command instead of vLLM (a process that writes a file and sleeps), real sockets, real signals."""
import os
import re
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
    env = {**os.environ, "BOOTSTRAP_STOP_GRACE": grace, "BOOTSTRAP_MEMBER_STATE": str(marker.parent / f"s{rank}")}
    os.makedirs(env["BOOTSTRAP_MEMBER_STATE"], exist_ok=True)
    return subprocess.Popen([sys.executable, str(MEMBER), str(rank), str(nodes), "127.0.0.1", str(port), "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(what, timeout=20):
    """Until the file exists (or the callable is true)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if what() if callable(what) else what.exists():
            return True
        time.sleep(0.05)
    return False


def gone(marker):
    """No process of this test runs the stand-in vLLM that wrote MARKER (the member's own command
    line holds the stand-in's after its `--`: only a command line that starts with it counts)."""
    pattern = f"^{re.escape(sys.executable)} -c .*{re.escape(str(marker))}"
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return out.stdout.strip() == ""


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


def test_a_member_that_dies_stops_the_groups_vllm_and_the_group_starts_again_when_it_is_back(group):
    make, tmp = group
    head, one = make(0, 2), make(1, 2)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1")
    one.send_signal(signal.SIGKILL)  # the host or container of a member is gone (with its vLLM, as in a container)
    subprocess.run(["pkill", "-KILL", "-f", str(tmp / "vllm1")], check=False)
    assert wait_for(lambda: gone(tmp / "vllm0"))  # the head stopped its own vLLM: its collectives cannot finish
    assert head.poll() is None  # and waits for the group again, vLLM still imported
    (tmp / "vllm0").unlink()
    make(1, 2)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1")
    assert (tmp / "s0" / "member.starts").read_text() == "2\n"  # the head's count of its vLLM starts (status' restarts)
    head.send_signal(signal.SIGTERM)
    assert head.wait(timeout=20) == 0
    assert "a member of the group went away: the group starts again" in head.stderr.read()


def test_members_stop_their_vllm_when_the_head_goes_and_join_the_next_head(group):
    make, tmp = group
    head, one = make(0, 2), make(1, 2)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1")
    head.send_signal(signal.SIGKILL)
    subprocess.run(["pkill", "-KILL", "-f", str(tmp / "vllm0")], check=False)
    assert wait_for(lambda: gone(tmp / "vllm1")), "the member's vLLM outlived its head"
    assert one.poll() is None
    (tmp / "vllm1").unlink()
    make(0, 2)  # the keeper's standby, or the head's container started again
    assert wait_for(tmp / "vllm1")


def test_sigterm_is_a_clean_stop(group):
    make, tmp = group
    head, one = make(0, 2), make(1, 2)
    assert wait_for(tmp / "vllm0") and wait_for(tmp / "vllm1")
    head.send_signal(signal.SIGTERM)  # docker stop
    assert head.wait(timeout=20) == 0
    assert wait_for(lambda: gone(tmp / "vllm1"))  # its peer went away on purpose, but the member cannot know
    one.send_signal(signal.SIGTERM)
    assert one.wait(timeout=20) == 0


def test_a_single_node_replica_starts_vllm_again_after_a_pause_when_it_exits(tmp_path):
    marker = tmp_path / "m"
    env = {**os.environ, "BOOTSTRAP_MEMBER_STATE": str(tmp_path)}
    p = subprocess.Popen([sys.executable, str(MEMBER), "0", "1", "127.0.0.1", "1", "--", sys.executable, "-c",
                          f"import pathlib; f = pathlib.Path({str(marker)!r}); "
                          "f.write_text(f.read_text() + 'x' if f.exists() else 'x'); raise SystemExit(3)"],
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert wait_for(lambda: marker.exists() and marker.read_text() == "xx", timeout=20)
    finally:
        p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    err = p.stderr.read()
    assert "vLLM exited with status 3: the group starts again in 1s" in err, err
    # the gate's probe reads this: it stops waiting for a vLLM that exits (fleet_probe ready)
    stamp, why = (tmp_path / "member.exited").read_text().split(" ", 1)
    assert why == "vLLM exited with status 3\n" and abs(float(stamp) - time.time()) < 60


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


def _stand_in_vllm(root: Path) -> Path:
    """A package `vllm` whose command line records each import of it and each run (pid, argv), then
    waits to be stopped, as `vllm serve` does."""
    cli = root / "vllm" / "entrypoints" / "cli"
    cli.mkdir(parents=True)
    for d in (root / "vllm", root / "vllm" / "entrypoints", cli):
        (d / "__init__.py").write_text("")
    (cli / "main.py").write_text(
        "import os, sys, time, pathlib\n"
        f"LOG = pathlib.Path({str(root / 'log')!r})\n"
        "with LOG.open('a') as f: f.write(f'import {os.getpid()}\\n')\n"
        "def main():\n"
        "    with LOG.open('a') as f: f.write(f'run {os.getpid()} {\" \".join(sys.argv)}\\n')\n"
        "    time.sleep(600)\n")
    return root / "log"


def _supervise(state: Path) -> subprocess.Popen:
    """The member supervisor of a one-node replica running `vllm serve /m` from the stand-in package
    in STATE (also its state directory: role, starts, exit line)."""
    env = {**os.environ, "PYTHONPATH": str(state), "BOOTSTRAP_MEMBER_STATE": str(state)}
    return subprocess.Popen([sys.executable, str(MEMBER), "0", "1", "127.0.0.1", "1", "--", "vllm", "serve", "/m"],
                            stderr=subprocess.PIPE, text=True, env=env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _lines(log: Path, kind: str) -> list[list[str]]:
    return [ln.split()[1:] for ln in log.read_text().splitlines() if ln.startswith(kind)] if log.exists() else []


def test_vllm_is_imported_once_and_each_start_is_a_fork_of_the_member(tmp_path):
    log = _stand_in_vllm(tmp_path)
    p = _supervise(tmp_path)
    try:
        assert wait_for(lambda: len(_lines(log, "run")) == 1)
        first = _lines(log, "run")[0]
        assert first[1:] == ["vllm", "serve", "/m"] and int(first[0]) != p.pid
        os.killpg(int(first[0]), signal.SIGKILL)  # vLLM dies: the member forks it again, no new import
        assert wait_for(lambda: len(_lines(log, "run")) == 2, timeout=30)
        assert _lines(log, "import") == [[str(p.pid)]]  # imported once, in the member itself
        second = int(_lines(log, "run")[1][0])
        assert second != int(first[0])
    finally:
        p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    assert wait_for(lambda: not _alive(second))  # the forked vLLM went with the stop
    assert "vLLM preloaded in" in p.stderr.read()


def test_a_standby_preloads_and_serves_only_when_the_keeper_signals_it(tmp_path):
    log = _stand_in_vllm(tmp_path)
    (tmp_path / "member.role").write_text("standby\n")
    p = _supervise(tmp_path)
    try:
        assert wait_for(lambda: _lines(log, "import"))  # preloaded while it waits
        time.sleep(1.0)
        assert _lines(log, "run") == [] and (tmp_path / "member.role").read_text() == "standby\n"
        p.send_signal(signal.SIGUSR1)  # the keeper renamed it to the serving name
        assert wait_for(lambda: len(_lines(log, "run")) == 1)
        assert (tmp_path / "member.role").read_text() == "active\n"  # a restart of this container serves
    finally:
        p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0


def test_a_standby_that_is_stopped_never_started_vllm(tmp_path):
    log = _stand_in_vllm(tmp_path)
    (tmp_path / "member.role").write_text("standby delay=600\n")  # the killed container, as the next standby
    p = _supervise(tmp_path)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    assert not log.exists()  # not even imported: its delay had not run out
    assert "imported in 600s" in p.stderr.read()


def test_a_standby_signalled_during_its_delay_imports_and_serves_at_once(tmp_path):
    """The killed container, started again as the next standby (a delay before its imports), is
    signalled before its delay ran out when the new serving container is killed too."""
    log = _stand_in_vllm(tmp_path)
    (tmp_path / "member.role").write_text("standby delay=600\n")
    p = _supervise(tmp_path)
    try:
        time.sleep(1.0)
        p.send_signal(signal.SIGUSR1)
        assert wait_for(lambda: len(_lines(log, "run")) == 1)
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
