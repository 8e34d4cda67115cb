"""Restart this host's serving containers when they were stopped by something other than bootstrap.

Runs in the keeper container (Docker socket mounted). Docker's restart policy restarts a container
whose process died, but not one that `docker kill`/`docker stop` stopped: an operator's slip or a
stray script would then take a replica out for good. Every INTERVAL seconds this lists the
containers labelled bootstrap.keep=CLUSTER and starts those among NAMES that have stayed exited
for two checks in a row. bootstrap itself removes or renames a container it stops on purpose, so
a container under one of NAMES that is exited was not meant to be.

Args: CLUSTER INTERVAL NAME...   Prints one line per restart.
"""
import http.client
import json
import socket
import sys
import time
import urllib.parse

SOCKET = "/var/run/docker.sock"


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self):
        super().__init__("localhost", timeout=10)

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(SOCKET)


def call(method, path):
    conn = UnixHTTP()
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def main(argv):
    cluster, interval, names = argv[0], float(argv[1]), set(argv[2:])
    query = urllib.parse.quote(json.dumps({"label": [f"bootstrap.keep={cluster}"]}))
    seen_exited = set()
    print(f"keeper: watching {', '.join(sorted(names))} every {interval:g}s", flush=True)
    while True:
        try:
            status, body = call("GET", f"/containers/json?all=1&filters={query}")
            exited = set()
            for c in json.loads(body) if status == 200 else []:
                name = (c.get("Names") or ["?"])[0].lstrip("/")
                if name in names and c.get("State") in ("exited", "dead"):
                    exited.add(c["Id"])
                    if c["Id"] in seen_exited:
                        code, _ = call("POST", f"/containers/{c['Id']}/start")
                        print(f"keeper: {name} was {c.get('Status')}: started ({code})", flush=True)
            seen_exited = exited
        except (OSError, ValueError, http.client.HTTPException) as exc:
            print(f"keeper: {type(exc).__name__}: {exc}", flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
