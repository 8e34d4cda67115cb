"""`monitor status`, `top` and the Prometheus line under `status` when the monitor host does not
answer: "unreachable" (naming the host and why), never "Prometheus is not running". Fake hosts and
monkeypatched sessions: no test opens a socket."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.errors import CommandFailed, GroupError, HostUnreachable, MonitorUnreachable, PreflightFailed
from bootstrap.monitor import run as MON
from tests.support.fake_hosts import DOCKER_DOWN, FakeHost, fake_session
from tests.support.fleet_inventories import hosts_yaml, load, write

INVENTORY = "cluster:\n  accelerator: none\n" + hosts_yaml(2)
RUNNING = (0, (Path(__file__).resolve().parents[1] / "data" / "docker_container_inspect.json").read_text(), "")
ABSENT = (1, "[]", "Error: No such container: vllm-node-prometheus")


def gone(name: str = "h0") -> HostUnreachable:
    return HostUnreachable(name, "10.0.0.1: timed out after 10s", "is the host up and sshd listening?")


def session(tmp_path, h0: FakeHost, h1: FakeHost | None = None):
    inv = load(tmp_path, INVENTORY)
    return fake_session(inv, {"h0": h0, "h1": h1 or FakeHost("h1", unreachable=gone("h1"))})


def test_status_with_the_monitor_host_unreachable_says_unreachable(tmp_path):
    sess = session(tmp_path, FakeHost("h0", unreachable=gone()))
    with pytest.raises(MonitorUnreachable) as ei:
        MON.monitor_status(sess)
    text = str(ei.value)
    assert ei.value.host == "h0" and "unreachable" in text and "timed out after 10s" in text
    assert "not running" not in text
    assert isinstance(ei.value, HostUnreachable)  # exit 3, like every unreachable host


def test_status_with_docker_not_answering_is_that_error_not_not_running(tmp_path):
    sess = session(tmp_path, FakeHost("h0", [("inspect", DOCKER_DOWN)]))
    with pytest.raises(CommandFailed) as ei:
        MON.monitor_status(sess)
    assert ei.value.host == "h0" and "Cannot connect to the Docker daemon" in str(ei.value)


def test_status_without_the_container_still_says_not_running(tmp_path):
    sess = session(tmp_path, FakeHost("h0", [("inspect", ABSENT)]))
    with pytest.raises(PreflightFailed, match="Prometheus is not running"):
        MON.monitor_status(sess)


def test_status_with_prometheus_not_answering_is_an_error_naming_the_host(tmp_path):
    class Refusing(FakeHost):
        def http_get(self, ip, port, path, *, timeout=10.0):
            raise ConnectionRefusedError(f"{ip}:{port} from {self.name}: Connection refused")

    sess = session(tmp_path, Refusing("h0", [("inspect", RUNNING)]))
    with pytest.raises(CommandFailed) as ei:  # not a bare OSError (a traceback at the CLI)
        MON.monitor_status(sess)
    assert ei.value.host == "h0" and "Connection refused" in str(ei.value)


def test_running_url_says_unreachable_instead_of_none(tmp_path, monkeypatch):
    inv = load(tmp_path, INVENTORY)
    monkeypatch.setattr(MON, "Session", lambda inv, **kw: fake_session(
        inv, {"h0": FakeHost("h0", unreachable=gone()), "h1": FakeHost("h1")}))
    with pytest.raises(MonitorUnreachable, match="h0: the monitor host is unreachable"):
        MON.running_url(inv)


def test_monitor_down_purge_that_fails_is_an_error(tmp_path):
    h0 = FakeHost("h0", [("docker rm", (0, "", "")),
                         ("volume rm", (1, "", "Error response from daemon: remove x: volume is in use"))])
    sess = session(tmp_path, h0, FakeHost("h1", [("docker rm", (0, "", ""))]))
    with pytest.raises(GroupError, match="volume is in use"):
        MON.monitor_down(sess, purge=True)


# -- the CLI -------------------------------------------------------------------------------------
def _inventory(tmp_path) -> str:
    return str(write(tmp_path, INVENTORY))


def _unreachable(inv):
    raise MonitorUnreachable("h0", "10.0.0.1: timed out after 10s", "is the host up and sshd listening?")


def test_cli_monitor_status_names_the_unreachable_host(tmp_path, monkeypatch):
    def sess(inv, **kw):  # h1 answers nothing either: status only needs the monitor host
        return fake_session(inv, {"h0": FakeHost("h0", unreachable=gone()),
                                  "h1": FakeHost("h1", unreachable=gone("h1"))}, **kw)
    monkeypatch.setattr("bootstrap.face.observe.Session", sess)
    r = CliRunner().invoke(main, ["monitor", "status", "-i", _inventory(tmp_path)])
    assert r.exit_code == 3, r.output
    assert "h0: the monitor host is unreachable" in r.output and "timed out after 10s" in r.output
    assert "not running" not in r.output


def test_cli_top_from_prometheus_names_the_unreachable_host(tmp_path, monkeypatch):
    monkeypatch.setattr(MON, "Session", lambda inv, **kw: fake_session(
        inv, {"h0": FakeHost("h0", unreachable=gone()), "h1": FakeHost("h1")}))
    r = CliRunner().invoke(main, ["top", "-i", _inventory(tmp_path), "--source", "prometheus", "--once"])
    assert r.exit_code == 3, r.output
    assert "h0: the monitor host is unreachable" in r.output and "not running" not in r.output


def test_cli_top_auto_says_why_it_samples_with_the_probes(tmp_path, monkeypatch):
    from bootstrap.monitor import top as T

    class Watcher:
        def __init__(self, inv):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def sample(self):
            pass

        def frame(self, interval):
            return T.Frame(0.0, interval, 0.0, ())

    monkeypatch.setattr(MON, "running_url", _unreachable)
    monkeypatch.setattr(T, "Watcher", Watcher)
    r = CliRunner().invoke(main, ["top", "-i", _inventory(tmp_path), "--once", "--json", "--interval", "0.5"])
    assert r.exit_code == 0, r.output
    assert "cannot use Prometheus: h0: the monitor host is unreachable" in r.stderr
    assert json.loads(r.stdout)["source"] == "probe"


def test_cli_status_line_says_unknown_when_the_monitor_host_is_unreachable(tmp_path, monkeypatch):
    from bootstrap.cluster.run import ClusterStatus, NodeStatus

    rows = [NodeStatus("h0", "10.0.0.1", "head", True, "running", True, 0.0),
            NodeStatus("h1", "10.0.0.2", "worker", True, "running", True, 0.0)]
    monkeypatch.setattr("bootstrap.cluster.run.cluster_status",
                        lambda inv, parallel, serving: ClusterStatus(rows, None, None))
    monkeypatch.setattr(MON, "running_url", _unreachable)
    r = CliRunner().invoke(main, ["status", "-i", _inventory(tmp_path)])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("Prometheus:"))
    assert "unknown" in line and "h0" in line and "unreachable" in line and "not running" not in line


@pytest.mark.parametrize("answer,words", [
    (ConnectionRefusedError("10.0.0.1:9090 from h0: Connection refused"), "Connection refused"),
    (OSError("GET http://10.0.0.1:9090/api/v1/query from h0: timed out"), "timed out"),
    ((200, b"{not json"), "{not json"),
    ((200, b'{"status": "success", "data": "odd"}'), "exit 200"),
    ((503, b"Service Unavailable"), "Service Unavailable"),
    ((400, b'{"status": "error", "error": "parse error at char 3"}'), "parse error at char 3"),
])
def test_a_query_prometheus_cannot_answer_is_an_error_naming_the_host(tmp_path, answer, words):
    """`top` reads Prometheus with PromQL: a Prometheus whose container runs but that refuses, hangs
    or answers something else is a CommandFailed naming the monitor host (one line, exit 1), never a
    traceback."""
    class Odd(FakeHost):
        def http_get(self, ip, port, path, *, timeout=10.0):
            if isinstance(answer, BaseException):
                raise answer
            return answer

    sess = session(tmp_path, Odd("h0", []))
    with pytest.raises(CommandFailed) as ei:
        MON.query(sess, "up")
    assert ei.value.host == "h0" and words in str(ei.value), str(ei.value)
