"""Wait until a vLLM server answers /health and lists its model on /v1/models; print JSON lines.

Runs INSIDE the head container (fed on stdin). Stops early when the server process is gone
(its log then says why), so a crash is reported at once instead of at the deadline.

Args: URL DEADLINE_SECONDS PIDFILE
Output: {"event": "done", "ready": bool, "models": [...], "error": str|null, "t": seconds}
Exit: 0 ready, 3 deadline, 4 the server process exited.
"""
import json
import os
import sys
import time
import urllib.request


def alive(pidfile):
    try:
        pid = int(open(pidfile).read().strip())
    except (OSError, ValueError):
        return True  # not written yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def main(argv):
    url, deadline, pidfile = argv[0].rstrip("/"), float(argv[1]), argv[2]
    start = time.monotonic()
    err = None
    while True:
        t = round(time.monotonic() - start, 2)
        if not alive(pidfile):
            print(json.dumps({"event": "done", "ready": False, "exited": True, "t": t,
                              "error": "the vLLM server process exited"}), flush=True)
            return 4
        try:
            code, _ = get(url + "/health")
            if code == 200:
                _, body = get(url + "/v1/models")
                models = [m.get("id") for m in json.loads(body).get("data", [])]
                if models:
                    print(json.dumps({"event": "done", "ready": True, "models": models, "t": t, "error": None}),
                          flush=True)
                    return 0
        except Exception as exc:  # not up yet
            err = f"{type(exc).__name__}: {exc}"
        if time.monotonic() - start > deadline:
            print(json.dumps({"event": "done", "ready": False, "t": t, "error": f"not ready: {err}"}), flush=True)
            return 3
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
