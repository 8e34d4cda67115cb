"""checks/keeper.py against a stand-in for Docker's API on a Unix socket (the endpoints it calls,
with Docker's shapes): a serving container that dies is started again about SETTLE seconds later,
on Docker's die event; one bootstrap renamed or is removing is left alone; a die it did not hear
is caught by the periodic look (two looks in a row)."""
from __future__ import annotations

import http.server
import json
import os
import socketserver
import subprocess
import sys
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
        self.events: list[dict] = []
        self.cond = threading.Condition()
        super().__init__(path, Handler)

    def die(self, cid, code=137, status="exited"):
        with self.cond:
            self.containers[cid].update(status=status, code=code)
            self.events.append({"status": "die", "id": cid, "time": time.time()})
            self.cond.notify_all()


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
        cid = url.path.split("/")[2]
        c = d.containers.get(cid)
        if c is None:
            self._json(404, {"message": f"No such container: {cid}"})
            return
        self._json(200, {"Id": cid, "Name": "/" + c["name"], "State": {"Status": c["status"], "ExitCode": c["code"]}})

    def do_POST(self):
        d: FakeDocker = self.server
        cid = self.path.split("/")[2]
        with d.cond:
            d.containers[cid]["status"] = "running"
            d.started.append((cid, time.monotonic()))
        self.send_response(204)
        self.end_headers()


@pytest.fixture
def docker(tmp_path):
    path = str(tmp_path / "docker.sock")
    d = FakeDocker(path)
    threading.Thread(target=d.serve_forever, daemon=True).start()
    yield d, path
    d.shutdown()


def keeper(path, interval):
    env = {**os.environ, "BOOTSTRAP_DOCKER_SOCKET": path, "BOOTSTRAP_KEEPER_SETTLE": "0.3"}
    return subprocess.Popen([sys.executable, str(KEEPER), "demo", str(interval), SERVE, "bootstrap-vllm-router"],
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
