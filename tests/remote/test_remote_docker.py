"""The docker steps written once (bootstrap.remote.docker) and the fan-out's GroupResult."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bootstrap.cluster.facts import parse_container_inspect
from bootstrap.errors import GroupError
from bootstrap.remote import docker as DK
from bootstrap.remote.fanout import GroupResult, fan_out, run_all
from bootstrap.serve.state import STOP

DATA = Path(__file__).resolve().parents[1] / "data"


def test_exec_argv_keeps_flags_in_docker_order():
    assert DK.exec_argv("c", "ls", "-l") == ("docker", "exec", "c", "ls", "-l")
    assert DK.exec_argv("c", "cat", interactive=True) == ("docker", "exec", "-i", "c", "cat")
    assert DK.exec_argv("c", "x", detach=True, env=[("A", "1"), ("B", "x y")]) == (
        "docker", "exec", "-d", "-e", "A=1", "-e", "B=x y", "c", "x")
    argv = DK.exec_python_argv("c", ["a b", "2"])
    assert argv[:5] == ("docker", "exec", "-i", "c", "sh") and argv[-3:] == ("sh", "a b", "2")


def test_logs_argv():
    assert DK.logs_argv("n", 5) == ("docker", "logs", "--tail", "5", "n")
    assert DK.logs_argv("n", 200, follow=True) == ("docker", "logs", "--tail", "200", "--follow", "n")


def _sleeper(tag: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", tag])


def test_kill_tagged_kills_only_the_tagged_processes_then_runs_the_rest():
    tag = f"bootstrap-test-tag-{os.getpid()}"  # kills only what this test started
    tagged, other = _sleeper(tag), _sleeper(f"something-else-{os.getpid()}")
    try:
        time.sleep(0.2)
        argv = DK.kill_tagged_argv("c", tag, then="echo after")
        assert argv[:3] == ("docker", "exec", "c")
        r = subprocess.run(list(argv[3:]), capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout == "after\n"
        assert tagged.wait(10) == -9 and other.poll() is None
    finally:
        for p in (tagged, other):
            p.kill()
            p.wait()


def test_serve_stop_uses_the_same_kill_loop():
    # not run here: it would kill every vLLM process this machine can see
    assert DK.kill_matching('*"vllm serve"*|VLLM::*|*"vllm.entrypoints"*') in STOP


class _Result:
    def __init__(self, exit_code: int, stdout: str = "", stderr: str = ""):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class _Runner:
    def __init__(self, **answers: _Result):
        self.answers, self.argvs = answers, []

    def run(self, argv, *, timeout=None, check=True):
        self.argvs.append((tuple(argv), timeout, check))
        return self.answers.get(argv[1], _Result(0))


def test_inspect_reads_state_env_and_args():
    out = (DATA / "docker_container_inspect.json").read_text()
    ssh = _Runner(container=_Result(0, out))
    st = DK.inspect(ssh, "node")
    assert ssh.argvs == [(("docker", "container", "inspect", "node"), 30, False)]
    assert st == parse_container_inspect(out) and st.status
    assert isinstance(st.env, dict) and isinstance(st.args, tuple)
    assert "env" not in repr(st)  # it may hold secrets
    assert DK.inspect(_Runner(container=_Result(1, "[]", "Error: No such container: node")), "node") is None


def test_logs_and_rm():
    ssh = _Runner(logs=_Result(0, "out\n", "err\n"))
    assert DK.logs(ssh, "n", 5, timeout=20) == "out\nerr\n"
    DK.rm(ssh, "a", "b", timeout=120)
    assert ssh.argvs[:2] == [(("docker", "logs", "--tail", "5", "n"), 20, False),
                             (("docker", "rm", "-f", "a", "b"), 120, False)]


class _LocalShell:
    """Runs the argv here with a stand-in `docker` first on PATH (the step's own shell, for real)."""

    def __init__(self, bindir):
        self.env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}

    def run(self, argv, *, timeout=None, check=True):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env)
        return _Result(r.returncode, r.stdout, r.stderr)


def test_supervised_restarts_reads_dockers_count_the_supervisors_starts_and_the_twin(tmp_path):
    """One shell command per host: Docker's RestartCount, the count file inside the running
    container (checks/member.py's), the standby's state; each part may be missing."""
    (tmp_path / "docker").write_text(
        "#!/bin/sh\n"
        'case "$1 $4 $2" in\n'
        '  "inspect serve --format") [ "$3" = "{{.RestartCount}}" ] && echo 2 ;;\n'
        '  "inspect standby --format") echo running ;;\n'
        '  "inspect"*) echo "Error: No such object: $4" >&2; exit 1 ;;\n'
        '  "exec"*) [ "$2" = serve ] && [ "$3 $4" = "cat /opt/s" ] && printf "3\\n" || exit 1 ;;\n'
        "esac\n")
    (tmp_path / "docker").chmod(0o755)
    ssh = _LocalShell(tmp_path)
    assert DK.supervised_restarts(ssh, "serve", "/opt/s", "standby") == (2, 3, "running")
    assert DK.supervised_restarts(ssh, "serve", "/opt/s", "gone") == (2, 3, "absent")
    assert DK.supervised_restarts(ssh, "serve", "/opt/other") == (2, None, None)
    assert DK.supervised_restarts(ssh, "nothing", "/opt/s", "standby") == (0, None, "running")
    refused = _Runner(sh=_Result(255, "", "ssh: connect refused"))
    assert DK.supervised_restarts(refused, "serve", "/opt/s") == (0, None, None)


def test_group_result_splits_successes_and_failures():
    def fn(i: int) -> int:
        if i % 2:
            raise ValueError(i)
        return i * 10

    got = fan_out(range(4), fn, key=str, parallel=4)
    assert isinstance(got, GroupResult) and list(got) == ["0", "1", "2", "3"]
    assert got.succeeded == {"0": 0, "2": 20}
    assert list(got.failed) == ["1", "3"] and all(isinstance(e, ValueError) for e in got.failed.values())
    got["1"] = 1  # the views follow the dict
    assert list(got.failed) == ["3"]
    assert fan_out([], fn, key=str).failed == {}
    with pytest.raises(GroupError) as e:
        run_all("stage", range(2), fn, key=str)
    assert list(e.value.failures) == ["1"]
    assert run_all("stage", [0, 2], fn, key=str, parallel=1).succeeded == {"0": 0, "2": 20}
