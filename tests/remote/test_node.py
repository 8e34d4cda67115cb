"""The per-node runner (bootstrap.remote.node): the exact argv of every call, and the one error rule of a payload."""
import pytest

from bootstrap.errors import CommandFailed
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.session import check_script


class _Result:
    def __init__(self, exit_code: int = 0, stdout: str = "", stderr: str = ""):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class FakeRunner:
    """Records every call (argv, stdin, keywords) and answers from a queue of results."""
    name = "h1"

    def __init__(self, *results: _Result):
        self.results = list(results)
        self.calls: list[tuple] = []

    def _next(self) -> _Result:
        return self.results.pop(0) if self.results else _Result()

    def run(self, argv, *, timeout=None, check=True, **kw):
        self.calls.append(("run", tuple(argv), None, {"timeout": timeout, "check": check, **kw}))
        return self._next()

    def run_with_input(self, argv, chunks, *, timeout=None, check=True):
        self.calls.append(("input", tuple(argv), b"".join(chunks), {"timeout": timeout, "check": check}))
        return self._next()


def test_run_in_the_host_passes_argv_and_keywords_through():
    ssh = FakeRunner()
    N.Node(ssh, "node").run(("uptime",), timeout=5, check=False, hangup=True)
    assert ssh.calls == [("run", ("uptime",), None, {"timeout": 5, "check": False, "hangup": True})]


def test_run_in_the_container_is_one_docker_exec():
    ssh = FakeRunner()
    n = N.Node(ssh, "node")
    n.run_in("ls", "-l", timeout=9)
    n.run_in("cat", container="other", interactive=True, env=[("A", "1")], check=False)
    assert [c[1] for c in ssh.calls] == [("docker", "exec", "node", "ls", "-l"),
                                         ("docker", "exec", "-i", "-e", "A=1", "other", "cat")]
    assert ssh.calls[0][3] == {"timeout": 9, "check": True}
    assert ssh.calls[1][3] == {"timeout": None, "check": False}


def test_a_payload_is_the_check_script_piped_into_the_containers_python():
    ssh = FakeRunner(_Result(0, 'progress\n{"ready": true}\n'))
    assert N.Node(ssh, "node").payload("reach.py", "10.0.0.1", "6379", timeout=33) == {"ready": True}
    assert ssh.calls == [("input", DK.exec_python_argv("node", ["10.0.0.1", "6379"]), check_script("reach.py"),
                          {"timeout": 33, "check": False})]


def test_a_payload_on_the_host_and_in_an_image():
    ssh = FakeRunner(_Result(0, '{"ports": {}}'), _Result(0, '{"ok": 1}'))
    n = N.Node(ssh, "node")
    assert n.ask_host("port_probe.py", "listen", "10.0.0.1", timeout=30).doc == {"ports": {}}
    assert n.ask_image("img:1", "vllm_options.py").doc == {"ok": 1}
    assert ssh.calls == [
        ("input", ("python3", "-", "listen", "10.0.0.1"), check_script("port_probe.py"),
         {"timeout": 30, "check": False}),
        ("input", DK.run_python_argv("img:1", []), check_script("vllm_options.py"), {"timeout": 240, "check": False})]


def test_a_payload_answers_with_its_json_whatever_its_exit_status():
    ssh = FakeRunner(_Result(1, '{"ok": false, "error": "refused"}'))
    assert N.Node(ssh, "node").payload("reach.py") == {"ok": False, "error": "refused"}


@pytest.mark.parametrize("result", [_Result(1, "", "Error: No such container: node"),
                                    _Result(0, "Traceback ...\nnot json {"), _Result(0, "[1, 2]")])
def test_the_one_error_rule_no_json_object_line_raises_payload_failed(result):
    n = N.Node(FakeRunner(result), "node")
    with pytest.raises(N.PayloadFailed) as got:
        n.payload("serve_state.py", "a")
    exc = got.value
    assert isinstance(exc, CommandFailed)
    assert (exc.host, exc.command, exc.exit_code) == ("h1", "docker exec node serve_state.py", result.exit_code)
    assert exc.output_tail == (result.stderr or result.stdout)[-2000:]
    assert str(exc).startswith("h1: `docker exec node serve_state.py` failed (exit ")


def test_the_error_as_an_answer_is_the_outputs_tail():
    n = N.Node(FakeRunner(_Result(1, "x" * 400 + "\n", "boom")), "node")
    assert n.payload_or_error("model_info.py", "m", container="serve") == {"ready": False, "error": "x" * 300}
    n = N.Node(FakeRunner(_Result(0, '{"config": {}}')), "node")
    assert n.payload_or_error("model_info.py", "m") == {"config": {}}


def test_logs_and_inspect_of_the_default_or_another_container():
    ssh = FakeRunner(_Result(0, "a\n", "b\n"), _Result(1, "", "Error: No such container: x"))
    n = N.Node(ssh, "node")
    assert n.logs(5) == "a\nb\n"
    assert n.inspect(container="x") is None
    assert [c[1] for c in ssh.calls] == [("docker", "logs", "--tail", "5", "node"),
                                         ("docker", "container", "inspect", "x")]


def test_the_error_as_an_answer_is_always_last_json_or_error_of_the_output():
    """What the probes judged before the runner (session.last_json_or_error): an empty object too."""
    from bootstrap.remote.session import last_json_or_error
    for out in ("{}", '{"ready": true}', "boom", ""):
        assert N.Node(FakeRunner(_Result(0, out)), "node").payload_or_error("serve_probe.py") == last_json_or_error(out)
