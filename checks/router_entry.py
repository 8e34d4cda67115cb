"""A pool's router: run vllm-router in its multi-model mode and give it its workers, on every start.

Runs INSIDE the router's container as its command, with nothing but the standard library:

  router_entry.py WORKERS_JSON -- vllm-router --enable-igw --host IP --port PORT ...

WORKERS_JSON: [{"url": ..., "model_id": ..., "labels": {"policy": ...}}, ...], one per replica and
name, or @PATH: a file in the container that holds it (bootstrap rewrites that file when `serve`
converges the pool, so that a router restarted later adds what the pool serves now).

vllm-router 0.1.17 routes by the request's `model` only in its IGW mode (--enable-igw), and in that
mode it drops --worker-urls (lib.rs sets worker_urls to an empty list): workers exist only once they
are added through its API (POST /workers with a model_id). A router that restarts (its restart
policy, the keeper) would start with none, so this entry adds them on every start, each once (the
router counts a URL added twice under one name twice: worker_registry.rs), then waits on
vllm-router and exits with its status. A replica serving adapters is added under each name.
SIGTERM and SIGINT are passed on.
"""
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

#: how long to wait for the router's API after each start, and between tries
DEADLINE_S = 120
STEP_S = 0.5


def http(method, url, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def option(argv, name):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def registered(api):
    """The router's workers as {(url, model_id)} (GET /workers; it shows the last name a URL was added
    under, which is all a router that just started can have)."""
    code, body = http("GET", api + "/workers")
    if code != 200:
        raise RuntimeError(f"GET /workers answered {code}")
    doc = json.loads(body)
    items = doc.get("workers", []) if isinstance(doc, dict) else doc
    return {(w.get("url", "").rstrip("/"), w.get("model_id")) for w in items if isinstance(w, dict)}


def add_workers(api, workers, proc):
    """Add each (url, name) the router does not hold yet, each once (a URL added twice under one name
    counts twice; under several names it is one worker indexed under each); True once all are in,
    False if vllm-router ended."""
    start, last, done = time.monotonic(), None, None
    while time.monotonic() - start < DEADLINE_S:
        if proc.poll() is not None:
            return False
        try:
            if done is None:
                done = registered(api)
            for w in workers:
                key = (w["url"].rstrip("/"), w["model_id"])
                if key in done:
                    continue
                code, body = http("POST", api + "/workers", w)
                if code >= 300:
                    raise RuntimeError(f"POST /workers {w['url']} answered {code}: {body[:200]!r}")
                done.add(key)
                print(f"router_entry: added {w['url']} for {w['model_id']}", flush=True)
            return True
        except (OSError, RuntimeError, ValueError) as exc:
            last = exc
        time.sleep(STEP_S)
    print(f"router_entry: could not add the workers in {DEADLINE_S}s: {last}", file=sys.stderr, flush=True)
    return True


def read_workers(arg):
    if arg.startswith("@"):
        with open(arg[1:], encoding="utf-8") as f:
            return json.load(f)
    return json.loads(arg)


def main(argv):
    if "--" not in argv or len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    workers, command = read_workers(argv[1]), argv[cut + 1:]
    host, port = option(command, "--host") or "127.0.0.1", option(command, "--port") or "30000"
    api = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    proc = subprocess.Popen(command)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))
    add_workers(api, workers, proc)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
