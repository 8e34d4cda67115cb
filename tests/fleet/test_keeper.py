"""checks/keeper.py against a stand-in for Docker's API on a Unix socket (the endpoints it calls,
with Docker's shapes): a serving container that dies is started again about SETTLE seconds later,
on Docker's die event; one bootstrap renamed or is removing is left alone; a die it did not hear
is caught by the periodic look (two looks in a row)."""
from __future__ import annotations

import http.server
import io
import json
import os
import socketserver
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

KEEPER = Path(__file__).resolve().parents[2] / "checks" / "keeper.py"
SERVE = "bootstrap-vllm-serve"


class FakeDocker(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path):
        self.containers: dict[str, dict] = {}
        self.started: list[tuple[str, float]] = []
        #: every other call that changes something: (method, container id, what)
        self.calls: list[tuple[str, str, str]] = []
        self.events: list[dict] = []
        self.cond = threading.Condition()
        super().__init__(path, Handler)

    def die(self, cid, code=137, status="exited"):
        with self.cond:
            self.containers[cid].update(status=status, code=code)
            self.events.append({"status": "die", "id": cid, "time": time.time()})
            self.cond.notify_all()

    def find(self, ref):
        """A container's ID from its ID or its name, as Docker's API takes either."""
        return ref if ref in self.containers else next(
            (cid for cid, c in self.containers.items() if c["name"] == ref), ref)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def address_string(self):
        return "docker"

    def _json(self, code, doc):
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        d: FakeDocker = self.server
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/events":
            filters = json.loads(urllib.parse.parse_qs(url.query)["filters"][0])
            assert filters["event"] == ["die"] and filters["label"] == ["bootstrap.keep=demo"]
            self.send_response(200)
            self.end_headers()
            sent = 0
            while True:
                with d.cond:
                    d.cond.wait_for(lambda n=sent: len(d.events) > n, timeout=1)
                    new = d.events[sent:]
                sent += len(new)
                try:
                    for ev in new:
                        self.wfile.write((json.dumps(ev) + "\n").encode())
                    self.wfile.flush()
                except OSError:
                    return
        if url.path == "/containers/json":
            self._json(200, [{"Id": cid, "Names": ["/" + c["name"]], "State": c["status"]}
                             for cid, c in d.containers.items()])
            return
        cid = d.find(urllib.parse.unquote(url.path.split("/")[2]))
        c = d.containers.get(cid)
        if c is None:
            self._json(404, {"message": f"No such container: {url.path.split('/')[2]}"})
            return
        self._json(200, {"Id": cid, "Name": "/" + c["name"], "State": {"Status": c["status"], "ExitCode": c["code"]},
                         "Config": {"Labels": c.get("labels", {})}})

    def _empty(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        d: FakeDocker = self.server
        url = urllib.parse.urlsplit(self.path)
        cid, verb = d.find(urllib.parse.unquote(url.path.split("/")[2])), url.path.split("/")[3]
        args = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        with d.cond:
            if cid not in d.containers:
                self._empty(404)
                return
            if verb == "start":
                d.containers[cid]["status"] = "running"
                d.started.append((cid, time.monotonic()))
            elif verb == "rename":
                if any(c["name"] == args["name"] for c in d.containers.values()):
                    self._empty(409)
                    return
                d.containers[cid]["name"] = args["name"]
                d.calls.append(("rename", cid, args["name"]))
            elif verb == "kill":
                d.calls.append(("kill", cid, args.get("signal", "SIGKILL")))
        self._empty(204)

    def do_PUT(self):
        d: FakeDocker = self.server
        url = urllib.parse.urlsplit(self.path)
        cid = d.find(url.path.split("/")[2])
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            for m in tar.getmembers():
                path = urllib.parse.parse_qs(url.query)["path"][0] + "/" + m.name
                d.calls.append(("put", cid, f"{path}={tar.extractfile(m).read().decode()}"))
        self._empty(200)

    def do_DELETE(self):
        d: FakeDocker = self.server
        cid = d.find(urllib.parse.unquote(urllib.parse.urlsplit(self.path).path.split("/")[2]))
        with d.cond:
            if d.containers.pop(cid, None) is None:
                self._empty(404)
                return
            d.calls.append(("delete", cid, ""))
        self._empty(204)


@pytest.fixture
def docker(tmp_path):
    path = str(tmp_path / "docker.sock")
    d = FakeDocker(path)
    threading.Thread(target=d.serve_forever, daemon=True).start()
    yield d, path
    d.shutdown()


def keeper(path, interval, serve=SERVE):
    env = {**os.environ, "BOOTSTRAP_DOCKER_SOCKET": path, "BOOTSTRAP_KEEPER_SETTLE": "0.3"}
    return subprocess.Popen([sys.executable, str(KEEPER), "demo", str(interval), serve, "bootstrap-vllm-router"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Output:
    """The keeper's output, read line by line while it runs, so that a test stops it only after the
    line it checks was written (Docker answered the start before the keeper printed it)."""

    def __init__(self, proc):
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._t.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line)

    def has(self, needle: str) -> bool:
        return any(needle in ln for ln in self.lines)

    def text(self) -> str:
        self._t.join(timeout=10)
        return "".join(self.lines)


def wait_for(pred, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_a_killed_serving_container_is_started_on_its_die_event_and_bootstraps_own_stops_are_not(docker):
    d, path = docker
    d.containers.update({"a": {"name": SERVE, "status": "running", "code": 0},
                         "b": {"name": SERVE + "-old", "status": "running", "code": 0},  # a rollout renamed it
                         "c": {"name": "bootstrap-vllm-router", "status": "running", "code": 0}})
    k = keeper(path, 60)  # the periodic look is out of the picture: the events do it all
    output = Output(k)
    line = f"keeper: {SERVE} was Exited (137) when it died: started (204)"
    try:
        time.sleep(0.5)
        t = time.monotonic()
        d.die("a")
        d.die("b", code=0)
        d.die("c", status="removing")  # `docker rm -f`: Docker says "removing" by the time it dies
        assert wait_for(lambda: d.started), "the killed container was not started again"
        took = d.started[0][1] - t
        time.sleep(1.0)
        assert [cid for cid, _ in d.started] == ["a"], d.started
        assert 0.2 < took < 3.0, took
        wait_for(lambda: output.has(line))
    finally:
        k.terminate()
        k.wait(timeout=10)
    out = output.text()
    assert line in out, out


def test_a_die_the_keeper_did_not_hear_is_caught_by_two_looks(docker):
    d, path = docker
    d.containers["a"] = {"name": SERVE, "status": "exited", "code": 137}  # died before the keeper started
    k = keeper(path, 0.3)
    output = Output(k)
    line = f"keeper: {SERVE} was Exited (137) for two looks: started (204)"
    try:
        assert wait_for(lambda: d.started), "the exited container was not started"
        # stopped only once the line is out: a fresh-clone CI run stopped the keeper between Docker's
        # answer and its print
        wait_for(lambda: output.has(line))
    finally:
        k.terminate()
        k.wait(timeout=10)
    out = output.text()
    assert line in out, out


STANDBY = SERVE + "-standby"
SPEC = {"bootstrap.serve": '{"model": "/m"}', "bootstrap.replica": "1"}


def _keeper_with_standby(d, path, standby_labels):
    """A serving container "a" and its standby "s" (with STANDBY_LABELS), both running, and a keeper
    told that s stands by for a (its periodic look out of the picture); the keeper and its output."""
    d.containers.update({"a": {"name": SERVE, "status": "running", "code": 0, "labels": SPEC},
                         "s": {"name": STANDBY, "status": "running", "code": 0, "labels": standby_labels}})
    k = keeper(path, 60, f"{SERVE}={STANDBY}")
    time.sleep(0.5)
    return k, Output(k)


def test_a_killed_serving_container_is_replaced_by_its_standby_which_is_told_to_serve(docker):
    """The standby (vLLM imported, waiting) is renamed to the serving name and signalled; the dead
    container gets the standby role (with a delay before its imports) and name, and is started."""
    d, path = docker
    k, output = _keeper_with_standby(d, path, SPEC)
    try:
        d.die("a")
        assert wait_for(lambda: output.has("is the next standby")), output.lines
    finally:
        k.terminate()
        k.wait(timeout=10)
    assert d.containers["s"]["name"] == SERVE and d.containers["a"]["name"] == STANDBY
    assert d.calls == [("rename", "a", SERVE + "-spent"), ("rename", "s", SERVE), ("kill", "s", "SIGUSR1"),
                       ("put", "a", "/opt/bootstrap/member.role=standby delay=60\n"), ("rename", "a", STANDBY)], d.calls
    assert [cid for cid, _ in d.started] == ["a"]  # as the standby, under its name
    out = output.text()
    assert f"keeper: {SERVE} was Exited (137) when it died: its standby took over (signalled: 204)" in out, out


def test_a_standby_of_another_spec_or_not_running_does_not_take_over(docker):
    """After a rollout the standby may serve the old spec (labels differ): the dead container is
    started again as without a standby; so it is when the standby is not running."""
    d, path = docker
    k, output = _keeper_with_standby(d, path, {**SPEC, "bootstrap.serve": '{"model": "/old"}'})
    try:
        d.die("a")
        assert wait_for(lambda: output.has("started (204)")), output.lines
        d.containers["s"].update(labels=SPEC, status="exited")
        d.die("a")
        assert wait_for(lambda: len(d.started) == 2), d.started
    finally:
        k.terminate()
        k.wait(timeout=10)
    assert d.calls == [] and [cid for cid, _ in d.started] == ["a", "a"], (d.calls, d.started)
    assert d.containers["a"]["name"] == SERVE
    assert f"{STANDBY} serves another spec than {SERVE}: not taking over" in output.text()
