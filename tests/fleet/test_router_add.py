"""checks/fleet_probe.py's `add`, against an HTTP server on loopback that answers vllm-router's
/add_worker, /list_workers and Prometheus lines the way the router does: a worker is listed at
once, and seen healthy only after the router's own health check has passed (a rollout must not
take the next replica out before that, or the router has no worker to send a request to)."""
import http.server
import time
import urllib.parse

import pytest

from tests.fleet.test_drain import load_probe
from tests.support.loopback import Loopback, reply

WORKER = "http://127.0.0.1:18101"


class Router(Loopback):
    def __init__(self, healthy_after, export=True, closed_after=0.0):
        self.t_add, self.workers = None, []
        router = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                url = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["url"][0]
                router.workers.append(url)
                router.t_add = time.monotonic()
                reply(self, b"added")

            def do_GET(self):
                if self.path == "/list_workers":
                    reply(self, ('{"urls": [%s]}' % ",".join(f'"{u}"' for u in router.workers)).encode())
                    return
                lines = "vllm_router_active_workers 1\n"
                if export:
                    for u in router.workers:
                        t = time.monotonic() - router.t_add
                        lines += f'vllm_router_worker_health{{worker="{u}"}} {1 if t >= healthy_after else 0}\n'
                        lines += f'vllm_router_cb_state{{worker="{u}"}} {0 if t >= closed_after else 1}\n'
                reply(self, lines.encode())

        super().__init__(H)


@pytest.fixture
def router():
    made = []

    def make(*a, **kw):
        r = Router(*a, **kw)
        made.append(r)
        return r
    yield make
    for r in made:
        r.close()


def test_an_added_worker_counts_once_the_router_sees_it_healthy(router):
    r = router(healthy_after=1.2)
    doc = load_probe().change(r.url, WORKER, True, r.url + "/metrics", 10)
    assert doc["ok"] is True and doc["router_available"] is True, doc
    assert doc["waited"] >= 1.0, doc


def test_a_healthy_worker_whose_circuit_is_open_is_waited_for(router):
    """Healthy in the router's checks, but its circuit breaker open (it failed requests): the router
    sends it nothing until the breaker closes."""
    r = router(healthy_after=0, closed_after=1.5)
    doc = load_probe().change(r.url, WORKER, True, r.url + "/metrics", 10)
    assert doc["ok"] is True and doc["router_available"] is True and doc["waited"] >= 1.3, doc


def test_a_worker_the_router_never_sees_healthy_is_not_ok(router):
    r = router(healthy_after=60)
    doc = load_probe().change(r.url, WORKER, True, r.url + "/metrics", 1.5)
    assert doc["ok"] is False and doc["workers"] == [WORKER], doc
    assert doc["router_available"] is False and doc["waited"] >= 1.5, doc


def test_a_router_that_exports_no_health_view_is_not_waited_for(router):
    r = router(healthy_after=60, export=False)
    doc = load_probe().change(r.url, WORKER, True, r.url + "/metrics", 10)
    assert doc["ok"] is True and doc["waited"] < 2, doc


def test_without_metrics_add_checks_the_list_only(router):
    r = router(healthy_after=60)
    doc = load_probe().change(r.url, WORKER, True)
    assert doc["ok"] is True and "router_available" not in doc, doc
