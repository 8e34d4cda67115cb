"""`bootstrap exec` against real OpenSSH servers on loopback: three hosts 127.0.0.2-4 (one sshd,
one port, a host key each address verified), a fake `docker` on the hosts' PATH for --container."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bootstrap.cluster.exec import ExecResult, exec_all, remote_argv
from bootstrap.inventory import load_inventory
from bootstrap.sandbox.sshd import SSHD
from perf.fanout import Row, commands, loopback_hosts, subset, table, verdict

pytestmark = pytest.mark.skipif(not os.path.exists(SSHD),
                                reason="needs openssh-server (scripts/dev-setup.sh installs it)")

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = "node-ctr"
# Exit 3 on the second host only: sshd puts the address the client reached in SSH_CONNECTION.
EXIT3_ON_H2 = 'echo "out $1 $(hostname)"; echo "err $1" >&2; case "$SSH_CONNECTION" in *" 127.0.0.3 "*) exit 3;; esac'
FAKE_DOCKER = """#!/bin/sh
# docker exec NAME CMD...: run CMD here, after saying which container it was meant for
[ "$1" = exec ] || { echo "unexpected docker $*" >&2; exit 99; }
echo "in-container:$2"
shift 2
exec "$@"
"""


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    d = tmp_path_factory.mktemp("exec")
    fake = d / "bin"
    fake.mkdir()
    (fake / "docker").write_text(FAKE_DOCKER)
    (fake / "docker").chmod(0o755)
    lb = loopback_hosts(d / "lb", 3, env={"PATH": f"{fake}:/usr/local/bin:/usr/bin:/bin", "SHLVL": "1"},
                        container_name=CONTAINER)
    yield lb
    lb.stop()


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    # ~/.ssh/known_hosts of the person running the tests must not decide the outcome.
    monkeypatch.setattr("bootstrap.remote.ssh.KNOWN_HOSTS", str(tmp_path / "home_known_hosts"))


@pytest.fixture
def with_unreachable(hosts, tmp_path):
    """The three hosts plus h4 on an address where nothing listens."""
    doc = yaml.safe_load(hosts.inventory.read_text())
    doc["hosts"].append({"name": "h4", "address": "127.0.0.250", "ip": "10.99.9.9"})
    path = tmp_path / "inv4.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def cli(inventory, *args, timeout=60):
    env = dict(os.environ, HOME=str(Path(inventory).parent))  # no ~/.ssh/known_hosts of the caller
    return subprocess.run([sys.executable, "-m", "bootstrap", "exec", "-i", str(inventory), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_each_host_output_prefixed_exit_code_per_host_and_summary(hosts):
    r = cli(hosts.inventory, "--", "sh", "-c", EXIT3_ON_H2, "sh", "hello")
    assert r.returncode == 1, r.stderr
    me = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    for h in ("h1", "h2", "h3"):
        assert f"{h} | out hello {me}" in r.stdout.splitlines()
        assert f"{h} | err hello" in r.stderr.splitlines()
    rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in r.stdout.splitlines()
            if ln.startswith("│")}
    assert rows == {"h1": "0", "h2": "3", "h3": "0"}
    assert "1 of 3 host(s) failed" in r.stderr and "unreachable" not in r.stderr


def test_all_hosts_ok_is_exit_0_and_json_has_every_field(hosts):
    r = cli(hosts.inventory, "--json", "--", "sh", "-c", 'echo "$SSH_CONNECTION" | cut -d" " -f3')
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [d["host"] for d in doc] == ["h1", "h2", "h3"]
    for i, d in enumerate(doc):
        assert set(d) == {"host", "exit_code", "stdout", "stderr", "seconds", "error"}
        assert d["exit_code"] == 0 and d["error"] == "" and d["stderr"] == ""
        assert d["stdout"] == f"127.0.0.{i + 2}\n"
        assert 0 < d["seconds"] < 30


def test_json_carries_a_failing_exit_code(hosts):
    r = cli(hosts.inventory, "--json", "--", "sh", "-c", EXIT3_ON_H2, "sh", "x")
    assert r.returncode == 1
    assert {d["host"]: d["exit_code"] for d in json.loads(r.stdout)} == {"h1": 0, "h2": 3, "h3": 0}


def test_argv_arrives_literally_and_no_local_or_remote_shell_expands_it(hosts, tmp_path):
    marker = Path(f"/tmp/pwned-{os.getpid()}-{time.monotonic_ns()}")
    evil = [f"$(touch {marker})", f"`touch {marker}`", f"; touch {marker}", "a b", "it's", '"q"', "*", "$HOME"]
    r = cli(hosts.inventory, "--json", "--", "printf", "%s\\n", *evil)
    assert r.returncode == 0, r.stderr
    for d in json.loads(r.stdout):
        assert d["stdout"].splitlines() == evil
    assert not marker.exists()


def test_an_unreachable_host_is_named_and_the_others_still_run(with_unreachable):
    t0 = time.monotonic()
    r = cli(with_unreachable, "--", "echo", "hi")
    assert r.returncode == 1
    assert time.monotonic() - t0 < 30
    assert {f"{h} | hi" for h in ("h1", "h2", "h3")} <= set(r.stdout.splitlines())
    assert "unreachable: h4" in r.stderr
    assert "h4" in r.stderr and "127.0.0.250" in r.stderr  # the reason, with the address
    r = cli(with_unreachable, "--json", "--", "true")
    doc = {d["host"]: d for d in json.loads(r.stdout)}
    assert doc["h4"]["exit_code"] is None and "cannot connect" in doc["h4"]["error"]
    assert all(doc[h]["exit_code"] == 0 for h in ("h1", "h2", "h3"))


def test_container_runs_through_docker_exec_with_the_inventory_container_name(hosts, tmp_path):
    marker = tmp_path / "pwned"
    r = cli(hosts.inventory, "--container", "--limit", "h1,h3", "--", "printf", "%s\\n", f"$(touch {marker})")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    for h in ("h1", "h3"):
        assert f"{h} | in-container:{CONTAINER}" in out and f"{h} | $(touch {marker})" in out
    assert not any(ln.startswith("h2 ") for ln in out)
    assert not marker.exists()


def test_timeout_per_host(hosts):
    t0 = time.monotonic()
    r = cli(hosts.inventory, "--hosts", "h2", "--timeout", "1", "--json", "--", "sleep", "30")
    assert r.returncode == 1 and time.monotonic() - t0 < 20
    (d,) = json.loads(r.stdout)
    assert d["exit_code"] is None and d["error"].startswith("timed out after 1s")


def test_bad_input_is_exit_2_before_any_host(hosts):
    r = cli(hosts.inventory, "--limit", "h1,nope", "--", "true")
    assert r.returncode == 2 and "nope" in r.stderr and r.stdout == ""
    assert cli(hosts.inventory).returncode == 2  # no command


def test_library_reports_each_host_as_it_finishes(hosts):
    inv = load_inventory(str(hosts.inventory))
    seen = []
    res = exec_all(inv, ["sh", "-c", "echo $1", "sh", "x y"], parallel=2, on_result=seen.append)
    assert sorted(r.host for r in seen) == ["h1", "h2", "h3"]
    assert [r.host for r in res] == ["h1", "h2", "h3"] and all(r.stdout == "x y\n" for r in res)
    assert remote_argv(inv, ["ls", "-l"], container=True) == ("docker", "exec", CONTAINER, "ls", "-l")
    assert ExecResult("a", None, "", "", 1.0, "timed out after 1s").unreachable is False


# -- the benchmark script's pieces, against the same hosts ------------------------------------------
@pytest.mark.skipif(not shutil.which("parallel-ssh"), reason="needs pssh")
def test_bench_commands_run_on_a_subset_and_pssh_verifies_host_keys(hosts, tmp_path):
    inv, hosts_file, extra = subset(hosts.inventory, 2, tmp_path)
    assert len(load_inventory(str(inv)).hosts) == 2
    assert hosts_file.read_text().splitlines() == [f"root@127.0.0.{k}:{load_inventory(str(inv)).hosts[0].ssh.port}"
                                                   for k in (2, 3)]
    cmds = commands(inv, hosts_file, extra, 4, shutil.which("parallel-ssh"))
    env = dict(os.environ, HOME=str(tmp_path))
    for tool in ("exec", "pssh"):
        r = subprocess.run(cmds[tool], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, (tool, r.stdout, r.stderr)
    # pssh refuses a host whose key is not in the known_hosts it was given
    (tmp_path / "empty").write_text("")
    bad = [x.replace(str(hosts.dir / "known_hosts"), str(tmp_path / "empty")) for x in cmds["pssh"]]
    assert subprocess.run(bad, capture_output=True, timeout=60, env=env).returncode != 0


def test_bench_table_and_targets():
    rows = [Row(1, {"exec": [0.5, 0.4, 0.6], "status": [0.5], "pssh": [0.2]},
                {"exec": {0}, "status": {1}, "pssh": {0}}),
            Row(64, {"exec": [1.4], "status": [1.5], "pssh": [3.5]}, {"exec": {0}, "status": {1}, "pssh": {0}})]
    text = table(rows)
    assert "(exit 1)" in text and "2.80" in text and "0.40" in text
    assert verdict(rows) == []
    rows[1].seconds["exec"] = [4.0]
    assert verdict(rows) == ["exec(64)/exec(1) = 8.00 > 3", "exec(64)/pssh(64) = 1.14 > 1"]
    # with CPU accounting (sandbox): the floor is (ours + hosts') / cores
    rows[1].cpu = {"exec": [1.2], "status": [1.0], "pssh": [5.0]}
    rows[1].hosts_cpu = {"exec": [2.0], "status": [2.0], "pssh": [2.4]}
    import os
    assert abs(rows[1].cpu_floor("exec") - 3.2 / (os.cpu_count() or 1)) < 1e-9
    assert "1.20+2.00" in table(rows) and "5.00+2.40" in table(rows)
    assert rows[0].cpu_floor("exec") is None
