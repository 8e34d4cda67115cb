"""Restart this host's serving containers when they were stopped by something other than bootstrap.

Runs in the keeper container (Docker socket mounted). Docker's restart policy restarts a container
whose process died, but not one that `docker kill`/`docker stop` stopped: an operator's slip or a
stray script would then take a replica out for good. The keeper follows Docker's events: when a
container labelled bootstrap.keep=CLUSTER dies, it looks again SETTLE seconds later and starts it
if it is still exited under one of NAMES. bootstrap itself removes (Docker then says "removing") or
renames a container it stops on purpose, so a container under one of NAMES that is exited was not
meant to be. Every INTERVAL seconds it also lists them and starts those exited for two looks in a
row: a die it did not hear (the event stream broke) is caught that way.

Args: CLUSTER INTERVAL NAME...   Prints one line per restart.
"""
import http.client
import json
import os
import queue
import socket
import sys
import threading
import time
import urllib.parse

SOCKET = os.environ.get("BOOTSTRAP_DOCKER_SOCKET", "/var/run/docker.sock")
#: Seconds between a die and the look that decides (a `docker rm -f` is "removing" by then).
SETTLE = float(os.environ.get("BOOTSTRAP_KEEPER_SETTLE", "1"))


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, timeout=10):
        super().__init__("localhost", timeout=timeout)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(SOCKET)


def call(method, path):
    conn = UnixHTTP()
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def follow_events(cluster, out):
    """Put the ID of every container of ours that dies on `out`, for as long as the process runs;
    the stream is opened again after any failure."""
    filters = urllib.parse.quote(json.dumps({"type": ["container"], "event": ["die"],
                                             "label": [f"bootstrap.keep={cluster}"]}))
    while True:
        conn = UnixHTTP(timeout=None)
        try:
            conn.request("GET", f"/events?filters={filters}")
            r = conn.getresponse()
            while True:
                line = r.readline()
                if not line:
                    break
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("id"):
                    out.put(ev["id"])
        except (OSError, http.client.HTTPException) as exc:
            print(f"keeper: events: {type(exc).__name__}: {exc}", flush=True)
        finally:
            conn.close()
        time.sleep(1)


def start_if_exited(cid, names, why):
    """Start the container when it is exited (or dead) under one of NAMES; True when started."""
    status, body = call("GET", f"/containers/{cid}/json")
    if status != 200:
        return False  # removed
    c = json.loads(body)
    name = (c.get("Name") or "?").lstrip("/")
    state = c.get("State") or {}
    if name not in names or state.get("Status") not in ("exited", "dead"):
        return False
    code, _ = call("POST", f"/containers/{cid}/start")
    print(f"keeper: {name} was Exited ({state.get('ExitCode')}) {why}: started ({code})", flush=True)
    return True


def main(argv):
    cluster, interval, names = argv[0], float(argv[1]), set(argv[2:])
    query = urllib.parse.quote(json.dumps({"label": [f"bootstrap.keep={cluster}"]}))
    died = queue.Queue()
    threading.Thread(target=follow_events, args=(cluster, died), daemon=True).start()
    seen_exited = set()
    print(f"keeper: watching {', '.join(sorted(names))} (on Docker's events, and every {interval:g}s)",
          flush=True)
    next_scan = time.monotonic() + interval
    while True:
        try:
            cid = died.get(timeout=max(0.0, next_scan - time.monotonic()))
        except queue.Empty:
            cid = None
        try:
            if cid is not None:
                time.sleep(SETTLE)
                start_if_exited(cid, names, "when it died")
                continue
            next_scan = time.monotonic() + interval
            status, body = call("GET", f"/containers/json?all=1&filters={query}")
            exited = set()
            for c in json.loads(body) if status == 200 else []:
                name = (c.get("Names") or ["?"])[0].lstrip("/")
                if name in names and c.get("State") in ("exited", "dead"):
                    exited.add(c["Id"])
                    if c["Id"] in seen_exited:
                        start_if_exited(c["Id"], names, "for two looks")
            seen_exited = exited
        except (OSError, ValueError, http.client.HTTPException) as exc:
            print(f"keeper: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
