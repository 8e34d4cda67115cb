"""Ask replicas and the router what they are doing; prints one JSON line.

Runs INSIDE a container on the data plane (the replica's head, or the router's host), fed on stdin,
with nothing but the standard library.

  ready URL DEADLINE      /health, /v1/models, then a real one-token completion (the gate; through
                          a pool's router, one per model it lists)
  drain URL DEADLINE [QUIET]
                          wait until the replica has had no running or waiting request for
                          QUIET seconds on end (2)
  status ROUTER METRICS URL...
                          each replica's health and load, the router's list and its health view
                          (from METRICS, its Prometheus endpoint; "-": no router / no metrics)
  add ROUTER URL [METRICS [DEADLINE]]
                          put a replica in the router's rotation (checked in its list); with
                          METRICS, wait until the router would send it requests (healthy in its
                          own checks, circuit breaker closed)
  remove ROUTER URL       take it out (checked)
  adapters URL            the LoRA adapters a replica's vLLM serves (its /v1/models: id, parent, root)
  lora-load URL NAME SOURCE
  lora-unload URL NAME    load or unload an adapter on a replica at runtime (vLLM's API, allowed by
                          VLLM_ALLOW_RUNTIME_LORA_UPDATING in its container)
  route ROUTER URL POLICY NAME...
                          a pool's router (vllm-router's multi-model mode): URL routed under exactly
                          NAMEs (removed, then added under each)
  repolicy ROUTER NAME POLICY URL...
                          a pool model's policy changed in place: its URLs out, then in under NAME
"""
import http.client as http_client
import io
import json
import os
import socket
import sys
import time
import urllib.parse
import urllib.request


def model_keys(model):
    """The API keys to try for a pool's model: its own (a router's BOOTSTRAP_MODEL_KEYS, from
    models[].api_key), else the container's VLLM_API_KEY (cluster.router.api_key; a serve container's
    own model's), then, for a name the map does not hold (an adapter loaded at runtime), every key the
    container holds."""
    try:
        keys = json.loads(os.environ.get("BOOTSTRAP_MODEL_KEYS") or "{}")
    except ValueError:
        keys = {}
    keys = keys if isinstance(keys, dict) else {}
    if keys.get(model):
        return [keys[model]]
    out = [os.environ.get("VLLM_API_KEY")]
    return out + [k for k in dict.fromkeys(keys.values()) if k not in out]


def keyed(method, url, body=None, timeout=5.0, model=None):
    """http() with the first of the keys (model_keys) vLLM does not refuse (401)."""
    for key in model_keys(model):
        code, answer = http(method, url, body, timeout=timeout, key=key)
        if code != 401:
            break
    return code, answer


def complete(url, model):
    """A one-token completion of `model`: (status, body)."""
    return keyed("POST", url + "/v1/completions",
                 {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}, timeout=120, model=model)


def answers(url, model):
    """None once `model` answers a real request, else why not: a one-token completion, or, where vLLM
    refuses completions for it (a pooling model: `--runner pooling`), an embedding of one word."""
    code, body = complete(url, model)
    if code == 200 and json.loads(body).get("choices"):
        return None
    why = f"completion of {model} answered {code}: {body[:200].decode(errors='replace')}"
    if code not in (400, 404, 405):
        return why
    code, body = keyed("POST", url + "/v1/embeddings", {"model": model, "input": "Hello"}, timeout=120, model=model)
    if code == 200 and json.loads(body).get("data"):
        return None
    return f"{why}; embedding of it answered {code}: {body[:200].decode(errors='replace')}"


def http(method, url, body=None, timeout=5.0, key=None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    key = key or os.environ.get("VLLM_API_KEY")  # the container's secrets (cluster.router.api_key)
    if key:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def samples(text, name):
    """A Prometheus metric's samples: (the name and labels, value) per line that parses."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            head, _, value = line.rpartition(" ")
            try:
                yield head, float(value)
            except ValueError:
                pass


def metric(text, name):
    """The sum of a Prometheus metric's samples (None: not exported)."""
    got = [v for _, v in samples(text, name)]
    return sum(got) if got else None


def top(text, name):
    """The largest of a Prometheus gauge's samples (None: not exported)."""
    got = [v for _, v in samples(text, name)]
    return max(got) if got else None


def per_label(text, name, label):
    """A Prometheus metric's samples summed per value of one label ({} : none carries it; None: not
    exported). vLLM's data parallel API server labels each engine's counters engine="<index>"."""
    out, found, key = {}, False, f'{label}="'
    for head, value in samples(text, name):
        found = True
        if key in head:
            which = head.split(key, 1)[1].split('"', 1)[0]
            out[which] = out.get(which, 0.0) + value
    return out if found else None


def load(url):
    code, body = http("GET", url + "/metrics")
    if code != 200:
        return None
    text = body.decode(errors="replace")
    return {"running": metric(text, "vllm:num_requests_running"),
            "waiting": metric(text, "vllm:num_requests_waiting"),
            "succeeded": metric(text, "vllm:request_success_total"),
            # per data parallel engine (a DP replica's API server reports each engine's own)
            "engines": per_label(text, "vllm:request_success_total", "engine"),
            # a disaggregated decode replica's pulls of the KV cache (vLLM's NixlConnector; absent elsewhere)
            "kv_transfers": metric(text, "vllm:nixl_xfer_time_seconds_count"),
            "kv_failed": metric(text, "vllm:nixl_num_failed_transfers_total"),
            # the engine's own latencies (histogram sums and counts): a role's share of a request
            "ttft_sum": metric(text, "vllm:time_to_first_token_seconds_sum"),
            "ttft_count": metric(text, "vllm:time_to_first_token_seconds_count"),
            "itl_sum": metric(text, "vllm:inter_token_latency_seconds_sum"),
            "itl_count": metric(text, "vllm:inter_token_latency_seconds_count"),
            # the wait in the engine's queue, and the prefix cache's token queries and hits
            "queue_sum": metric(text, "vllm:request_queue_time_seconds_sum"),
            "queue_count": metric(text, "vllm:request_queue_time_seconds_count"),
            "prefix_queries": metric(text, "vllm:prefix_cache_queries_total"),
            "prefix_hits": metric(text, "vllm:prefix_cache_hits_total"),
            # the KV cache's fullest engine (0..1; a DP replica reports each of its engines)
            "kv_usage": top(text, "vllm:kv_cache_usage_perc")}


def exited_since(path, since):
    """The member supervisor's line on a vLLM that exited by itself (checks/member.py's EXITED) when
    it was written after SINCE (time.time()), else None."""
    try:
        with open(path, encoding="utf-8") as fh:
            stamp, _, why = fh.read().strip().partition(" ")
        return why if float(stamp) >= since else None
    except (OSError, ValueError):
        return None


def served(doc):
    """(the models /v1/models lists, the ones to complete): OpenAI's `data`, where an adapter names its
    `parent` (vLLM's answer: the served name, then its adapters; a pool router's front: every model
    and adapter): each name without a parent is completed. A pool router made before the front
    answers vllm-router's own {"models": [names]}: each is completed."""
    if isinstance(doc.get("models"), list):
        names = [m for m in doc["models"] if isinstance(m, str)]
        return names, names
    data = [m for m in doc.get("data", []) if isinstance(m, dict)]
    return [m.get("id") for m in data], [m.get("id") for m in data if not m.get("parent")]


def listed(url):
    """GET /v1/models with each key the container holds, the lists merged: a pool router's front
    lists a model with a key of its own only to that key (checks/router_entry.py)."""
    merged, last = None, None
    for key in dict.fromkeys(model_keys(None)):
        code, body = http("GET", url + "/v1/models", key=key)
        if code != 200:
            last = f"/v1/models answered {code}: {body[:200].decode(errors='replace')}"
            continue
        doc = json.loads(body)
        if merged is None or not isinstance(doc.get("data"), list):
            merged = doc
        else:
            ids = {m.get("id") for m in merged.get("data", [])}
            merged.setdefault("data", []).extend(m for m in doc["data"] if m.get("id") not in ids)
    if merged is None:
        raise RuntimeError(last)
    return merged


def ready(url, deadline, exited=None):
    """Until the API server answers a real request of each model it lists (answers), or DEADLINE s;
    with EXITED (the member supervisor's file), a vLLM that exits meanwhile ends the wait at once: the
    supervisor starts it again, and a spec vLLM refuses would be waited for until the deadline."""
    start, err = time.monotonic(), None
    since = time.time()
    while time.monotonic() - start < deadline:
        why = exited_since(exited, since) if exited else None
        if why:
            return {"ready": False, "error": why, "t": round(time.monotonic() - start, 2)}
        try:
            code, _ = http("GET", url + "/health", timeout=3)
            if code == 200:
                models, each = served(listed(url))
                for model in each:
                    err = answers(url, model)
                    if err:
                        break
                else:
                    return {"ready": True, "models": models, "t": round(time.monotonic() - start, 2)}
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


def _per_worker(text, name):
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and 'worker="' in line:
            url = line.split('worker="', 1)[1].split('"', 1)[0]
            try:
                out[url.rstrip("/")] = float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def router_health(text):
    """The router's own health view from its /metrics: worker URL -> healthy (its last checks)."""
    return {url: v >= 1.0 for url, v in _per_worker(text, "vllm_router_worker_health").items()}


def router_circuits(text):
    """Worker URL -> whether the router's circuit breaker for it is closed (vllm_router_cb_state 0).
    Open or half-open, the router sends it no request, or only a trial one, whatever its health
    checks say: a worker that failed requests stays out until the breaker's timeout has passed."""
    return {url: v == 0 for url, v in _per_worker(text, "vllm_router_cb_state").items()}


def router_kv_lookups(text):
    """kv_aware's lookups in its KV index by result (hit, miss, ...: vllm_router_kv_placement_lookups_total):
    how often the router found a replica holding a prefix of the prompt. Empty: no kv_aware decisions."""
    out = {}
    for line in text.splitlines():
        if line.startswith("vllm_router_kv_placement_lookups_total{") and 'result="' in line:
            result = line.split('result="', 1)[1].split('"', 1)[0]
            try:
                out[result] = out.get(result, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return out


def router_available(text):
    """Worker URL -> whether the router would send it a request now: healthy and circuit closed.
    Absent from the health view: unknown (not in the answer)."""
    circuits = router_circuits(text)
    return {url: ok and circuits.get(url, True) for url, ok in router_health(text).items()}


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
                    text = body.decode(errors="replace")
                    out["router"]["healthy"] = router_health(text)
                    out["router"]["circuit_closed"] = router_circuits(text)
                    out["router"]["kv_lookups"] = router_kv_lookups(text)
            except Exception:  # an older router without the metric: the view is simply absent
                pass
    for url in urls:
        row = {}
        try:
            code, _ = http("GET", url + "/health", timeout=3)
            row["health"] = code
            row.update(load(url) or {})
            if code == 200:  # the LoRA adapters it serves now (vLLM lists each with its parent)
                got = adapters(url)
                if got.get("ok"):
                    row["adapters"] = [a["name"] for a in got["adapters"]]
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        out["replicas"][url] = row
    return out


def change(router, url, add, metrics="-", deadline=30.0):
    path = "/add_worker" if add else "/remove_worker"
    code, body = http("POST", f"{router}{path}?url={urllib.parse.quote(url, safe='')}", timeout=30)
    listed = workers(router)
    ok = (url in listed) == add
    out = {"ok": ok, "code": code, "answer": body[:200].decode(errors="replace"), "workers": listed}
    if add and ok and metrics != "-":
        start, seen, view = time.monotonic(), None, None
        while time.monotonic() - start < deadline:
            try:
                mcode, mbody = http("GET", metrics, timeout=3)
                view = router_available(mbody.decode(errors="replace")) if mcode == 200 else None
            except Exception:
                view = None
            seen = (view or {}).get(url)
            if seen or view == {}:  # healthy, or a router that does not export its view: nothing to wait for
                break
            time.sleep(0.5)
        out["router_available"], out["waited"] = seen, round(time.monotonic() - start, 2)
        out["ok"] = bool(seen) or view == {}
    return out


def adapters(url):
    """The adapters a replica serves: vLLM lists its model, then each adapter with its parent."""
    code, body = keyed("GET", url + "/v1/models", timeout=10)  # a pool's router: the replica's model's key
    if code != 200:
        return {"ok": False, "error": f"/v1/models answered {code}: {body[:200].decode(errors='replace')}"}
    data = json.loads(body).get("data", [])
    return {"ok": True, "adapters": [{"name": m.get("id"), "source": m.get("root")} for m in data
                                     if m.get("parent")]}


def lora(url, load, name, source=None):
    body = {"lora_name": name, **({"lora_path": source} if load else {})}
    code, answer = http("POST", url + ("/v1/load_lora_adapter" if load else "/v1/unload_lora_adapter"), body,
                        timeout=120)
    return {"ok": code == 200, "code": code, "answer": answer[:300].decode(errors="replace")}


def route(router, url, policy, names, deadline=45.0):
    """URL in a pool's router under exactly NAMES: vllm-router keeps one worker per URL, indexed under
    every name it was added with, and removes a URL whole (DELETE /workers/URL).

    Each step counts once the router's own list (GET /workers) shows it, the URL gone, then listed
    again: a replica taken out is drained only once the router says it no longer sends it requests.
    vllm-router 0.1.17 makes the change before it answers (200, listed at the next GET, measured); a
    router that answers 202 (a queued change) makes it later, and the step waits for it."""
    code, answer = http("DELETE", f"{router}/workers/{urllib.parse.quote(url, safe='')}", timeout=30)
    if code not in (200, 202, 204, 400, 404):
        return {"ok": False, "error": f"DELETE answered {code}: {answer[:200].decode(errors='replace')}"}
    gone = _listed(router, url, False, deadline)
    if gone is not None:
        return {"ok": False, "error": gone}
    for name in names:
        code, answer = http("POST", router + "/workers", {"url": url, "model_id": name, "labels": {"policy": policy}},
                            timeout=30)
        if code >= 300:
            return {"ok": False, "error": f"adding {url} for {name} answered {code}: "
                                          f"{answer[:200].decode(errors='replace')}"}
    back = _listed(router, url, True, deadline) if names else None
    return {"ok": True} if back is None else {"ok": False, "error": back}


def _listed(router, url, want, deadline):
    """Wait until the router lists URL (want) or no longer does; None when it does, else why not."""
    end, seen = time.monotonic() + deadline, None
    while True:
        try:
            seen = pool_workers(router)
        except Exception as exc:  # a router busy restarting: asked again until the deadline
            seen = {"error": f"{type(exc).__name__}: {exc}"}
        if "workers" in seen and (url.rstrip("/") in seen["workers"]) == want:
            return None
        if time.monotonic() >= end:
            return (f"the router still {'does not list' if want else 'lists'} {url} after {deadline:g}s "
                    f"({seen.get('error') or 'GET /workers'})")
        time.sleep(0.2)


def pool_workers(router):
    """A pool router's workers as {url: model} (GET /workers: vllm-router shows one name per URL)."""
    code, body = http("GET", router + "/workers")
    if code != 200:
        return {"error": f"GET /workers answered {code}"}
    doc = json.loads(body)
    items = [w for w in (doc.get("workers", []) if isinstance(doc, dict) else doc) if isinstance(w, dict)]
    return {"workers": {w.get("url", "").rstrip("/"): w.get("model_id") for w in items},
            # the policy each URL was last added with (its labels): what a model's routing was told
            "policies": {w.get("url", "").rstrip("/"): (w.get("metadata") or {}).get("policy") for w in items}}


def repolicy(router, name, policy, urls):
    """A pool model's policy changed in place: every URL of it out, then in again under NAME with POLICY.
    vllm-router 0.1.17 keeps a model's policy from its first worker until its last leaves
    (policies/registry.rs), and routes a request for a model with no worker to any worker, another model's
    replica included, whose vLLM refuses it with 404 (reproduced against stub workers). So the last URL's
    DELETE and its POST go in one write on one connection (`swap`): the router answers them in turn and
    the window without a worker of NAME is the router's own time between the two, not a round trip of
    ours. `gap_ms`: how long that exchange took, the window's upper bound."""
    if not urls:
        return {"ok": False, "error": f"no URL of {name} given"}
    start = time.monotonic()
    for url in urls[:-1]:
        code, answer = http("DELETE", f"{router}/workers/{urllib.parse.quote(url, safe='')}", timeout=30)
        if code not in (200, 202, 204, 404):
            return {"ok": False, "error": f"DELETE {url} answered {code}: {answer[:200].decode(errors='replace')}"}
    t = time.monotonic()
    try:
        (dcode, danswer), (pcode, panswer) = swap(router, urls[-1], name, policy)
    except (OSError, http_client.HTTPException) as e:
        return {"ok": False, "error": f"DELETE and POST of {urls[-1]} on one connection: {e}"}
    gap = round(1000 * (time.monotonic() - t), 1)
    if dcode not in (200, 202, 204, 404):
        return {"ok": False, "error": f"DELETE {urls[-1]} answered {dcode}: {danswer[:200].decode(errors='replace')}"}
    if pcode >= 300:
        why = panswer[:200].decode(errors="replace")
        return {"ok": False, "error": f"POST /workers {urls[-1]} answered {pcode}: {why}"}
    for url in urls[:-1]:
        code, answer = http("POST", router + "/workers", {"url": url, "model_id": name, "labels": {"policy": policy}},
                            timeout=30)
        if code >= 300:
            why = answer[:200].decode(errors="replace")
            return {"ok": False, "error": f"POST /workers {url} answered {code}: {why}"}
    seen = pool_workers(router)
    missing = [u for u in urls if (seen.get("workers") or {}).get(u) != name]
    return {"ok": not missing, "gap_ms": gap, "took_ms": round(1000 * (time.monotonic() - start), 1),
            **({"error": f"not listed under {name}: {missing}"} if missing else {})}


class _Kept(io.BufferedReader):
    """A buffered reader that the first answer cannot close (http.client closes its file once read)."""

    def close(self):
        pass


def swap(router, url, name, policy, timeout=30.0):
    """DELETE /workers/URL and POST /workers (URL under NAME with POLICY) pipelined: both requests in one
    write on one HTTP/1.1 connection, then both answers read in turn. [(status, body), (status, body)]."""
    parts = urllib.parse.urlsplit(router)
    body = json.dumps({"url": url, "model_id": name, "labels": {"policy": policy}}).encode()
    key = os.environ.get("VLLM_API_KEY")
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    host = parts.netloc
    wire = (f"DELETE /workers/{urllib.parse.quote(url, safe='')} HTTP/1.1\r\nHost: {host}\r\n{auth}"
            "Content-Length: 0\r\n\r\n"
            f"POST /workers HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(wire)
        reader = _Kept(socket.SocketIO(sock, "rb"))

        class _Shared:  # both answers read from one buffered file: the second's bytes are not lost
            def makefile(self, *args, **kwargs):
                return reader
        answers = []
        for method in ("DELETE", "POST"):
            resp = http_client.HTTPResponse(_Shared(), method=method)
            resp.begin()
            answers.append((resp.status, resp.read()))
        return answers


def holds(address):
    """Whether this host (the probe runs in its network) holds ADDRESS: only a local address binds."""
    fam = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(fam, socket.SOCK_DGRAM) as sk:
        try:
            sk.bind((address, 0))
        except OSError:
            return {"holds": False}
    return {"holds": True}


def main(argv):
    cmd = argv[0]
    if cmd == "ready":
        doc = ready(argv[1].rstrip("/"), float(argv[2]), *argv[3:4])
    elif cmd == "drain":
        doc = drain(argv[1].rstrip("/"), float(argv[2]), *(float(x) for x in argv[3:4]))
    elif cmd == "status":
        doc = status(argv[1].rstrip("/"), argv[2], [u.rstrip("/") for u in argv[3:]])
    elif cmd == "holds":
        doc = holds(argv[1])
    elif cmd in ("add", "remove"):
        doc = change(argv[1].rstrip("/"), argv[2].rstrip("/"), cmd == "add", *argv[3:4],
                     *(float(x) for x in argv[4:5]))
    elif cmd == "adapters":
        doc = adapters(argv[1].rstrip("/"))
    elif cmd in ("lora-load", "lora-unload"):
        doc = lora(argv[1].rstrip("/"), cmd == "lora-load", *argv[2:4])
    elif cmd == "pool-workers":
        doc = pool_workers(argv[1].rstrip("/"))
    elif cmd == "repolicy":
        doc = repolicy(argv[1].rstrip("/"), argv[2], argv[3], [u.rstrip("/") for u in argv[4:]])
    elif cmd == "route":
        doc = route(argv[1].rstrip("/"), argv[2].rstrip("/"), argv[3], argv[4:])
    else:
        doc = {"error": f"unknown command {cmd}"}
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
