"""Restart this host's serving containers when they were stopped by something other than bootstrap.

Runs in the keeper container (Docker socket mounted). Docker's restart policy restarts a container
whose process died, but not one that `docker kill`/`docker stop` stopped: an operator's slip or a
stray script would then take a replica out for good. The keeper follows Docker's events: when a
container labelled bootstrap.keep=CLUSTER dies, it looks again SETTLE seconds later and starts it
if it is still exited under one of NAMES. bootstrap itself removes (Docker then says "removing") or
renames a container it stops on purpose, so a container under one of NAMES that is exited was not
meant to be. Every INTERVAL seconds it also lists them and starts those exited for two looks in a
row: a die it did not hear (the event stream broke) is caught that way.

A NAME given as SERVING=STANDBY has a standby: a container like it, vLLM imported, waiting
(checks/member.py). When the serving container died and its standby runs with the same labels (the
same spec), the standby takes its place instead of a fresh start: the dead container is renamed
SERVING-spent, the standby SERVING, and told to serve (SIGUSR1); the dead one then gets the standby
role (its role file, with a delay before its imports) and starts again as the next standby. Any
step that fails falls back to starting the dead container, as without a standby.

Args: CLUSTER INTERVAL NAME[=STANDBY]...   Prints one line per restart or take-over.
"""
import http.client
import io
import json
import os
import queue
import socket
import sys
import tarfile
import threading
import time
import urllib.parse

SOCKET = os.environ.get("BOOTSTRAP_DOCKER_SOCKET", "/var/run/docker.sock")
#: Seconds between a die and the look that decides (a `docker rm -f` is "removing" by then).
SETTLE = float(os.environ.get("BOOTSTRAP_KEEPER_SETTLE", "1"))
#: Where a serve container's supervisor keeps its role (checks/member.py's ROLE), and the role the
#: dead container gets: a standby that waits this long before its imports, so that they do not take
#: the cores the take-over's vLLM start needs.
ROLE_DIR, ROLE_FILE = "/opt/bootstrap", "member.role"
NEXT_STANDBY = b"standby delay=60\n"
SPENT = "-spent"


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, timeout=10):
        super().__init__("localhost", timeout=timeout)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(SOCKET)


def call(method, path, body=None, headers=None):
    conn = UnixHTTP()
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def q(name):
    return urllib.parse.quote(name, safe="")


def role_tar(data):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(ROLE_FILE)
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def take_over(cid, c, standby):
    """The serving container CID (inspected: C) died: its standby serves in its place, and CID
    becomes the next standby. True when the standby took over."""
    name = (c.get("Name") or "").lstrip("/")
    status, body = call("GET", f"/containers/{q(standby)}/json")
    if status != 200:
        return False
    s = json.loads(body)
    if (s.get("State") or {}).get("Status") != "running" or s.get("Id") == cid:
        return False
    if ((s.get("Config") or {}).get("Labels") or {}) != ((c.get("Config") or {}).get("Labels") or {}):
        print(f"keeper: {standby} serves another spec than {name}: not taking over", flush=True)
        return False
    call("DELETE", f"/containers/{q(name + SPENT)}?force=1")  # left by a take-over that stopped half-way
    code, out = call("POST", f"/containers/{cid}/rename?name={q(name + SPENT)}")
    if code != 204:
        print(f"keeper: taking over {name}: renaming it answered {code} {out[:200]!r}", flush=True)
        return False
    code, out = call("POST", f"/containers/{s['Id']}/rename?name={q(name)}")
    if code != 204:
        print(f"keeper: taking over {name}: renaming {standby} answered {code} {out[:200]!r}", flush=True)
        call("POST", f"/containers/{cid}/rename?name={q(name)}")  # back under its name: started as before
        return False
    code, _ = call("POST", f"/containers/{s['Id']}/kill?signal=SIGUSR1")
    state = c.get("State") or {}
    print(f"keeper: {name} was Exited ({state.get('ExitCode')}) when it died: its standby took over "
          f"(signalled: {code})", flush=True)
    # the dead container: the standby role, its name, started
    code, out = call("PUT", f"/containers/{cid}/archive?path={q(ROLE_DIR)}", role_tar(NEXT_STANDBY),
                     {"Content-Type": "application/x-tar"})
    if code != 200:
        # its role file still says active: started, it would serve beside the new one
        call("DELETE", f"/containers/{cid}?force=1")
        print(f"keeper: the dead {name} could not be made the next standby ({code} {out[:200]!r}): removed", flush=True)
        return True
    code, _ = call("POST", f"/containers/{cid}/rename?name={q(standby)}")
    if code == 204:
        code, _ = call("POST", f"/containers/{cid}/start")
        print(f"keeper: the dead {name} is the next standby ({code})", flush=True)
    return True


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


def start_if_exited(cid, names, why, standbys=None):
    """Start the container when it is exited (or dead) under one of NAMES (or let its standby take
    over, STANDBYS: serving name -> standby's); True when started."""
    status, body = call("GET", f"/containers/{cid}/json")
    if status != 200:
        return False  # removed
    c = json.loads(body)
    name = (c.get("Name") or "?").lstrip("/")
    state = c.get("State") or {}
    if name not in names or state.get("Status") not in ("exited", "dead"):
        return False
    if name in (standbys or {}):
        try:
            if take_over(cid, c, standbys[name]):
                return True
        except (OSError, ValueError, http.client.HTTPException) as exc:
            print(f"keeper: taking over {name}: {type(exc).__name__}: {exc}", flush=True)
    code, _ = call("POST", f"/containers/{cid}/start")
    print(f"keeper: {name} was Exited ({state.get('ExitCode')}) {why}: started ({code})", flush=True)
    return True


def main(argv):
    cluster, interval = argv[0], float(argv[1])
    standbys = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
    names = {a.split("=", 1)[0] for a in argv[2:]} | set(standbys.values())
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
                start_if_exited(cid, names, "when it died", standbys)
                continue
            next_scan = time.monotonic() + interval
            status, body = call("GET", f"/containers/json?all=1&filters={query}")
            exited = set()
            for c in json.loads(body) if status == 200 else []:
                name = (c.get("Names") or ["?"])[0].lstrip("/")
                if name in names and c.get("State") in ("exited", "dead"):
                    exited.add(c["Id"])
                    if c["Id"] in seen_exited:
                        start_if_exited(c["Id"], names, "for two looks", standbys)
            seen_exited = exited
        except (OSError, ValueError, http.client.HTTPException) as exc:
            print(f"keeper: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
