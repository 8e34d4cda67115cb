"""Ask replicas and the router what they are doing; prints one JSON line.

Runs INSIDE a container on the data plane (the replica's head, or the router's host), fed on stdin,
with nothing but the standard library.

  ready URL DEADLINE      /health, /v1/models, then a real one-token completion (the gate)
  drain URL DEADLINE [QUIET]
                          wait until the replica has had no running or waiting request for
                          QUIET seconds on end (2)
  status ROUTER METRICS URL...
                          each replica's health and load, the router's list and its health view
                          (from METRICS, its Prometheus endpoint; "-": no router / no metrics)
  add ROUTER URL          put a replica in the router's rotation (checked in its list)
  remove ROUTER URL       take it out (checked)
"""
import json
import os
import sys
import time
import urllib.parse
import urllib.request


def http(method, url, body=None, timeout=5.0):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if os.environ.get("VLLM_API_KEY"):  # the container's env file (cluster.router.api_key)
        headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def metric(text, name):
    """The sum of a Prometheus metric's samples (None: not exported)."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
                found = True
            except ValueError:
                pass
    return total if found else None


def load(url):
    code, body = http("GET", url + "/metrics")
    if code != 200:
        return None
    text = body.decode(errors="replace")
    return {"running": metric(text, "vllm:num_requests_running"),
            "waiting": metric(text, "vllm:num_requests_waiting"),
            "succeeded": metric(text, "vllm:request_success_total")}


def ready(url, deadline):
    start, err = time.monotonic(), None
    while time.monotonic() - start < deadline:
        try:
            code, _ = http("GET", url + "/health", timeout=3)
            if code == 200:
                _, body = http("GET", url + "/v1/models")
                models = [m.get("id") for m in json.loads(body).get("data", [])]
                code, body = http("POST", url + "/v1/completions",
                                  {"model": models[0], "prompt": "Hello", "max_tokens": 1, "temperature": 0},
                                  timeout=120)
                if code == 200 and json.loads(body).get("choices"):
                    return {"ready": True, "models": models, "t": round(time.monotonic() - start, 2)}
                err = f"completion answered {code}: {body[:200].decode(errors='replace')}"
            else:
                err = f"/health answered {code}"
        except Exception as exc:  # not up yet
            err = f"{type(exc).__name__}: {exc}"
        time.sleep(1)
    return {"ready": False, "error": err, "t": round(time.monotonic() - start, 2)}


def drain(url, deadline, quiet=2.0):
    """Drained: no request running or waiting, and no request finishing, for QUIET seconds on end.

    One idle sample is not enough: vLLM counts a request as running only once the engine step that
    admits it has returned (its prefill), so a request the router sent just before it let go of the
    replica can be in flight while the gauges still read zero.
    """
    start, last, since, seen = time.monotonic(), None, None, None
    while time.monotonic() - start < deadline:
        try:
            last = load(url)
        except Exception as exc:
            return {"drained": True, "why": f"not answering ({type(exc).__name__})",
                    "t": round(time.monotonic() - start, 2)}
        now = time.monotonic()
        idle = bool(last) and not (last["running"] or 0) and not (last["waiting"] or 0)
        if not idle or since is None or last["succeeded"] != seen:
            since, seen = (now if idle else None), (last or {}).get("succeeded")
        elif now - since >= quiet:
            return {"drained": True, "why": f"no request running or waiting for {quiet:g}s",
                    "t": round(now - start, 2)}
        time.sleep(0.25)
    return {"drained": False, "why": f"still busy at the deadline: {last}", "t": round(time.monotonic() - start, 2)}


def workers(router):
    code, body = http("GET", router + "/list_workers")
    if code != 200:
        raise RuntimeError(f"/list_workers answered {code}")
    doc = json.loads(body)
    urls = doc.get("urls") if isinstance(doc, dict) else doc
    return [u if isinstance(u, str) else u.get("url") for u in urls or []]


def router_health(text):
    """The router's own health view from its /metrics: worker URL -> healthy (its last checks)."""
    out = {}
    for line in text.splitlines():
        if line.startswith('vllm_router_worker_health{') and 'worker="' in line:
            url = line.split('worker="', 1)[1].split('"', 1)[0]
            try:
                out[url.rstrip("/")] = float(line.rsplit(" ", 1)[1]) >= 1.0
            except ValueError:
                pass
    return out


def status(router, metrics, urls):
    out = {"router": None, "replicas": {}}
    if router != "-":
        try:
            code, _ = http("GET", router + "/health", timeout=3)
            out["router"] = {"health": code, "workers": workers(router)}
        except Exception as exc:
            out["router"] = {"error": f"{type(exc).__name__}: {exc}"}
        if metrics != "-" and isinstance(out["router"], dict) and "workers" in out["router"]:
            try:
                code, body = http("GET", metrics, timeout=3)
                if code == 200:
                    out["router"]["healthy"] = router_health(body.decode(errors="replace"))
            except Exception:  # an older router without the metric: the view is simply absent
                pass
    for url in urls:
        row = {}
        try:
            code, _ = http("GET", url + "/health", timeout=3)
            row["health"] = code
            row.update(load(url) or {})
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        out["replicas"][url] = row
    return out


def change(router, url, add):
    path = "/add_worker" if add else "/remove_worker"
    code, body = http("POST", f"{router}{path}?url={urllib.parse.quote(url, safe='')}", timeout=30)
    listed = workers(router)
    ok = (url in listed) == add
    return {"ok": ok, "code": code, "answer": body[:200].decode(errors="replace"), "workers": listed}


def main(argv):
    cmd = argv[0]
    if cmd == "ready":
        doc = ready(argv[1].rstrip("/"), float(argv[2]))
    elif cmd == "drain":
        doc = drain(argv[1].rstrip("/"), float(argv[2]), *(float(x) for x in argv[3:4]))
    elif cmd == "status":
        doc = status(argv[1].rstrip("/"), argv[2], [u.rstrip("/") for u in argv[3:]])
    elif cmd in ("add", "remove"):
        doc = change(argv[1].rstrip("/"), argv[2].rstrip("/"), cmd == "add")
    else:
        doc = {"error": f"unknown command {cmd}"}
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
