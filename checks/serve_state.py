"""What `bootstrap serve` left running on the head; print one JSON line.

Runs INSIDE the head container (fed on stdin). Reads the state file serve wrote at launch, says
whether the server process is alive, asks its /health and /v1/models (from inside the container,
where the data-plane address is reachable), and returns the KV cache lines of its log (parsed on
the controller). Uptime is measured on the head's clock (the state file's age).

Args: STATE_FILE PIDFILE LOG
Output: {"serving": bool, "state": {...}|null, "uptime_s": float|null, "process": bool,
         "health": "ok"|"<error>"|null, "models": [...], "kv_lines": [...],
         "engines": {engine index: requests finished}|null}  (from /metrics, by its `engine` label:
         with data parallel, one per DP engine)
"""
import json
import os
import re
import sys
import time
import urllib.request

KV = re.compile(r"KV cache size|# [A-Za-z]+ blocks:|Maximum concurrency for")


def alive(pidfile):
    try:
        pid = int(open(pidfile).read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def get(url, timeout=3.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


ENGINE = re.compile(r'^vllm:request_success_total\{[^}]*engine="([^"]+)"[^}]*\}\s+([0-9.eE+-]+)')


def engines(text):
    """Requests finished per engine (vLLM labels its metrics with the engine's index)."""
    out = {}
    for line in text.splitlines():
        m = ENGINE.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out or None


def main(argv):
    state_file, pidfile, log = argv[1:4]
    out = {"serving": False, "state": None, "uptime_s": None, "process": False, "health": None,
           "models": [], "kv_lines": [], "engines": None}
    try:
        with open(state_file, encoding="utf-8") as fh:
            out["state"] = json.load(fh)
        out["uptime_s"] = round(time.time() - os.stat(state_file).st_mtime, 1)
    except (OSError, ValueError):
        print(json.dumps(out))
        return 0
    out["serving"] = True
    out["process"] = alive(pidfile)
    url = out["state"].get("url_in", "")
    try:
        status, _ = get(url + "/health")
        out["health"] = "ok" if status == 200 else f"HTTP {status}"
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        out["health"] = f"{type(exc).__name__}: {exc}"[:200]
    if out["health"] == "ok":
        try:
            _, body = get(url + "/v1/models")
            out["models"] = [m.get("id") for m in json.loads(body).get("data", [])]
        except Exception:  # noqa: BLE001
            pass
        try:
            # with data parallel vLLM runs an API server per engine and gathers their metrics on each
            # scrape: slower than the other answers under load
            _, body = get(url + "/metrics", timeout=15.0)
            out["engines"] = engines(body.decode(errors="replace"))
        except Exception:  # noqa: BLE001
            pass
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            out["kv_lines"] = [ln.rstrip() for ln in fh if KV.search(ln)][-4:]
    except OSError:
        pass
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
