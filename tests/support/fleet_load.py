"""What the fleet sandbox tests share: completions, `status`, and a load that keeps every request's
send time and outcome."""
import json
import threading
import time
import urllib.request

from tests.support.sandbox import cli

MODEL = "/opt/models/tiny-llama"


def complete(endpoint, prompt, key=None, max_tokens=16, model=MODEL):
    # every token shown (the tiny random model's greedy tokens may be special or EOS)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "skip_special_tokens": False})
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    with urllib.request.urlopen(urllib.request.Request(endpoint + "/completions", body.encode(), headers),
                                timeout=120) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


def status(inv):
    r = cli("status", "-i", inv, "--json")
    return json.loads(r.stdout)["fleet"]


def answers_health(url, timeout=5.0):
    """Whether a replica's vLLM answers GET /health with 200 (from this machine, as a member would)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def wait_answering(urls, deadline):
    """Until every URL answers /health, a GET a second, bounded: each `bootstrap status` (a Python
    process, SSH to every node, a probe in the router's container) took 5-14 s of the two cores that
    the restarting vLLM needs, and polling it every 5 s slowed the restart it waited for."""
    t0 = time.monotonic()
    while not all(answers_health(u) for u in urls) and time.monotonic() - t0 < deadline:
        time.sleep(1)


def wait_healthy(inv, deadline=420):
    t0 = time.monotonic()
    wait_answering([r["url"] for r in status(inv)["replicas"]], deadline)
    while time.monotonic() - t0 < deadline:
        st = status(inv)
        if all(r["health"] == "healthy" for r in st["replicas"]):
            return time.monotonic() - t0, st
        time.sleep(5)
    raise AssertionError(f"not every replica healthy after {deadline}s: {st}")


class Load:
    """Streaming completions through the router, `concurrency` at a time, until stopped; every
    request's send time (time.time()) and outcome are kept. With `pause`, each sender waits that
    long after each answer: a paced load keeps requests in flight through every step of a rollout
    without taking the two cores the replacement vLLM needs to start (closed-loop load doubled the
    start, 200 s instead of about 100 s per replica)."""

    def __init__(self, endpoint, concurrency=3, max_tokens=16, pause=0.0, key=None, model=MODEL):
        from bootstrap.serve import bench as B
        from bootstrap.serve import benchload as BL

        self.B = B
        self.model = model
        self.cfg = BL.BenchConfig(url=endpoint.removesuffix("/v1"), model=model, requests=1, concurrency=1,
                                 max_tokens=max_tokens, timeout=120, api_key=key)
        self.samples = []
        self.pause = pause
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(concurrency)]

    def _run(self):
        while not self.stop.is_set():
            self.samples.append(self.B.one_request(self.cfg, self.model, clock=time.time))
            self.stop.wait(self.pause)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=180)

    def failed(self, after=None):
        return [s for s in self.samples if not s.ok and (after is None or s.started >= after)]
