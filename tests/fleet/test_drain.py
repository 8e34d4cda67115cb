"""checks/fleet_probe.py's drain, against a real HTTP server on loopback that serves vLLM's metric
lines the way vLLM does: the gauges move only when the engine's step returns, so a request can be
in flight while they still read zero."""
import http.server
import json
import pathlib
import time
import urllib.parse

import pytest

from tests.support.checks import load_check
from tests.support.loopback import Loopback, reply

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_probe():
    return load_check("fleet_probe")


class Replica(Loopback):
    """A /metrics endpoint whose values follow a script: [(seconds from start, running, waiting, done)]."""

    def __init__(self, script):
        self.script, self.t0, self.hits = script, time.monotonic(), 0
        replica = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                replica.hits += 1
                running, waiting, done = replica.now()
                reply(self, (f'vllm:num_requests_running{{model_name="m"}} {running}\n'
                             f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
                             f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {done}\n').encode())

        super().__init__(H)

    def now(self):
        t = time.monotonic() - self.t0
        row = self.script[0]
        for r in self.script:
            if r[0] <= t:
                row = r
        return row[1:]


@pytest.fixture
def replica():
    made = []

    def make(script):
        r = Replica(script)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def test_a_request_the_gauges_have_not_counted_yet_is_waited_for(replica):
    # idle at first (the request is in its prefill), running from 0.5 s, finished at 1.2 s
    r = replica([(0, 0, 0, 7), (0.5, 1, 0, 7), (1.2, 0, 0, 8)])
    doc = load_probe().drain(r.url, 10, quiet=1.0)
    assert doc["drained"] is True, doc
    assert doc["t"] >= 2.2 - 0.3, doc  # 1.2 s of work, then a full second of quiet
    assert "for 1s" in doc["why"]


def test_a_finishing_request_restarts_the_quiet_window(replica):
    # the gauges never show it (too short for a sample), but the success counter moves at 0.8 s
    r = replica([(0, 0, 0, 3), (0.8, 0, 0, 4)])
    doc = load_probe().drain(r.url, 10, quiet=1.0)
    assert doc["drained"] is True and doc["t"] >= 1.8 - 0.3, doc


def test_a_replica_that_stays_busy_is_not_drained_at_the_deadline(replica):
    r = replica([(0, 0, 2, 0)])
    doc = load_probe().drain(r.url, 3.0, quiet=0.5)  # 3 s: at least 3 looks on a loaded machine
    assert doc["drained"] is False and "still busy" in doc["why"] and "'waiting': 2.0" in doc["why"], doc
    assert r.hits >= 3


def test_an_idle_replica_drains_after_the_quiet_window_only(replica):
    r = replica([(0, 0, 0, 0)])
    doc = load_probe().drain(r.url, 10, quiet=0.5)
    assert doc["drained"] is True and 0.5 <= doc["t"] < 3, doc


def test_a_replica_that_no_longer_answers_is_drained():
    doc = load_probe().drain("http://127.0.0.1:9", 5, quiet=1.0)  # discard port: nothing listens
    assert doc["drained"] is True and doc["why"].startswith("not answering"), doc


def test_ready_ends_when_the_member_says_vllm_exited_and_not_for_an_older_exit(tmp_path):
    """The gate's wait (fleet_probe ready) for an API server that never answers: the member
    supervisor's line on a vLLM that exited after the wait began ends it at once with that reason;
    a line from before it does not."""
    fp = load_probe()
    exited = tmp_path / "member.exited"
    exited.write_text(f"{time.time() - 60:.3f} vLLM exited with status 1\n")  # an earlier start's
    t = time.monotonic()
    doc = fp.ready("http://127.0.0.1:9", 2.5, str(exited))  # port 9: nothing answers
    assert doc["ready"] is False and time.monotonic() - t >= 2.5 and "exited" not in doc["error"], doc
    import threading
    threading.Timer(1.0, lambda: exited.write_text(f"{time.time():.3f} vLLM exited with status 1\n")).start()
    t = time.monotonic()
    doc = fp.ready("http://127.0.0.1:9", 60, str(exited))
    assert doc == {"ready": False, "error": "vLLM exited with status 1", "t": doc["t"]}
    assert time.monotonic() - t < 10, doc


class QueuingRouter(Loopback):
    """A pool router (vllm-router's multi-model mode) that only queues a change: DELETE and POST
    /workers answer 202 and the change shows in GET /workers after `lag` more lists (None: never)."""

    def __init__(self, urls, lag):
        self.listed, self.lag, self.pending, self.gets, self.order = set(urls), lag, [], 0, []
        router = self

        class H(http.server.BaseHTTPRequestHandler):
            def _queue(self, change):
                router.pending.append([router.lag, change])
                router.order.append(self.command)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                reply(self, b'{"status": "accepted"}', 202)

            def do_DELETE(self):
                url = urllib.parse.unquote(self.path.split("/workers/", 1)[1])
                self._queue(lambda: router.listed.discard(url))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                router.pending.append([router.lag, lambda: router.listed.add(body["url"])])
                router.order.append("POST")
                reply(self, b'{"status": "accepted"}', 202)

            def do_GET(self):
                router.gets += 1
                router.order.append("GET")
                for p in router.pending:
                    if p[0] is not None:
                        p[0] -= 1
                        if p[0] < 0 and p[1] is not None:
                            p[1]()
                            p[1] = None
                reply(self, json.dumps({"workers": [{"url": u, "model_id": "chat"} for u in sorted(router.listed)]
                                        }).encode())
        super().__init__(H)


def test_a_replica_leaves_a_pool_router_only_once_the_router_lists_it_gone():
    """`route` counts a change once the router lists it: with a router that queues the change (202)
    and makes it a few lists later, taking a replica out returns only once GET /workers no longer
    lists its URL (the drain after it must not see a replica the router still sends requests to),
    and putting it back once it is listed again; a router that never makes it: an error at the deadline."""
    probe = load_probe()
    url = "http://10.0.0.2:8000"
    router = QueuingRouter([url], lag=3)
    try:
        assert probe.route(router.url, url, "round_robin", [], deadline=10) == {"ok": True}
        assert url not in router.listed and router.gets >= 4  # asked until the router listed it gone
        assert router.order[:2] == ["DELETE", "GET"]
        gets = router.gets
        assert probe.route(router.url, url, "round_robin", ["chat"], deadline=10) == {"ok": True}
        assert url in router.listed and router.gets >= gets + 4  # back only once listed again
    finally:
        router.close()
    stuck = QueuingRouter([url], lag=None)
    try:
        t = time.monotonic()
        got = probe.route(stuck.url, url, "round_robin", [], deadline=1.0)
        assert got == {"ok": False, "error": f"the router still lists {url} after 1s (GET /workers)"}, got
        assert 1.0 <= time.monotonic() - t < 5
    finally:
        stuck.close()
